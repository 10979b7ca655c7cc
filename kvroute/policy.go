package kvroute

import (
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/kvroute/caddy-kvroute/energy"
	"github.com/kvroute/caddy-kvroute/kvroute/decide"
)

func init() {
	caddy.RegisterModule(new(KVCacheAware))
}

// KVCacheAware is the load-balancing policy `kv_cache_aware`. It sends each LLM request to the
// upstream most likely to hold the request's prompt prefix in its KV cache, keeps sessions on
// their upstream while its load stays within the balance band, leaves busy upstreams when load
// is imbalanced, and places cold requests where they cost the fewest joules. Select documents
// the decision; docs/design.md is the whole design. Defaults are in options.go.
type KVCacheAware struct {
	// A request goes to the upstream holding its longest cached prefix when the matched share of
	// its routing text is above this ratio (0 to 1). Default: 0.1.
	CacheThreshold *float64 `json:"cache_threshold,omitempty"`
	// Load is imbalanced when max-min over the candidates' loads is above this number AND
	// max > min × balance_rel_threshold. The same two numbers draw the balance band: an upstream
	// is in band when load-min <= balance_abs_threshold or load <= min × balance_rel_threshold.
	// A session's upstream out of band is skipped for the request; on imbalance the request goes
	// by on_imbalance. Defaults: 4 and 1.5.
	BalanceAbsThreshold *int     `json:"balance_abs_threshold,omitempty"`
	BalanceRelThreshold *float64 `json:"balance_rel_threshold,omitempty"`
	// Where a request goes when load is imbalanced: prefix_in_band (the longest cached prefix
	// among the upstreams in the balance band; the least busy when none holds any) or
	// least_busy (the lowest busyness). Default: prefix_in_band.
	OnImbalance string `json:"on_imbalance,omitempty"`
	// How often least recently used prefixes are evicted (at least 1s). Default: 120s. 0 in JSON
	// means the default; eviction also runs on insert whenever the trees cross max_tree_size.
	// Process-wide.
	EvictionInterval caddy.Duration `json:"eviction_interval,omitempty"`
	// Chars stored in all prefix trees together (each stored char counted once, whichever
	// upstreams share it). Default: 64Mi chars. Process-wide.
	MaxTreeSize int64 `json:"max_tree_size,omitempty"`
	// Request header that carries a session id. Default: X-Session-ID.
	SessionHeader string `json:"session_header,omitempty"`
	// Cookie-based sessions; off unless set.
	SessionCookie *SessionCookie `json:"session_cookie,omitempty"`
	// A session binding unused for this long is dropped (at least 1s). Default: 30m.
	// Process-wide.
	SessionTTL caddy.Duration `json:"session_ttl,omitempty"`
	// Bindings held at most, exactly (least recently used go first). Default: 100000. Cookie
	// ids issued and not yet presented back are held apart, up to a tenth of this number, so
	// that clients without cookies evict nobody. Process-wide.
	MaxSessions int `json:"max_sessions,omitempty"`
	// Output tokens assumed for energy placement when the request states none. Default: 256.
	ExpectedTokens int `json:"expected_tokens,omitempty"`
	// Placement of cold requests: joule, carbon, least_busy, round_robin or random. Default: joule.
	Fallback string `json:"fallback,omitempty"`
	// How steps 3 to 5 of the decision choose: cost (the lowest predicted time to first token,
	// docs/decision.md) or thresholds (the balance band, cache_threshold and fallback, as
	// SGLang's cache-aware router). Default: thresholds.
	Decision string `json:"decision,omitempty"`
	// decision cost: latency (the lowest predicted TTFT), completion (latency, and a warm
	// upstream or a session leaves an engine whose slower decode costs the request more than a
	// move: docs/decision.md), energy or carbon (the fewest predicted joules or grams among the
	// candidates within ttft_slack of the best). Default: latency.
	Objective string `json:"objective,omitempty"`
	// decision cost: a session or the warm upstream keeps a request while its predicted TTFT is
	// within this fraction of the best move's (a move priced at what it forfeits), and energy
	// or carbon may choose within it of the best (0 to 100). Default: 5 (docs/decision.md:
	// measured).
	TTFTSlack *float64 `json:"ttft_slack,omitempty"`
	// Response header that explains the decision (its path, the chosen upstream's predicted
	// match and cost); off unless set.
	ExplainHeader string `json:"explain_header,omitempty"`
	// Reading of the upstreams' metrics endpoints (KV capacity, engine load, health); on by
	// default. Process-wide.
	Telemetry *Telemetry `json:"telemetry,omitempty"`
	// Accelerator and energy metadata of upstreams, keyed by dial address (host:port, as in the
	// reverse_proxy's upstream list). Absent fields are unknown.
	Upstreams map[string]energy.Profile `json:"upstreams,omitempty"`
	// Replicas sharing what they learn over NATS; off unless set. Process-wide.
	Cluster *ClusterConfig `json:"cluster,omitempty"`
	// How long a request may wait at the router while every upstream that could serve it is
	// full (its batch slots busy: learned from its engine, else max_concurrency; an upstream
	// with neither is never full). 0: never wait. Default: 0 (DefaultQueueTimeout). Past it, a
	// request goes on as if it had not waited. With flow_control, a value other than 0 is the
	// bands' default queue_timeout (past it: 429); 0 or none leaves them 10s
	// (DefaultBandTimeout) unless a band gives its own.
	QueueTimeout *caddy.Duration `json:"queue_timeout,omitempty"`
	// Who waits first when the fleet is full: bands, tenants' fair shares; off unless set.
	FlowControl *FlowControl `json:"flow_control,omitempty"`

	opts     settings
	core     decide.Options // the decision's options (kvroute/decide)
	cookie   *cookieCodec
	profiles map[string]*energy.Profile
	reg      *registration // what the shared state knows of this policy

	state  *state
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (*KVCacheAware) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.kv_cache_aware",
		New: func() caddy.Module { return new(KVCacheAware) },
	}
}

