package kvroute

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"golang.org/x/net/http/httpguts"

	kvcf "github.com/kvroute/caddy-kvroute/caddyfile"
	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
)

// Telemetry configures the reading of the upstreams' own metrics endpoints (process-wide: one
// reader per upstream, whatever the number of policies). In JSON, {"off": true} turns it off;
// an absent block means on with the defaults.
type Telemetry struct {
	// Off disables telemetry.
	Off bool `json:"off,omitempty"`
	// Path of the metrics endpoint on each upstream's own host:port. Default: /metrics.
	Path string `json:"path,omitempty"`
	// Interval between two reads of one upstream (at least 100ms). Default: 1s.
	Interval caddy.Duration `json:"interval,omitempty"`
	// Timeout of one read (at most the interval). Default: 500ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// AuthHeader is sent as the Authorization header of every read (GET /v1/models sits
	// behind an engine's --api-key; /metrics does not): "Bearer {env.VLLM_API_KEY}".
	// Placeholders are replaced at provision; the value is never logged nor shown.
	AuthHeader string `json:"auth_header,omitempty"`
}

// Defaults and bounds of the telemetry options.
const (
	DefaultTelemetryPath     = "/metrics"
	DefaultTelemetryInterval = telemetry.DefaultInterval
	DefaultTelemetryTimeout  = telemetry.DefaultTimeout
	// Reading faster than this costs the engines a page render each time for figures that
	// change no faster.
	minTelemetryInterval = 100 * time.Millisecond
	// maxDynamicTargets bounds the dynamic upstreams read besides the static ones: dynamic
	// upstream addresses come from DNS or a discovery service and may churn.
	maxDynamicTargets = 256
	// dynamicTargetTTL: a dynamic upstream not chosen for this long is no longer read.
	dynamicTargetTTL = 10 * time.Minute
	// readingLifetime is how many intervals a reading's external load counts: an engine whose
	// endpoint stopped answering must not keep a queue it may have drained long ago.
	readingLifetime = 3
)

// dynamicTTLOverride replaces dynamicTargetTTL when positive (nanoseconds): tests shorten it.
var dynamicTTLOverride atomic.Int64

// dynamicTTL is how long a dynamic upstream that no decision picks stays known.
func dynamicTTL() time.Duration {
	if d := dynamicTTLOverride.Load(); d > 0 {
		return time.Duration(d)
	}
	return dynamicTargetTTL
}

// telemetrySettings are the telemetry options in force, defaults applied (comparable: the
// policies of one config must agree on them).
type telemetrySettings struct {
	off      bool
	path     string
	interval time.Duration
	timeout  time.Duration
	// authHeader is AuthHeader, its placeholders replaced once provisioned (settings(true)).
	authHeader string
	// modelsEvery is how often the engines' model lists are read (fleet.go).
	modelsEvery time.Duration
}

func (t *Telemetry) settings() telemetrySettings {
	if t == nil {
		return telemetrySettings{path: DefaultTelemetryPath, interval: DefaultTelemetryInterval, timeout: DefaultTelemetryTimeout, modelsEvery: modelsEvery()}
	}
	return telemetrySettings{
		off:      t.Off,
		path:     or(t.Path, DefaultTelemetryPath),
		interval: or(time.Duration(t.Interval), DefaultTelemetryInterval),
		timeout:  or(time.Duration(t.Timeout), DefaultTelemetryTimeout),

		authHeader:  t.AuthHeader,
		modelsEvery: modelsEvery(),
	}
}

func (t telemetrySettings) String() string {
	if t.off {
		return "off"
	}
	auth := ""
	if t.authHeader != "" {
		auth = " auth_header (set)" // the credential itself never appears in an error or a log
	}
	return fmt.Sprintf("{path %s interval %v timeout %v%s}", t.path, t.interval, t.timeout, auth)
}

func checkTelemetry(t telemetrySettings) error {
	switch {
	case t.off:
		return nil
	case !strings.HasPrefix(t.path, "/") || strings.ContainsAny(t.path, "?# \t"):
		return fmt.Errorf("path: want an absolute URL path such as /metrics, got %q", t.path)
	case t.interval < minTelemetryInterval:
		return fmt.Errorf("interval: must be at least %v, got %v", minTelemetryInterval, t.interval)
	case t.timeout <= 0 || t.timeout > t.interval:
		return fmt.Errorf("timeout: must be positive and at most the interval (%v), got %v", t.interval, t.timeout)
	case !httpguts.ValidHeaderFieldValue(t.authHeader):
		return errors.New("auth_header: not a valid HTTP header value (a line break or a control character?)")
	}
	return nil
}

