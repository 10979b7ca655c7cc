package kvroute

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
)

// The policy's own memory of upstream failures (docs/design.md "Health"). With Caddy's defaults (no
// retries, no health checks) an upstream that refuses connections stays Available(), and with
// prefix affinity it would swallow every prefix group and session it holds. Two sources feed
// one mechanism: request outcomes (an attempt that got no response headers by its upstream's
// fault, each attempt once) and telemetry (a metrics endpoint that refuses connections).
// downAfter failures in a row make the upstream down: not a candidate unless all are. The
// policy's own probe (a connection to the upstream after each cool-down, or a telemetry
// reading) brings it back; a client's request never does. An upstream that cannot be probed
// comes back when its cool-down ends, so it is never held down longer than coolDownMax.
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
	probe    *probeRun // the running probe; nil when none runs
	total    atomic.Uint64

	// ended counts the requests whose last attempt went to the upstream and whose outcome was
	// taken in: tests wait for it instead of for time.
	ended atomic.Uint64
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
// reading), u is forgotten (dropUpstream), or the state is destroyed. An upstream that cannot
// be probed (probeTarget) is back when the first cool-down ends.
func (s *state) startProbe(u *upstreamState, cool time.Duration) {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.bgClosed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &probeRun{cancel: cancel}
	h := &u.health
	h.mu.Lock()
	if h.probe != nil {
		h.probe.cancel() // one that a reading made pointless may still wait out its cool-down
	}
	h.probe = run
	h.mu.Unlock()
	network, address, probeable := probeTarget(u.addr)
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		defer u.health.endProbe(run)
		timer := time.NewTimer(cool)
		defer timer.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			if !u.health.down.Load() || !s.tracks(u) {
				return // a reading brought it back, or it was forgotten meanwhile
			}
			if !probeable {
				s.healthy(u, true, "cool-down over (its dial address cannot be probed)")
				return
			}
			err := probeUpstream(ctx, s.stop, network, address)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				s.healthy(u, true, "probe")
				return
			}
			cool = min(2*cool, coolDownMax)
			timer.Reset(cool)
		}
	}()
}

// probeRun is one running probe of an upstream.
type probeRun struct{ cancel context.CancelFunc }

// endProbe clears the upstream's probe when it is still run.
func (h *healthState) endProbe(run *probeRun) {
	run.cancel()
	h.mu.Lock()
	if h.probe == run {
		h.probe = nil
	}
	h.mu.Unlock()
}

// tracks reports whether u is the state the router keeps for its address (not forgotten).
func (s *state) tracks(u *upstreamState) bool {
	v, ok := s.upstreams.Load(u.addr)
	return ok && v.(*upstreamState) == u
}

// dropUpstream forgets the state of u (its counters and health) and stops its probe.
func (s *state) dropUpstream(u *upstreamState) {
	s.upstreams.CompareAndDelete(u.addr, u)
	h := &u.health
	h.mu.Lock()
	if h.probe != nil {
		h.probe.cancel()
		h.probe = nil
	}
	h.mu.Unlock()
}

// probeTarget returns the network and address a probe of the upstream dialled at dial connects
// to, parsed as Caddy's reverse_proxy parses a dial address (global placeholders such as
// {env.*} replaced, caddy.ParseNetworkAddress): "tcp4/10.0.0.1:8000" is tcp4 10.0.0.1:8000,
// "unix//run/vllm.sock" is unix /run/vllm.sock. ok is false when the upstream cannot be
// probed: a placeholder only a request fills, a port range or no port, a network that is
// neither TCP nor a Unix stream socket.
func probeTarget(dial string) (network, address string, ok bool) {
	d := dial
	if strings.Contains(d, "{") {
		d = caddy.NewReplacer().ReplaceKnown(d, "")
	}
	if strings.ContainsAny(d, "{}") {
		return "", "", false
	}
	na, err := caddy.ParseNetworkAddress(d)
	if err != nil || na.PortRangeSize() != 1 {
		return "", "", false
	}
	switch {
	case na.Network == "unix" && na.Host != "",
		(na.Network == "tcp" || na.Network == "tcp4" || na.Network == "tcp6") && na.StartPort != 0:
		return na.Network, na.JoinHostPort(0), true
	}
	return "", "", false
}

