package kvroute

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
)

// The policy's own memory of upstream failures (DESIGN.md "Health"). With Caddy's defaults (no
// retries, no health checks) an upstream that refuses connections stays Available(), and with
// prefix affinity it would swallow every prefix group and session it holds. Two sources feed
// one mechanism: request outcomes (an attempt that got no response headers) and telemetry (a
// metrics endpoint that refuses connections). downAfter failures in a row make the upstream
// down: not a candidate unless all are. The policy's own probe (a TCP connection to the
// upstream after each cool-down, or a telemetry reading) brings it back; a client's request
// never does.
const (
	downAfter = 3
	// coolDownBase is the first wait before probing a down upstream; each probe that fails
	// doubles it, up to coolDownMax. An upstream that goes down again within forgiveAfter of
	// coming back starts from a longer cool-down (it flaps).
	coolDownBase = 500 * time.Millisecond
	coolDownMax  = 30 * time.Second
	forgiveAfter = time.Minute
	probeTimeout = time.Second
)

// healthState is an upstream's health as this policy sees it.
type healthState struct {
	down atomic.Bool // read on every decision

	mu       sync.Mutex
	failures int       // in a row
	downs    int       // times down without staying up for forgiveAfter in between
	since    time.Time // when it went down, or came back
	reason   string    // the failure that made it down
	total    atomic.Uint64
}

// isDown reports whether the policy holds the upstream dialled at addr to be down.
func (s *state) isDown(addr string) bool {
	v, ok := s.upstreams.Load(addr)
	return ok && v.(*upstreamState).health.down.Load()
}

// fail counts one failure of u; the downAfter-th in a row makes it down and starts its probe.
func (s *state) fail(u *upstreamState, reason string) {
	h := &u.health
	h.mu.Lock()
	h.failures++
	if h.down.Load() || h.failures < downAfter {
		h.mu.Unlock()
		return
	}
	now := time.Now()
	if now.Sub(h.since) > forgiveAfter {
		h.downs = 0
	}
	h.downs++
	cool := coolDownBase << min(h.downs-1, 6)
	cool = min(cool, coolDownMax)
	h.down.Store(true)
	h.since, h.reason = now, reason
	failures := h.failures
	h.mu.Unlock()
	h.total.Add(1)
	s.log().Warn("upstream down: left out of kv_cache_aware's candidates until a probe reaches it",
		zap.String("upstream", u.addr), zap.Int("failures_in_a_row", failures),
		zap.String("last_failure", reason), zap.Duration("cool_down", cool))
	s.startProbe(u, cool)
}

// healthy counts a success of u. Only the policy's own probes (probe: a reading or a
// connection) bring a down upstream back; a client's successful request only resets the
// count of failures in a row.
func (s *state) healthy(u *upstreamState, probe bool, how string) {
	h := &u.health
	h.mu.Lock()
	h.failures = 0
	if !h.down.Load() || !probe {
		h.mu.Unlock()
		return
	}
	h.down.Store(false)
	downFor := time.Since(h.since)
	h.since = time.Now()
	h.mu.Unlock()
	s.log().Info("upstream back", zap.String("upstream", u.addr), zap.String("by", how), zap.Duration("down_for", downFor))
}

// startProbe probes u after each cool-down, doubling it, until u is back (a probe or a
// reading) or the state is destroyed.
func (s *state) startProbe(u *upstreamState, cool time.Duration) {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.bgClosed {
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		timer := time.NewTimer(cool)
		defer timer.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-timer.C:
			}
			if !u.health.down.Load() {
				return // a reading brought it back
			}
			if err := probeUpstream(s.stop, u.addr); err == nil {
				s.healthy(u, true, "probe")
				return
			}
			cool = min(2*cool, coolDownMax)
			timer.Reset(cool)
		}
	}()
}

// probeUpstream makes one connection to the upstream's dial address and closes it.
func probeUpstream(stop <-chan struct{}, addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	if path, ok := strings.CutPrefix(addr, "unix/"); ok {
		conn, err := (&net.Dialer{}).DialContext(ctx, "unix", path)
		if err != nil {
			return err
		}
		return conn.Close()
	}
	return telemetry.Probe(ctx, addr, probeTimeout)
}