// resolveAuthHeader replaces the placeholders of the auth_header value (at provision: the
// Caddyfile adapter may run on another machine than Caddy). Every placeholder must resolve:
// an unset variable must not send the config's own text, or nothing, as a credential.
func resolveAuthHeader(v string) (string, error) {
	if !strings.Contains(v, "{") {
		return v, nil
	}
	r, err := caddy.NewReplacer().ReplaceOrErr(v, true, true)
	if err != nil {
		return "", fmt.Errorf("auth_header: a placeholder did not resolve (is its environment variable set?): %v", err)
	}
	if r == "" {
		return "", errors.New("auth_header: resolved to nothing (is its environment variable set?)")
	}
	return r, nil
}

// unmarshalTelemetry reads `telemetry off` or a `telemetry { path, interval, timeout }` block.
func (p *KVCacheAware) unmarshalTelemetry(d *caddyfile.Dispenser) error {
	t := new(Telemetry)
	args := d.RemainingArgs()
	switch {
	case len(args) == 1 && args[0] == "off":
		t.Off = true
		if d.NextBlock(d.Nesting()) {
			return d.Err("telemetry off: takes no block")
		}
		p.Telemetry = t
		return nil
	case len(args) > 0:
		return d.Errf("telemetry: want `off` or a block, got %q", strings.Join(args, " "))
	}
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("telemetry: %s: given twice", opt)
		}
		seen[opt] = true
		switch opt {
		case "path":
			v, err := kvcf.StringArg(d)
			if err != nil {
				return err
			}
			t.Path = v
		case "auth_header":
			v, err := kvcf.StringArg(d)
			if err != nil {
				return err
			}
			if v == "" {
				return d.Err("telemetry: auth_header: must not be empty")
			}
			t.AuthHeader = v
		case "interval", "timeout":
			v, err := kvcf.DurationArg(d)
			if err != nil {
				return err
			}
			if v <= 0 {
				return d.Errf("telemetry: %s: must be positive", opt)
			}
			if opt == "interval" {
				t.Interval = caddy.Duration(v)
			} else {
				t.Timeout = caddy.Duration(v)
			}
		default:
			return d.Errf("telemetry: unrecognized option %q (options: path, interval, timeout, auth_header)", opt)
		}
	}
	p.Telemetry = t
	return nil
}

// proxyScheme is the scheme of the upstreams of the reverse_proxy handler that loads the
// policy: https when its transport uses TLS. Caddy provisions the transport before the
// selection policy.
func proxyScheme(ctx caddy.Context) string {
	if h := parentHandler(ctx); h != nil {
		if t, ok := h.Transport.(*reverseproxy.HTTPTransport); ok && t.TLS != nil {
			return "https"
		}
	}
	return "http"
}

// proxyResolvers returns the DNS resolvers the transport of the reverse_proxy that loads the
// policy dials its upstreams' names with (transport http { resolvers ... }), or nil.
func proxyResolvers(ctx caddy.Context) []string {
	if h := parentHandler(ctx); h != nil {
		if t, ok := h.Transport.(*reverseproxy.HTTPTransport); ok && t.Resolver != nil {
			return slices.Clone(t.Resolver.Addresses)
		}
	}
	return nil
}

// resolverFor returns a resolver that asks one of addrs (network addresses, udp and port 53
// by default, as Caddy parses a transport's resolvers), or nil when addrs is empty or does
// not parse (the system's resolver then).
func resolverFor(addrs []string) *net.Resolver {
	var nas []caddy.NetworkAddress
	for _, a := range addrs {
		na, err := caddy.ParseNetworkAddressWithDefaults(a, "udp", 53)
		if err != nil || na.PortRangeSize() != 1 {
			return nil
		}
		nas = append(nas, na)
	}
	if len(nas) == 0 {
		return nil
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		na := nas[rand.IntN(len(nas))]
		var d net.Dialer
		return d.DialContext(ctx, na.Network, na.JoinHostPort(0))
	}}
}

// parentHandler returns the reverse_proxy handler that loads the policy, or nil.
func parentHandler(ctx caddy.Context) *reverseproxy.Handler {
	var h *reverseproxy.Handler
	for _, m := range ctx.Modules() {
		if rp, ok := m.(*reverseproxy.Handler); ok {
			h = rp
		}
	}
	return h
}