// probeUpstream makes one connection to the upstream and closes it.
func probeUpstream(ctx context.Context, stop <-chan struct{}, network, address string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return telemetry.Probe(ctx, network, address, probeTimeout)
}

// stopHealth stops the probes and waits for them (Destruct, after s.stop is closed).
func (s *state) stopHealth() {
	s.bgMu.Lock()
	s.bgClosed = true
	s.bgMu.Unlock()
	s.bg.Wait()
}

// Request outcomes. Each attempt of a request (one Select that picked an upstream) is judged
// once: by the next Select when Caddy retries (it retries only a failed attempt, without
// saying why), or when the request ends (its error is then known: Caddy records the handler's
// error as http.error). An attempt that got response headers (any status) resets its
// upstream's failures in a row. One that got none counts as a failure only when the upstream
// is at fault (upstreamFault): never when reading the client's body failed, nor when the
// client went away.

// latencyKey is set by Caddy when an attempt gets response headers, anew for each attempt.
const latencyKey = "http.reverse_proxy.upstream.latency"

// attempt is one attempt of a request, as health judges it.
type attempt struct {
	u    *upstreamState
	body *watchedBody // the request body the attempt sends; nil without one
	// latency is latencyKey's value before the attempt (had: it was set): an earlier attempt,
	// or another reverse_proxy of the route (forward_auth), may have set it.
	latency time.Duration
	had     bool
	judged  atomic.Bool // its outcome was taken in
	// The routing text the attempt sends (its model, chars and the chars the trees predicted
	// the upstream held), counted in what the upstream was sent at the decision and taken
	// back when the engine refused it or never got it.
	model          string
	chars, matched int
	pred           prediction // what the decision predicted, when llm_feedback reads the answer (feedback.go)
}

// watchedBody is an attempt's request body: it remembers whether reading the client's body
// failed (a malformed chunk, request_body's max_size, a read timeout, a client that hung up,
// a body that cannot be sent again).
type watchedBody struct {
	io.ReadCloser
	failed atomic.Bool
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.failed.Store(true)
	}
	return n, err
}

// newAttempt records in a, a zero attempt, an attempt of r to u, and gives it a watched body
// (under Caddy only: r is the request the attempt sends, and its body the one Caddy's
// transport will read).
func newAttempt(r *http.Request, u *upstreamState, a *attempt) *attempt {
	a.u = u
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		return a
	}
	if v, ok := repl.Get(latencyKey); ok {
		a.latency, _ = v.(time.Duration)
		a.had = true
	}
	body := r.Body
	if w, ok := body.(*watchedBody); ok {
		body = w.ReadCloser // the previous attempt's
	}
	if body != nil && body != http.NoBody {
		a.body = &watchedBody{ReadCloser: body}
		r.Body = a.body
	}
	return a
}

// answered reports whether the attempt got response headers.
func (a *attempt) answered(repl *caddy.Replacer) bool {
	v, ok := repl.Get(latencyKey)
	if !ok {
		return false
	}
	d, isDuration := v.(time.Duration)
	return !a.had || !isDuration || d != a.latency
}

// statusKey is set by Caddy with the status of the attempt that got response headers, right
// after latencyKey.
const statusKey = "http.reverse_proxy.status_code"

// served reports whether the answered attempt's status says its engine took the request in
// (2xx). A refusal (a 429, a 400, a 500 for KV blocks that do not fit) was never prefilled: its
// text is in none of the engine's prompt-token totals, and leaving it in what the upstream was
// sent biases the chars per token learned from them.
func served(repl *caddy.Replacer) bool {
	v, ok := repl.Get(statusKey)
	if !ok {
		return false
	}
	code, isInt := v.(int)
	return isInt && code >= 200 && code < 300
}

