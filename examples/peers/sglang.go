package peers

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(new(SGLangCacheAware))
}

// Defaults of SGLang's router as launched (python -m sglang_router.launch_router; RouterArgs in
// sgl-model-gateway/bindings/python/src/sglang_router/router_args.py): cache_threshold 0.3,
// balance_abs_threshold 64, balance_rel_threshold 1.5, eviction_interval_secs 60,
// max_tree_size 2**26. The Rust CLI (sgl-model-gateway/src/main.rs) has the same values but an
// eviction interval of 120 s. CacheAwareConfig::default() in src/policies/mod.rs (0.5, 32, 1.1,
// 30 s, 10000) only serves policies built without a config, as in SGLang's unit tests.
const (
	sglCacheThreshold      = 0.3
	sglBalanceAbsThreshold = 64
	sglBalanceRelThreshold = 1.5
	sglEvictionInterval    = 60 * time.Second
	sglMaxTreeSize         = 1 << 26
)

// sglUnknownModel is the tree of requests that name no model (SGLang's UNKNOWN_MODEL_ID).
const sglUnknownModel = "unknown"

// sglMaxTrees bounds the trees a client can make by naming models; requests naming further
// models share the unknown-model tree. SGLang keys trees by the workers' models, which the
// operator sets; here the model comes from the request.
const sglMaxTrees = 64

// SGLangCacheAware is SGLang router's cache_aware policy (sgl-model-gateway
// src/policies/cache_aware.rs, select_worker), for benchmarks only. Per request:
//
//  1. over all upstreams, min and max of the requests in flight (as this policy counts them);
//     when max-min > balance_abs_threshold and max > min × balance_rel_threshold, the load is
//     imbalanced: route to the available upstream with the fewest in flight (the first in pool
//     order on ties), still recording the text under it;
//  2. otherwise match the text against the model's tree; when matched/total chars >
//     cache_threshold, route to the tenant of the deepest matched node if it is available (if
//     not, forget that tenant and take the first available upstream, recording nothing);
//  3. else route to the available upstream with the fewest in flight (first on ties);
//  4. record the text under the chosen upstream.
//
// Every eviction_interval, each model's tree evicts its least recently used leaves until every
// tenant holds at most max_tree_size chars.
//
// The first-on-ties rule is SGLang's (Rust's min_by_key keeps the first minimum); with an idle
// fleet and cold prompts, it sends everything to the first upstream.
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

	cacheThreshold float32 // SGLang compares in f32
	absThreshold   int
	relThreshold   float32

	mu    sync.Mutex
	trees map[string]*sglTree

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
		p.CacheThreshold = ptr(float64(sglCacheThreshold))
	}
	if p.BalanceAbsThreshold == nil {
		p.BalanceAbsThreshold = ptr(sglBalanceAbsThreshold)
	}
	if p.BalanceRelThreshold == nil {
		p.BalanceRelThreshold = ptr(sglBalanceRelThreshold)
	}
	if p.EvictionInterval == nil {
		p.EvictionInterval = ptr(caddy.Duration(sglEvictionInterval))
	}
	if p.MaxTreeSize == nil {
		p.MaxTreeSize = ptr(sglMaxTreeSize)
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
	p.cacheThreshold = float32(*p.CacheThreshold)
	p.absThreshold = *p.BalanceAbsThreshold
	p.relThreshold = float32(*p.BalanceRelThreshold)
	p.trees = make(map[string]*sglTree)
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

func (p *SGLangCacheAware) evict() {
	p.mu.Lock()
	trees := make([]*sglTree, 0, len(p.trees))
	for _, t := range p.trees {
		trees = append(trees, t)
	}
	p.mu.Unlock()
	for _, t := range trees {
		t.evictTenantBySize(*p.MaxTreeSize)
	}
}

// tree returns the model's tree, creating it the first time with every upstream of pool as a
// tenant of the root, as SGLang's init_workers does.
func (p *SGLangCacheAware) tree(model string, pool reverseproxy.UpstreamPool) *sglTree {
	if model == "" {
		model = sglUnknownModel
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.trees[model]
	if t == nil && len(p.trees) >= sglMaxTrees {
		model = sglUnknownModel
		t = p.trees[model]
	}
	if t == nil {
		t = newSGLTree()
		for _, u := range pool {
			t.insert("", u.Dial)
		}
		p.trees[model] = t
	}
	return t
}

// Select picks an upstream as SGLang's CacheAwarePolicy::select_worker does.
func (p *SGLangCacheAware) Select(pool reverseproxy.UpstreamPool, r *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	var healthy []int
	for i, u := range pool {
		if p.available(u) {
			healthy = append(healthy, i)
		}
	}
	if len(healthy) == 0 {
		return nil
	}
	req := requestFor(r)
	text := req.Text
	tree := p.tree(req.Model, pool)
	loads := p.load.loads(pool)

	// Imbalance is judged over every upstream, available or not, as SGLang does.
	minLoad, maxLoad := loads[0], loads[0]
	for _, l := range loads[1:] {
		minLoad, maxLoad = min(minLoad, l), max(maxLoad, l)
	}
	if maxLoad-minLoad > p.absThreshold && float32(maxLoad) > float32(minLoad)*p.relThreshold {
		i := leastLoaded(healthy, loads)
		if text != "" {
			tree.insert(text, pool[i].Dial)
		}
		return p.load.acquire(r, req, pool[i])
	}

	m := tree.prefixMatch(text)
	var rate float32
	if m.input > 0 {
		rate = float32(m.matched) / float32(m.input)
	}
	chosen := -1
	if rate > p.cacheThreshold {
		for i, u := range pool {
			if u.Dial == m.tenant {
				if p.available(u) {
					chosen = i
				}
				break
			}
		}
	} else {
		chosen = leastLoaded(healthy, loads)
	}
	if chosen >= 0 {
		tree.insert(text, pool[chosen].Dial)
		return p.load.acquire(r, req, pool[chosen])
	}

	// The matched upstream is gone or unavailable.
	tree.removeTenant(m.tenant)
	p.logger.Debug("removed stale upstream from the cache tree", zap.String("upstream", m.tenant))
	return p.load.acquire(r, req, pool[healthy[0]])
}

// leastLoaded returns the index in candidates with the fewest in flight, the first on ties.
func leastLoaded(candidates, loads []int) int {
	best := candidates[0]
	for _, i := range candidates[1:] {
		if loads[i] < loads[best] {
			best = i
		}
	}
	return best
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