// telemetryState is the state's reader of the upstreams' metrics: one Scraper for the process,
// created when the config starts and replaced when a reload changes the options.
type telemetryState struct {
	mu        sync.Mutex // serializes syncTelemetry and stopTelemetry; never held with state.mu
	scraper   *telemetry.Scraper
	conf      telemetrySettings // the scraper's
	resolvers string            // the scraper's DNS resolvers (the proxies' transports'), joined
	closed    bool              // the state was destroyed

	// current is the scraper for lock-free reads (the request path, the admin API).
	current atomic.Pointer[telemetry.Scraper]
	// dynamic holds the dynamic upstreams being read, nDynamic their number.
	dynamic  sync.Map // dial address → struct{}
	nDynamic atomic.Int64

	// capacity holds the KV capacities the engines report, in tokens; guarded by state.mu
	// (limitsLocked reads it).
	capacity map[string]int64
}

// engineView is what the latest reading says about an upstream's load: the requests the
// engine runs and queues beyond those this router had sent it when it answered.
type engineView struct {
	at       time.Time
	until    int64 // unix nanoseconds after which the reading no longer counts
	external int64 // counted in the load: the smaller of this reading's raw and the previous one's
	raw      int64 // this reading's running + waiting − own
	waiting  int64 // the engine's waiting requests, all senders' (decision cost's queue)
	// outside: the engine's own counts showed requests from elsewhere lately (outsideTraffic);
	// external is 0 while they do not.
	outside bool
}

// externalLoad returns the upstream's external load at now (unix nanoseconds): 0 without a
// reading, or once the reading is older than readingLifetime intervals.
func (u *upstreamState) externalLoad(now int64) int64 {
	if e := u.engine.Load(); e != nil && now <= e.until {
		return e.external
	}
	return 0
}

// syncTelemetry puts the telemetry options in force and makes the scraper read every static
// upstream of the live policies (plus the dynamic ones it reads already). It does nothing
// before the config starts: caddy validate and adapt provision policies but must start no
// background work. state.mu must not be held: stopping a scraper waits for its Observe calls,
// which take state.mu.
func (s *state) syncTelemetry() {
	if !s.started.Load() {
		return
	}
	s.tel.mu.Lock()
	defer s.tel.mu.Unlock()
	if s.tel.closed {
		return
	}
	s.mu.Lock()
	conf := s.options.telemetry
	resolvers := ""
	if r := s.newestLocked(); r != nil {
		resolvers = strings.Join(r.resolvers, " ")
	}
	want := make(map[string]string)
	if !conf.off {
		for addr := range s.staticLocked() {
			if url := s.metricsURLLocked(addr); url != "" {
				want[addr] = url
			}
		}
	}
	s.mu.Unlock()

	if s.tel.scraper != nil && (s.tel.conf != conf || s.tel.resolvers != resolvers) {
		s.stopScraperLocked()
	}
	if conf.off {
		return
	}
	if s.tel.scraper == nil {
		var header http.Header
		if conf.authHeader != "" {
			header = http.Header{"Authorization": {conf.authHeader}}
		}
		s.tel.scraper = telemetry.NewScraper(telemetry.Options{
			Interval:    conf.interval,
			Timeout:     conf.timeout,
			ModelsEvery: conf.modelsEvery,
			Header:      header,
			Resolver:    resolverFor(strings.Fields(resolvers)),
			Observe: func(prev, cur *telemetry.Snapshot) {
				s.observe(conf.interval, prev, cur)
				s.shareReading(cur)
				s.shareLearned(cur)
			},
			Skip: func(key string) bool { return s.skipScrape(key, conf.interval) },
		})
		s.tel.conf, s.tel.resolvers = conf, resolvers
		s.tel.current.Store(s.tel.scraper)
	}
	sc := s.tel.scraper
	for _, key := range sc.Keys() {
		if _, dyn := s.tel.dynamic.Load(key); !dyn && want[key] == "" {
			sc.Remove(key)
			s.forgetEngine(key)
		}
	}
	for key, url := range want {
		if err := sc.Add(telemetry.Target{Key: key, URL: url}); err != nil {
			s.log().Debug("telemetry: not reading an upstream", zap.String("upstream", key), zap.Error(err))
		}
	}
}