// upstreamFault returns why an attempt that got no response headers failed by its upstream's
// fault, or "" when it did not. err is the request's error when it ended, nil when the attempt
// is judged at a retry (Caddy retries a dial error, or an error after the connection when
// lb_retry_match or a GET allows it: once the client's body is ruled out, the upstream's).
// With the error known, only these count: a dial or connect error, a timeout (response
// headers, dial), a reset, refusal or close by the upstream. A client that went away (Caddy's
// 499), a body over max_size, one that cannot be sent again, and any other error (a TLS
// handshake, an invalid header, a dial address a placeholder could not fill) do not.
func upstreamFault(a *attempt, err error) string {
	if a.body != nil && a.body.failed.Load() {
		return ""
	}
	if err == nil {
		return "request: no response (retried)"
	}
	var (
		dial     reverseproxy.DialError
		maxBytes *http.MaxBytesError
		he       caddyhttp.HandlerError
		ne       net.Error
	)
	switch {
	case errors.Is(err, context.Canceled), errors.As(err, &he) && he.StatusCode == 499:
		return ""
	case errors.As(err, &maxBytes), errors.Is(err, llmreq.ErrBodySpent), errors.Is(err, http.ErrBodyReadAfterClose):
		return ""
	case errors.As(err, &dial):
		return "request: dial: " + clip(dial.Error())
	case errors.As(err, &ne) && ne.Timeout():
		return "request: timeout: " + clip(err.Error())
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNABORTED),
		errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "request: reset or closed by the upstream: " + clip(err.Error())
	}
	return ""
}

// clip bounds an error's text kept as a health reason.
func clip(s string) string {
	const max = 200
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}

// judge takes in the outcome of attempt a, once. ended: the request is over, err its error.
func (s *state) judge(repl *caddy.Replacer, a *attempt, ended bool, err error) {
	if !a.judged.CompareAndSwap(false, true) {
		return
	}
	if a.answered(repl) {
		switch {
		case !served(repl):
			a.u.learn.sent.unsent(a.chars, a.matched)
		case ended:
			a.u.learn.sent.ended.Add(int64(a.chars))
		}
		s.healthy(a.u, false, "response")
		return
	}
	// Caddy retries a POST only when it could not send it (a dial error), unless lb_retry_match
	// says otherwise; either way the engine never got this one.
	var dial reverseproxy.DialError
	switch {
	case !ended || errors.As(err, &dial):
		a.u.learn.sent.unsent(a.chars, a.matched)
	default:
		// Sent, then over without an answer (the client went away, the upstream failed): an
		// engine that runs it to the end counts its tokens (llm-d's simulator does), so it
		// ends in the chars per token's count too. Left out, the ended chars fell behind the
		// tokens by every request an overloaded fleet kept after its client's deadline, and
		// the totals of chars sent and ended parted for good (learn.go publishes only while
		// they are close).
		a.u.learn.sent.ended.Add(int64(a.chars))
		// And its engine may still hold it, beyond this router's count (outsideTraffic).
		a.u.learn.abandonedAt.Store(time.Now().UnixNano())
	}
	if ended && err == nil {
		return // no answer and no error: the client went away (Caddy logs a 499)
	}
	if reason := upstreamFault(a, err); reason != "" {
		s.fail(a.u, reason)
	}
}

// noteRetry judges the attempt before a retry. Select runs again for each retry, and again
// every lb_try_interval while it finds no candidate: the attempt is judged the first time.
func (s *state) noteRetry(r *http.Request, req *llmRequest) {
	a := req.attempt.Load()
	if a == nil || len(req.tried) == 0 {
		return
	}
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		return
	}
	if r.Context().Err() != nil {
		a.judged.Store(true) // the client went away
		return
	}
	s.judge(repl, a, false, nil)
}

// judgeEnd judges, when the request ends, its last attempt (unless a retry's Select did).
// watchEnd calls it once per request.
func (s *state) judgeEnd(repl *caddy.Replacer, req *llmRequest) {
	a := req.attempt.Load()
	if a == nil {
		return
	}
	defer a.u.health.ended.Add(1)
	var err error
	if e, ok := repl.Get("http.error"); ok {
		err, _ = e.(error)
	}
	s.judge(repl, a, true, err)
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
