package peerrules

import "sync"

// Defaults of SGLang's router as launched (python -m sglang_router.launch_router; RouterArgs in
// sgl-model-gateway/bindings/python/src/sglang_router/router_args.py): cache_threshold 0.3,
// balance_abs_threshold 64, balance_rel_threshold 1.5, eviction_interval_secs 60,
// max_tree_size 2**26. The Rust CLI (sgl-model-gateway/src/main.rs) has the same values but an
// eviction interval of 120 s. CacheAwareConfig::default() in src/policies/mod.rs (0.5, 32, 1.1,
// 30 s, 10000) only serves policies built without a config, as in SGLang's unit tests.
const (
	DefaultCacheThreshold      = 0.3
	DefaultBalanceAbsThreshold = 64
	DefaultBalanceRelThreshold = 1.5
	DefaultMaxTreeSize         = 1 << 26
)

// UnknownModel is the tree of requests that name no model (SGLang's UNKNOWN_MODEL_ID).
const UnknownModel = "unknown"

// MaxTrees bounds the trees a client can make by naming models; requests naming further models
// share the unknown-model tree. SGLang keys trees by the workers' models, which the operator
// sets; here the model comes from the request.
const MaxTrees = 64

// CacheAware is SGLang router's cache_aware policy (sgl-model-gateway
// src/policies/cache_aware.rs, select_worker). Per request:
//
//  1. over all upstreams, min and max of the requests in flight (as the policy counts them);
//     when max-min > balance_abs_threshold and max > min × balance_rel_threshold, the load is
//     imbalanced: route to the available upstream with the fewest in flight (the first in pool
//     order on ties), still recording the text under it;
//  2. otherwise match the text against the model's tree; when matched/total chars >
//     cache_threshold, route to the tenant of the deepest matched node if it is available (if
//     not, forget that tenant and take the first available upstream, recording nothing);
//  3. else route to the available upstream with the fewest in flight (first on ties);
//  4. record the text under the chosen upstream.
//
// Evict, which SGLang runs every eviction_interval, makes each model's tree drop its least
// recently used leaves until every tenant holds at most MaxTreeSize chars.
//
// The first-on-ties rule is SGLang's (Rust's min_by_key keeps the first minimum); with an idle
// fleet and cold prompts, it sends everything to the first upstream.
//
// It is safe for concurrent use.
type CacheAware struct {
	CacheThreshold float32 // SGLang compares in f32
	AbsThreshold   int
	RelThreshold   float32
	MaxTreeSize    int

	mu    sync.Mutex
	trees map[string]*Tree
}

// NewCacheAware returns the policy with SGLang's defaults.
func NewCacheAware() *CacheAware {
	return &CacheAware{
		CacheThreshold: DefaultCacheThreshold,
		AbsThreshold:   DefaultBalanceAbsThreshold,
		RelThreshold:   DefaultBalanceRelThreshold,
		MaxTreeSize:    DefaultMaxTreeSize,
	}
}

// Tree returns the model's tree, creating it the first time with every id as a tenant of the
// root, as SGLang's init_workers does.
func (p *CacheAware) Tree(model string, ids []string) *Tree {
	if model == "" {
		model = UnknownModel
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.trees == nil {
		p.trees = make(map[string]*Tree)
	}
	t := p.trees[model]
	if t == nil && len(p.trees) >= MaxTrees {
		model = UnknownModel
		t = p.trees[model]
	}
	if t == nil {
		t = NewTree()
		for _, id := range ids {
			t.Insert("", id)
		}
		p.trees[model] = t
	}
	return t
}

// Trees returns how many trees the policy holds.
func (p *CacheAware) Trees() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.trees)
}

// Pick chooses among the upstreams ids (in pool order) for a request of model with routing
// text, given which are available and the requests in flight on each, and records the text
// under the choice. It returns the index chosen, or -1 when none is available, and the tenant
// it forgot when the matched upstream was unavailable ("" otherwise).
func (p *CacheAware) Pick(model, text string, ids []string, available []bool, loads []int) (chosen int, forgot string) {
	var healthy []int
	for i := range ids {
		if available[i] {
			healthy = append(healthy, i)
		}
	}
	if len(healthy) == 0 {
		return -1, ""
	}
	tree := p.Tree(model, ids)

	// Imbalance is judged over every upstream, available or not, as SGLang does.
	minLoad, maxLoad := loads[0], loads[0]
	for _, l := range loads[1:] {
		minLoad, maxLoad = min(minLoad, l), max(maxLoad, l)
	}
	if maxLoad-minLoad > p.AbsThreshold && float32(maxLoad) > float32(minLoad)*p.RelThreshold {
		i := LeastLoaded(healthy, loads)
		if text != "" {
			tree.Insert(text, ids[i])
		}
		return i, ""
	}

	m := tree.PrefixMatch(text)
	var rate float32
	if m.Input > 0 {
		rate = float32(m.Matched) / float32(m.Input)
	}
	chosen = -1
	if rate > p.CacheThreshold {
		for i, id := range ids {
			if id == m.Tenant {
				if available[i] {
					chosen = i
				}
				break
			}
		}
	} else {
		chosen = LeastLoaded(healthy, loads)
	}
	if chosen >= 0 {
		tree.Insert(text, ids[chosen])
		return chosen, ""
	}

	// The matched upstream is gone or unavailable.
	tree.RemoveTenant(m.Tenant)
	return healthy[0], m.Tenant
}

// Evict trims every model's tree to MaxTreeSize chars per tenant.
func (p *CacheAware) Evict() {
	p.mu.Lock()
	trees := make([]*Tree, 0, len(p.trees))
	for _, t := range p.trees {
		trees = append(trees, t)
	}
	p.mu.Unlock()
	for _, t := range trees {
		t.EvictTenantBySize(p.MaxTreeSize)
	}
}

// LeastLoaded returns the index in candidates with the fewest in flight, the first on ties.
func LeastLoaded(candidates, loads []int) int {
	best := candidates[0]
	for _, i := range candidates[1:] {
		if loads[i] < loads[best] {
			best = i
		}
	}
	return best
}