// stopScraperLocked stops the scraper and forgets what it read. s.tel.mu is held.
func (s *state) stopScraperLocked() {
	sc := s.tel.scraper
	s.tel.scraper = nil
	s.tel.current.Store(nil)
	sc.Stop()
	for _, key := range sc.Keys() {
		s.forgetEngine(key)
	}
	s.tel.dynamic.Range(func(k, _ any) bool {
		s.tel.dynamic.Delete(k)
		s.forgetEngine(k.(string))
		return true
	})
	s.tel.nDynamic.Store(0)
	s.mu.Lock()
	for addr := range s.tel.capacity {
		delete(s.tel.capacity, addr)
	}
	s.forest.SetLimits(s.limitsLocked(s.options.maxTreeSize))
	s.mu.Unlock()
}

// stopTelemetry stops the scraper for good (Destruct).
func (s *state) stopTelemetry() {
	s.tel.mu.Lock()
	defer s.tel.mu.Unlock()
	s.tel.closed = true
	if s.tel.scraper != nil {
		s.stopScraperLocked()
	}
}

// forgetEngine drops an upstream's engine figures and its reported KV capacity.
func (s *state) forgetEngine(addr string) {
	if v, ok := s.upstreams.Load(addr); ok {
		u := v.(*upstreamState)
		u.engine.Store(nil)
		u.telemetryUp.Store(false)
		u.learn.forgetSlots()
	}
	s.mu.Lock()
	if _, ok := s.tel.capacity[addr]; ok {
		delete(s.tel.capacity, addr)
		s.forest.SetLimits(s.limitsLocked(s.options.maxTreeSize))
	}
	s.mu.Unlock()
}

// metricsURLLocked returns the metrics endpoint of the upstream dialled at addr: the newest
// live policy's metrics_url for it, else <scheme>://<addr><path> with the scheme of a policy
// that lists it (the newest one's for a dynamic upstream); "" when there is none (a Unix
// socket without metrics_url).
func (s *state) metricsURLLocked(addr string) string {
	var newest, lister *registration
	url := ""
	for q := range s.regs {
		if prof, ok := q.profiles[addr]; ok && prof.MetricsURL != "" && (newest == nil || q.provisioned.After(newest.provisioned)) {
			newest, url = q, prof.MetricsURL
		}
	}
	if url != "" {
		return url
	}
	if _, _, err := net.SplitHostPort(addr); err != nil || strings.ContainsAny(addr, "{}/") {
		return ""
	}
	for q := range s.regs {
		for _, a := range q.static {
			if a == addr && (lister == nil || q.provisioned.After(lister.provisioned)) {
				lister = q
			}
		}
	}
	if lister == nil {
		lister = s.newestLocked()
	}
	scheme := "http"
	if lister != nil && lister.scheme != "" {
		scheme = lister.scheme
	}
	return telemetry.MetricsURL(scheme, addr, s.options.telemetry.path)
}

// seeDynamic notes that a decision saw the dynamic upstream u in its pool at now (unix
// nanoseconds), and starts reading it the first time, up to maxDynamicTargets of them: an
// engine that DNS just named gets its reader before its first request. The check on the
// request path is one map load.
func (s *state) seeDynamic(u *upstreamState, now int64) {
	u.lastSeen.Store(now)
	addr := u.addr
	if _, ok := s.tel.dynamic.Load(addr); ok {
		return
	}
	sc := s.tel.current.Load()
	if sc == nil || s.tel.nDynamic.Load() >= maxDynamicTargets {
		return
	}
	if _, loaded := s.tel.dynamic.LoadOrStore(addr, struct{}{}); loaded {
		return
	}
	s.tel.nDynamic.Add(1)
	s.mu.Lock()
	url := s.metricsURLLocked(addr)
	s.mu.Unlock()
	if url == "" {
		return // kept in dynamic, so that it is not looked at again until it expires
	}
	if err := sc.Add(telemetry.Target{Key: addr, URL: url}); err != nil {
		// The scraper was replaced meanwhile (a reload changed telemetry): the next decision
		// for addr tries again. A full scraper stays full: addr stays marked until it expires.
		if !errors.Is(err, telemetry.ErrTooManyTargets) {
			s.tel.dynamic.Delete(addr)
			s.tel.nDynamic.Add(-1)
		}
		s.log().Debug("telemetry: not reading a dynamic upstream", zap.String("upstream", addr), zap.Error(err))
	}
}

