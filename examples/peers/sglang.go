package peers

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/kvroute/caddy-kvroute/examples/peerrules"
)

func init() {
	caddy.RegisterModule(new(SGLangCacheAware))
}

// SGLang's eviction interval as launched (router_args.py's eviction_interval_secs; the Rust
// CLI's is 120 s). The other defaults are peerrules'.
const sglEvictionInterval = 60 * time.Second

// SGLangCacheAware is SGLang router's cache_aware policy (sgl-model-gateway
// src/policies/cache_aware.rs, select_worker), for benchmarks only: the rules are
// peerrules.CacheAware's, over the requests in flight as this policy counts them. Every
// eviction_interval, each model's tree evicts its least recently used leaves until every tenant
// holds at most max_tree_size chars.
type SGLangCacheAware struct {
	// Match ratio above which the request follows the cached prefix. Default: 0.3.
	CacheThreshold *float64 `json:"cache_threshold,omitempty"`
	// Imbalance needs max - min in-flight requests above this. Default: 64.
	BalanceAbsThreshold *int `json:"balance_abs_threshold,omitempty"`
	// Imbalance also needs max > min × this. Default: 1.5.
	BalanceRelThreshold *float64 `json:"balance_rel_threshold,omitempty"`
	// How often the trees are trimmed; 0 turns eviction off. Default: 60s.
	EvictionInterval *caddy.Duration `json:"eviction_interval,omitempty"`
	// Chars each upstream may hold in each model's tree. Default: 2^26.
	MaxTreeSize *int `json:"max_tree_size,omitempty"`

	rules *peerrules.CacheAware

	load      *inflight
	available func(*reverseproxy.Upstream) bool
	logger    *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (*SGLangCacheAware) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.sglang_cache_aware",
		New: func() caddy.Module { return new(SGLangCacheAware) },
	}
}

// Provision validates the options, fills in the defaults and starts the eviction loop, which
// stops when the config is unloaded.
func (p *SGLangCacheAware) Provision(ctx caddy.Context) error {
	p.logger = ctx.Logger()
	if err := p.setup(); err != nil {
		return err
	}
	if every := time.Duration(*p.EvictionInterval); every > 0 {
		go p.evictEvery(ctx, every)
	}
	return nil
}

func (p *SGLangCacheAware) setup() error {
	if p.CacheThreshold == nil {
		p.CacheThreshold = ptr(float64(peerrules.DefaultCacheThreshold))
	}
	if p.BalanceAbsThreshold == nil {
		p.BalanceAbsThreshold = ptr(peerrules.DefaultBalanceAbsThreshold)
	}
	if p.BalanceRelThreshold == nil {
		p.BalanceRelThreshold = ptr(float64(peerrules.DefaultBalanceRelThreshold))
	}
	if p.EvictionInterval == nil {
		p.EvictionInterval = ptr(caddy.Duration(sglEvictionInterval))
	}
	if p.MaxTreeSize == nil {
		p.MaxTreeSize = ptr(peerrules.DefaultMaxTreeSize)
	}
	switch {
	case !(*p.CacheThreshold >= 0 && *p.CacheThreshold <= 1):
		return fmt.Errorf("cache_threshold: %v is not in [0, 1]", *p.CacheThreshold)
	case *p.BalanceAbsThreshold < 0:
		return fmt.Errorf("balance_abs_threshold: %d is negative", *p.BalanceAbsThreshold)
	case !(*p.BalanceRelThreshold >= 0) || math.IsInf(*p.BalanceRelThreshold, 1):
		return fmt.Errorf("balance_rel_threshold: %v is not a finite number >= 0", *p.BalanceRelThreshold)
	case *p.EvictionInterval < 0:
		return fmt.Errorf("eviction_interval: %v is negative", time.Duration(*p.EvictionInterval))
	case *p.MaxTreeSize < 0:
		return fmt.Errorf("max_tree_size: %d is negative", *p.MaxTreeSize)
	}
	p.rules = &peerrules.CacheAware{
		CacheThreshold: float32(*p.CacheThreshold),
		AbsThreshold:   *p.BalanceAbsThreshold,
		RelThreshold:   float32(*p.BalanceRelThreshold),
		MaxTreeSize:    *p.MaxTreeSize,
	}
	p.load = newInflight()
	if p.available == nil {
		p.available = (*reverseproxy.Upstream).Available
	}
	if p.logger == nil {
		p.logger = zap.NewNop()
	}
	return nil
}