// stopHealth stops the probes and waits for them (Destruct, after s.stop is closed).
func (s *state) stopHealth() {
	s.bgMu.Lock()
	s.bgClosed = true
	s.bgMu.Unlock()
	s.bg.Wait()
}

// Request outcomes. Caddy sets http.reverse_proxy.status_code when an attempt gets response
// headers and never clears it, and records a handler's error (http.error) once the handler
// chain returns it: a request that ended with an error and no status code got no response
// from its upstream. A client that goes away ends the request before either is set, and is
// no failure of the upstream.

// noteRetry counts the failure of the attempt before a retry: Caddy retries only an attempt
// that failed, and one that got no status code got no response headers at all.
func (s *state) noteRetry(r *http.Request, req *llmRequest) {
	if len(req.tried) == 0 {
		return
	}
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		return
	}
	if _, got := repl.Get("http.reverse_proxy.status_code"); got {
		return // some attempt got headers: a response-based retry, or an unknown one
	}
	s.fail(s.upstream(req.tried[len(req.tried)-1]), "request: no response (retried)")
}

// watchOutcome records, when the request ends, whether its last attempt got a response. It
// is called once per request, at its first decision.
func (s *state) watchOutcome(r *http.Request, req *llmRequest) {
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		return // not served by Caddy (unit tests)
	}
	context.AfterFunc(r.Context(), func() {
		u := req.attempt.Load()
		if u == nil {
			return
		}
		if _, got := repl.Get("http.reverse_proxy.status_code"); got {
			s.healthy(u, false, "response")
			return
		}
		if e, failed := repl.Get("http.error"); failed && e != nil {
			s.fail(u, "request: no response headers")
		}
	})
}

// HealthStatus is what GET /kvroute/ shows of an upstream's health.
type HealthStatus struct {
	State       string     `json:"state"` // up | down
	Failures    int        `json:"failures_in_a_row"`
	Since       *time.Time `json:"since,omitempty"` // went down, or came back
	LastFailure string     `json:"last_failure,omitempty"`
	TimesDown   uint64     `json:"times_down"`
}

func (u *upstreamState) healthStatus() HealthStatus {
	h := &u.health
	h.mu.Lock()
	defer h.mu.Unlock()
	hs := HealthStatus{State: "up", Failures: h.failures, LastFailure: h.reason, TimesDown: h.total.Load()}
	if h.down.Load() {
		hs.State = "down"
	}
	if !h.since.IsZero() {
		t := h.since.UTC()
		hs.Since = &t
	}
	return hs
}

// unprotectedWarned makes the warning below once per process.
var unprotectedWarned atomic.Bool

// warnUnprotected warns, once per process, when the reverse_proxy using the policy has neither
// retries nor health checks: a dead upstream then fails requests until this policy's own
// health notices it (a few requests) and nothing retries them elsewhere.
func warnUnprotected(h *reverseproxy.Handler, logger *zap.Logger) {
	if h == nil || !unprotected(h) || unprotectedWarned.Swap(true) {
		return
	}
	logger.Warn("reverse_proxy with kv_cache_aware has neither retries nor health checks: requests to an upstream that just died fail until the policy has seen a few of them fail; set lb_retries or lb_try_duration, and health_uri (active) or fail_duration (passive)")
}

// unprotected reports whether h has neither retries (lb_retries, lb_try_duration) nor health
// checks (active: health_uri/health_path/health_port; passive: fail_duration).
func unprotected(h *reverseproxy.Handler) bool {
	if lb := h.LoadBalancing; lb != nil && (lb.Retries > 0 || lb.TryDuration > 0) {
		return false
	}
	if hc := h.HealthChecks; hc != nil {
		if hc.Active != nil && hc.Active.IsEnabled() {
			return false
		}
		if hc.Passive != nil && hc.Passive.FailDuration > 0 {
			return false
		}
	}
	return true
}