// expireDynamic stops reading the dynamic upstreams no decision saw in its pool for the
// dynamic TTL (run by the eviction pass).
func (s *state) expireDynamic(now time.Time) {
	sc := s.tel.current.Load()
	idle := now.Add(-dynamicTTL()).UnixNano()
	s.tel.dynamic.Range(func(k, _ any) bool {
		addr := k.(string)
		if s.isStatic(addr) {
			return true // now a static upstream: syncTelemetry reads it as such
		}
		if v, ok := s.upstreams.Load(addr); ok && v.(*upstreamState).lastActive() >= idle {
			return true
		}
		s.stopDynamic(sc, addr)
		return true
	})
}

// stopDynamic stops reading the dynamic upstream addr (sc: the scraper in force, nil when
// telemetry is off) and forgets what its engine reported.
func (s *state) stopDynamic(sc *telemetry.Scraper, addr string) {
	if _, ok := s.tel.dynamic.LoadAndDelete(addr); !ok {
		return
	}
	s.tel.nDynamic.Add(-1)
	if sc != nil {
		sc.Remove(addr)
	}
	s.forgetEngine(addr)
}

// observe takes in one scrape's outcome (from the target's goroutine): the engine's load
// beyond this router's own, its KV capacity, and the health signal.
func (s *state) observe(interval time.Duration, prev, cur *telemetry.Snapshot) {
	// A scrape that ends as its target is removed (the upstream left the config, or the
	// scraper is being replaced) is still observed once: it must not bring back the figures
	// forgetEngine just dropped. The scraper publishes the snapshot before observing it, so a
	// live target has one.
	if sc := s.tel.current.Load(); sc == nil || sc.Snapshot(cur.Key) == nil {
		return
	}
	u := s.upstream(cur.Key)
	s.observeFleet(u, prev, cur)
	switch cur.Outcome {
	case telemetry.OutcomeOK:
		r := &cur.Reading
		if r.Known&(telemetry.HasRunning|telemetry.HasWaiting) != 0 {
			// own(t_reading) is the count now, a moment after the engine answered: requests that
			// ended in that moment make the engine's figure look larger than what this router
			// sent, a spike of one reading. Traffic from elsewhere lasts, so what counts is the
			// smaller of the last two fresh readings (an interval later than one reading would).
			// own is the figure the load counts (load.go), Caddy's count with another
			// reverse_proxy's requests in it: they count once, there.
			// Peers' requests (cluster) are theirs, not external: subtract them too.
			// A peer's reading (cur.FromPeer) is taken in here as it arrives, a few
			// milliseconds after the owner read it (its flush delay and NATS), so the counts
			// now are this replica's counts at the reading's time as closely as an own scrape's
			// are (the page's transfer takes as long); keeping a history of counts to look up
			// the exact instant would buy nothing the min of two readings does not already
			// absorb. The peers' term is the owner's and the others' latest published counts,
			// which lag by up to load_interval either way.
			raw := max(0, r.Running+r.Waiting-u.own()-s.peersInFlight(cur.Key))
			// And only while the engine's own counts show requests from elsewhere (learn.go).
			outside := s.outsideTraffic(u, cur, interval)
			ext := int64(0)
			if prev := u.engine.Load(); outside && prev != nil && r.At.UnixNano() <= prev.until {
				ext = min(raw, prev.raw)
			}
			life := time.Duration(readingLifetime) * interval
			waiting := int64(0)
			if r.Known.Has(telemetry.HasWaiting) {
				waiting = max(0, r.Waiting)
			}
			u.engine.Store(&engineView{at: r.At, until: r.At.Add(life).UnixNano(), external: ext, raw: raw, waiting: waiting, outside: outside})
		}
		if r.Known.Has(telemetry.HasKVCapacity) {
			s.setEngineCapacity(cur.Key, r.KVCapacityTokens)
		}
		s.learnFrom(u, cur)
		if !u.telemetryUp.Swap(true) {
			s.log().Info("telemetry: reading the upstream's engine",
				zap.String("upstream", cur.Key), zap.String("url", cur.URL),
				zap.String("engine", string(r.Engine)), zap.Stringer("figures", r.Known),
				zap.Int64("kv_capacity_tokens", r.KVCapacityTokens))
		}
		// A peer's reading says the engine answered the peer: health stays this replica's own
		// (its requests, its probe, its own reads), or a replica cut off from an upstream would
		// see it marked up every interval.
		if !cur.FromPeer {
			s.healthy(u, true, "telemetry reading")
		}
	case telemetry.OutcomeRefused:
		s.fail(u, "telemetry: "+cur.LastError)
	}
	if cur.Outcome != telemetry.OutcomeOK {
		logger := s.log()
		logger.Debug("telemetry: scrape failed", zap.String("upstream", cur.Key),
			zap.Stringer("outcome", cur.Outcome), zap.String("error", cur.LastError))
		// Warn, once per upstream for the process: engines that serve /metrics only when asked
		// (SGLang, llama.cpp) otherwise leave the trees unbounded by KV with only a debug line
		// to show for it.
		if cur.Outcome == telemetry.OutcomeNotFound && !cur.FromPeer && !u.noMetrics.Swap(true) {
			logger.Warn("telemetry: the upstream's engine serves no metrics (404), so its share of the trees has no KV bound and its load counts only this router's requests: start SGLang with --enable-metrics, llama.cpp's server with --metrics, or give the upstream block metrics_url or kv_capacity (Ollama serves none: its KV capacity is num_ctx × OLLAMA_NUM_PARALLEL tokens)",
				zap.String("upstream", cur.Key), zap.String("url", cur.URL))
		}
		// A single slow page is not the telemetry going away; three failed reads in a row are.
		if cur.Failures == 3 && u.telemetryUp.Swap(false) {
			logger.Info("telemetry: lost the upstream's engine figures",
				zap.String("upstream", cur.Key), zap.String("url", cur.URL),
				zap.Stringer("outcome", cur.Outcome), zap.String("error", cur.LastError))
		}
	}
}