// Provision applies defaults, checks the options, joins the process-wide state and registers
// the metrics.
func (p *KVCacheAware) Provision(ctx caddy.Context) error {
	p.logger = ctx.Logger()
	p.opts = p.settings(true)
	if err := p.opts.validate(); err != nil {
		return err
	}
	if err := validateUpstreams(p.Upstreams); err != nil {
		return err
	}
	p.core = p.opts.core()
	if c := p.opts.cookie; c != nil {
		p.cookie = &cookieCodec{name: c.Name, secret: []byte(c.Secret)}
	}
	p.profiles = make(map[string]*energy.Profile, len(p.Upstreams))
	for addr, prof := range p.Upstreams {
		p.profiles[addr] = &prof
	}

	static, pool := staticUpstreams(ctx)
	if len(static) > 0 {
		inPool := make(map[string]bool, len(static))
		for _, a := range static {
			inPool[a] = true
		}
		for addr := range p.Upstreams {
			if !inPool[addr] {
				// Warn: most often a typo, whose profile would then never apply. It is kept (and
				// said to be fine) for addresses that dynamic upstreams will name.
				p.logger.Warn("upstream block names an address in no static pool: a typo? (fine if dynamic upstreams name it)",
					zap.String("upstream", addr))
			}
		}
	}

	warnUnprotected(parentHandler(ctx), p.logger)
	registerMetrics(ctx.GetMetricsRegistry())
	p.exportQueueMetrics()
	st, err := acquireState()
	if err != nil {
		return err
	}
	p.reg = &registration{
		config:      ctx.Done(),
		provisioned: time.Now(),
		static:      static,
		policy:      p,
		pool:        pool,
		profiles:    p.Upstreams,
		logger:      p.logger,
		scheme:      proxyScheme(ctx),
		resolvers:   proxyResolvers(ctx),
		process: processOptions{
			telemetry:        p.opts.telemetry, // auth_header's placeholders replaced
			telemetryGiven:   p.Telemetry != nil,
			evictionInterval: time.Duration(p.EvictionInterval),
			maxTreeSize:      p.MaxTreeSize,
			sessionTTL:       time.Duration(p.SessionTTL),
			maxSessions:      p.MaxSessions,
			cluster:          p.opts.cluster,
		},
	}
	// The kvroute app starts the background work with the config (app.go).
	app, err := loadApp(ctx)
	if err != nil {
		_, _ = states.Delete(stateKey)
		return err
	}
	p.reg.app = app != nil
	if err := st.register(p.reg); err != nil {
		_, _ = states.Delete(stateKey)
		return err
	}
	if app != nil {
		app.attach(st)
	}
	p.state = st
	return nil
}

// staticUpstreams returns the dial addresses of the static upstreams of the reverse_proxy
// handler that loads the policy (its parent module): they tell which tenants leave when a
// reload removes them; and the pool itself.
func staticUpstreams(ctx caddy.Context) ([]string, reverseproxy.UpstreamPool) {
	var static []string
	var pool reverseproxy.UpstreamPool
	for _, m := range ctx.Modules() {
		if h, ok := m.(*reverseproxy.Handler); ok {
			static = static[:0]
			pool = h.Upstreams
			for _, u := range h.Upstreams {
				static = append(static, u.Dial)
			}
		}
	}
	return static, pool
}

// Validate checks the options of a policy that was not provisioned from a Caddyfile (Provision
// has already run the same checks).
func (p *KVCacheAware) Validate() error {
	s := p.settings(true)
	if err := s.validate(); err != nil {
		return err
	}
	return validateUpstreams(p.Upstreams)
}

// Cleanup lets go of the shared state. Requests of the old config may still be streaming; the
// state lives on while any policy holds it.
func (p *KVCacheAware) Cleanup() error {
	if p.state == nil {
		return nil
	}
	p.state.unregister(p.reg)
	_, err := states.Delete(stateKey)
	if err != nil {
		return fmt.Errorf("kvroute: releasing the shared state: %w", err)
	}
	return nil
}

// Interface guards.
var (
	_ reverseproxy.Selector = (*KVCacheAware)(nil)
	_ caddy.Provisioner     = (*KVCacheAware)(nil)
	_ caddy.Validator       = (*KVCacheAware)(nil)
	_ caddy.CleanerUpper    = (*KVCacheAware)(nil)
)