func (p *SGLangCacheAware) evictEvery(ctx caddy.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			p.evict()
		}
	}
}

func (p *SGLangCacheAware) evict() { p.rules.Evict() }

// tree returns the model's tree (peerrules.CacheAware.Tree) for pool.
func (p *SGLangCacheAware) tree(model string, pool reverseproxy.UpstreamPool) *peerrules.Tree {
	return p.rules.Tree(model, dials(pool))
}

func dials(pool reverseproxy.UpstreamPool) []string {
	ids := make([]string, len(pool))
	for i, u := range pool {
		ids[i] = u.Dial
	}
	return ids
}

// Select picks an upstream as SGLang's CacheAwarePolicy::select_worker does.
func (p *SGLangCacheAware) Select(pool reverseproxy.UpstreamPool, r *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	available := make([]bool, len(pool))
	any := false
	for i, u := range pool {
		available[i] = p.available(u)
		any = any || available[i]
	}
	if !any {
		return nil
	}
	req := requestFor(r)
	i, forgot := p.rules.Pick(req.Model, req.Text, dials(pool), available, p.load.loads(pool))
	if forgot != "" {
		p.logger.Debug("removed stale upstream from the cache tree", zap.String("upstream", forgot))
	}
	return p.load.acquire(r, req, pool[i])
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy sglang_cache_aware {
//		cache_threshold       0.3
//		balance_abs_threshold 64
//		balance_rel_threshold 1.5
//		eviction_interval     60s    # 0 turns eviction off
//		max_tree_size         64Mi   # chars per upstream per model (k, M, Ki, Mi... suffixes)
//	}
func (p *SGLangCacheAware) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // policy name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		opt := d.Val()
		if !d.NextArg() {
			return d.ArgErr()
		}
		val := d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
		switch opt {
		case "cache_threshold":
			f, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return d.Errf("cache_threshold: %v", err)
			}
			p.CacheThreshold = &f
		case "balance_abs_threshold":
			n, err := strconv.Atoi(val)
			if err != nil {
				return d.Errf("balance_abs_threshold: %v", err)
			}
			p.BalanceAbsThreshold = &n
		case "balance_rel_threshold":
			f, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return d.Errf("balance_rel_threshold: %v", err)
			}
			p.BalanceRelThreshold = &f
		case "eviction_interval":
			dur, err := caddy.ParseDuration(val)
			if err != nil {
				return d.Errf("eviction_interval: %v", err)
			}
			p.EvictionInterval = ptr(caddy.Duration(dur))
		case "max_tree_size":
			n, err := parseSize(val)
			if err != nil {
				return d.Errf("max_tree_size: %v", err)
			}
			p.MaxTreeSize = &n
		default:
			return d.Errf("unrecognized sglang_cache_aware option %q", opt)
		}
	}
	return nil
}

// parseSize reads a count with an optional SI (k, M, G) or binary (Ki, Mi, Gi) suffix.
func parseSize(s string) (int, error) {
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return 0, err
	}
	if n > 1<<40 {
		return 0, fmt.Errorf("%s is too large", s)
	}
	return int(n), nil
}

func ptr[T any](v T) *T { return &v }

// Interface guards
var (
	_ reverseproxy.Selector = (*SGLangCacheAware)(nil)
	_ caddy.Provisioner     = (*SGLangCacheAware)(nil)
	_ caddyfile.Unmarshaler = (*SGLangCacheAware)(nil)
)