// peerFresh is how long a peer's reading of an engine stands in for this replica's own read:
// the owner reads once per interval (±10%), so a reading younger than 1.5 intervals means the
// owner is at work; one that is older means it stopped, and this replica reads itself.
func peerFresh(interval time.Duration) time.Duration { return interval * 3 / 2 }

// skipScrape reports whether this replica leaves out its own read of the engine at key: a peer
// owns it and its latest reading is fresh. Without a cluster, or as the owner, or with the
// upstream down here (an own read is then also a probe), it reads.
func (s *state) skipScrape(key string, interval time.Duration) bool {
	n := s.node()
	if n == nil {
		return false
	}
	v, ok := s.upstreams.Load(key)
	if !ok {
		return false
	}
	at := v.(*upstreamState).peerReadAt.Load()
	if at == 0 || time.Now().UnixNano()-at >= int64(peerFresh(interval)) || s.isDown(key) {
		return false
	}
	return !n.Owns(key)
}

// shareReading publishes this replica's own read of an engine when it owns the engine (from
// the target's goroutine, never from the cluster's Handler: Owns takes the node's lock).
func (s *state) shareReading(cur *telemetry.Snapshot) {
	n := s.node()
	if n == nil || cur.Outcome == telemetry.OutcomeNone || !n.Owns(cur.Key) {
		return
	}
	er := cluster.EngineReading{Upstream: cur.Key, At: cur.Attempted, Failed: true}
	if cur.Outcome == telemetry.OutcomeOK {
		r := &cur.Reading
		er = cluster.EngineReading{Upstream: cur.Key, Engine: string(r.Engine), At: r.At,
			Running: r.Running, Waiting: r.Waiting, KVCapacityTokens: r.KVCapacityTokens}
		if r.Known.Has(telemetry.HasRunning) {
			er.Known |= cluster.ReadingRunning
		}
		if r.Known.Has(telemetry.HasWaiting) {
			er.Known |= cluster.ReadingWaiting
		}
		if r.Known.Has(telemetry.HasKVCapacity) {
			er.Known |= cluster.ReadingKVCapacity
		}
	}
	n.PublishReading(er)
}

// adoptReading takes in a peer's reading of an engine this replica reads too (the cluster's
// Handler): its figures go through observe like an own scrape's, and the replica's own read
// pauses while it is fresh. A failed read of the owner resumes the replica's own at once.
// Readings of engines this replica does not read are ignored: peers cannot add targets.
func (s *state) adoptReading(er cluster.EngineReading) {
	sc := s.tel.current.Load()
	if sc == nil {
		return
	}
	v, ok := s.upstreams.Load(er.Upstream)
	if !ok || sc.Snapshot(er.Upstream) == nil {
		return
	}
	u := v.(*upstreamState)
	if er.Failed {
		u.peerReadAt.Store(0)
		return
	}
	r := telemetry.Reading{Engine: telemetry.Engine(er.Engine), At: er.At,
		Figures: telemetry.Figures{Running: er.Running, Waiting: er.Waiting, KVCapacityTokens: er.KVCapacityTokens}}
	if er.Known&cluster.ReadingRunning != 0 {
		r.Known |= telemetry.HasRunning
	}
	if er.Known&cluster.ReadingWaiting != 0 {
		r.Known |= telemetry.HasWaiting
	}
	if er.Known&cluster.ReadingKVCapacity != 0 {
		r.Known |= telemetry.HasKVCapacity
	}
	prev, cur, ok := sc.Adopt(er.Upstream, r)
	if !ok {
		return
	}
	u.peerReadAt.Store(er.At.UnixNano())
	s.observe(sc.Interval(), prev, cur)
}

// setEngineCapacity records the KV capacity an engine reported and bounds its share of the
// trees by it (unless a policy annotates kv_capacity: the annotation wins).
func (s *state) setEngineCapacity(addr string, tokens int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tel.capacity[addr] == tokens {
		return
	}
	if s.tel.capacity == nil {
		s.tel.capacity = make(map[string]int64)
	}
	s.tel.capacity[addr] = tokens
	s.forest.SetLimits(s.limitsLocked(s.options.maxTreeSize))
}

// log returns the newest config's logger.
func (s *state) log() *zap.Logger {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logger
}

// TelemetryStatus is what GET /kvroute/ shows of an upstream's telemetry.
type TelemetryStatus struct {
	URL     string           `json:"url"`
	Engine  telemetry.Engine `json:"engine,omitempty"`
	Figures FiguresStatus    `json:"figures"`
	// ReadAt is when the engine answered the latest successful read; AgeSeconds its age.
	ReadAt     *time.Time        `json:"read_at,omitempty"`
	AgeSeconds float64           `json:"age_seconds,omitempty"`
	External   int64             `json:"external_load"` // counted in the load, while the reading is fresh
	Outcome    string            `json:"outcome"`       // of the latest attempt: ok, refused, not_found, stale, ...
	Failures   int               `json:"failures"`      // attempts since the latest reading
	LastError  string            `json:"last_error,omitempty"`
	Counts     map[string]uint64 `json:"counts"` // attempts by outcome
	Ignored    uint64            `json:"ignored_samples"`
	// Source of the latest reading: "own" (this replica read the engine) or "peer" (the
	// cluster replica that owns the engine did).
	Source string `json:"source,omitempty"`
}

// FiguresStatus are the engine's figures of the latest reading; Known lists those it reported
// ("running,waiting,kv_usage,kv_capacity").
type FiguresStatus struct {
	Running          int64   `json:"running"`
	Waiting          int64   `json:"waiting"`
	KVUsage          float64 `json:"kv_usage"`
	KVCapacityTokens int64   `json:"kv_capacity_tokens"`
	Known            string  `json:"known"`
}

// telemetryStatus returns the admin API's view of addr's telemetry, or nil when it is not read.
func (s *state) telemetryStatus(addr string, now time.Time) *TelemetryStatus {
	sc := s.tel.current.Load()
	if sc == nil {
		return nil
	}
	snap := sc.Snapshot(addr)
	if snap == nil {
		return nil
	}
	f := &snap.Reading.Figures
	ts := &TelemetryStatus{
		URL: snap.URL, Engine: snap.Reading.Engine,
		Figures: FiguresStatus{Running: f.Running, Waiting: f.Waiting, KVUsage: f.KVUsage, KVCapacityTokens: f.KVCapacityTokens, Known: f.Known.String()},
		Outcome: snap.Outcome.String(), Failures: snap.Failures, LastError: snap.LastError,
		Counts: make(map[string]uint64), Ignored: snap.Ignored,
	}
	for _, o := range telemetry.Outcomes() {
		if n := snap.Counts[o]; n > 0 {
			ts.Counts[o.String()] = n
		}
	}
	if !snap.Reading.At.IsZero() {
		at := snap.Reading.At.UTC()
		ts.ReadAt, ts.AgeSeconds = &at, snap.Age(now).Seconds()
		ts.Source = "own"
		if snap.FromPeer {
			ts.Source = "peer"
		}
	}
	if v, ok := s.upstreams.Load(addr); ok {
		ts.External = v.(*upstreamState).externalLoad(now.UnixNano())
	}
	return ts
}
