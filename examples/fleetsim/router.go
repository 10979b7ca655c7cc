package fleetsim

import (
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
	"github.com/kvroute/caddy-kvroute/examples/peerrules"
	"github.com/kvroute/caddy-kvroute/kvroute/decide"
)

// Route's answers other than an engine's index.
const (
	// Wait keeps the request at the router; it is offered again, in arrival order with the
	// others waiting, each time a request ends.
	Wait = -1
	// Shed refuses the request (a 429): it counts in shed_rps and is never served.
	Shed = -2
)

// EngineInfo is what a router is told about an engine when the run starts: what an operator
// writes in a Caddyfile.
type EngineInfo struct {
	ID    string // a stable address, "engine-0"...
	Model string // the base model it serves (adapters are served by every engine)
}

// Usage is what an answer tells about its request: usage.prompt_tokens and
// usage.prompt_tokens_details.cached_tokens, the completion tokens, and when its first token
// came (its first content byte).
type Usage struct {
	PromptTokens     int
	CachedTokens     int
	CompletionTokens int
	FirstToken       time.Duration
	Aborted          bool // the engine dropped the request (an error answer): no usage
}

// Router is a routing policy under test. The simulator calls it on the virtual clock, from one
// goroutine: Start once, then Route at each request's arrival (and again while it answers
// Wait), Reading for every engine every telemetry interval, FirstToken and Done as answers
// come. A router keeps its own counts of requests in flight, as a Caddy policy must (Done is
// called exactly once for every request it routed), and its own trees: it sees prompts only as
// Request.Text, Request.Model and Request.Session, never the true tokens or the engines' caches.
type Router interface {
	Start(engines []EngineInfo)
	Route(now time.Duration, req *Request) int
	Reading(now time.Duration, engine int, r engine.Reading)
	FirstToken(now time.Duration, req *Request, engine int)
	Done(now time.Duration, req *Request, engine int, u Usage)
}

// Omniscient routers are given the engines themselves (the oracle).
type Omniscient interface {
	See(engines []*engine.Engine)
}

// Policy makes a fresh router for one run; seed is the run's seed, for routers that draw.
type Policy struct {
	Name string
	New  func(seed uint64) Router
}

// Policies are the routers of the scorecard, in its order: kvroute's decisions (KVPolicies,
// kv_cache_aware running kvroute's default decision), then the baselines.
var Policies = PoliciesWith(decide.DefaultRule)

// PoliciesWith is Policies with kv_cache_aware running decision def.
func PoliciesWith(def decide.Rule) []Policy {
	return append(KVPolicies(def), Baselines...)
}

// Baselines are the built-in routers other than kvroute's.
var Baselines = []Policy{
	{"sglang", func(uint64) Router { return &sglangRouter{rules: peerrules.NewCacheAware()} }},
	{"least_conn", func(seed uint64) Router { return &leastConn{rng: newRNG(seed, "least_conn")} }},
	{"round_robin", func(uint64) Router { return &roundRobin{} }},
	{"prefix_hash", func(uint64) Router { return &prefixHash{} }},
	{"oracle", func(uint64) Router { return &oracle{} }},
}

// inflight is a router's own count of its requests in flight per engine.
type inflight struct {
	ids []string
	n   []int
}

func (f *inflight) Start(engines []EngineInfo) {
	f.ids = make([]string, len(engines))
	for i, e := range engines {
		f.ids[i] = e.ID
	}
	f.n = make([]int, len(engines))
}

func (f *inflight) Reading(time.Duration, int, engine.Reading)       {}
func (f *inflight) FirstToken(time.Duration, *Request, int)          {}
func (f *inflight) Done(_ time.Duration, _ *Request, i int, _ Usage) { f.n[i]-- }

func (f *inflight) pick(i int) int {
	f.n[i]++
	return i
}

// roundRobin sends each request to the next engine in turn.
type roundRobin struct {
	inflight
	next int
}

func (r *roundRobin) Route(time.Duration, *Request) int {
	i := r.next % len(r.n)
	r.next++
	return r.pick(i)
}

// leastConn is Caddy's least_conn: the fewest requests in flight, ties broken at random.
type leastConn struct {
	inflight
	rng *rng
}

func (l *leastConn) Route(time.Duration, *Request) int {
	best, ties := -1, 0
	for i, n := range l.n {
		switch {
		case best < 0 || n < l.n[best]:
			best, ties = i, 1
		case n == l.n[best]:
			ties++
			if l.rng.intn(ties) == 0 {
				best = i
			}
		}
	}
	return l.pick(best)
}

// prefixHash is the bounded-load prefix hash (peerrules), with FNV-1a.
type prefixHash struct {
	inflight
	loads []int
}

func (p *prefixHash) Route(_ time.Duration, req *Request) int {
	order := peerrules.Rendezvous(p.ids, peerrules.FNV1a(peerrules.PrefixChars(req.Text, peerrules.DefaultPrefixChars)), peerrules.FNV1a)
	p.loads = p.loads[:0]
	for _, i := range order {
		p.loads = append(p.loads, p.n[i])
	}
	return p.pick(order[peerrules.BoundedLoad(p.loads, peerrules.DefaultLoadFactor)])
}

// sglangRouter is SGLang's cache_aware (peerrules.CacheAware) with its defaults, its trees
// evicted every 60 s of virtual time as sglang_router's launcher does.
type sglangRouter struct {
	inflight
	rules     *peerrules.CacheAware
	available []bool
	lastEvict time.Duration
}

const sglangEvictionInterval = 60 * time.Second

func (s *sglangRouter) Route(now time.Duration, req *Request) int {
	if now-s.lastEvict >= sglangEvictionInterval {
		s.rules.Evict()
		s.lastEvict = now
	}
	if s.available == nil {
		s.available = make([]bool, len(s.ids))
		for i := range s.available {
			s.available[i] = true
		}
	}
	i, _ := s.rules.Pick(req.Model, req.Text, s.ids, s.available, s.n)
	return s.pick(i)
}

// oracle is the greedy oracle: it sees every engine's true cache and queue and sends each
// request where its true time to first token is lowest (engine.PredictTTFT: the engine's
// scheduler run forward on a copy of its queue, with the request appended and its cached
// prefix read from the engine's real cache; ties to the lowest index). Greedy: it does not
// weigh what its choice costs the requests that come after, nor keep room for them, so a
// router that plans ahead can beat it; and the forward run leaves out evictions and sharing
// while the request waits (see PredictTTFT).
type oracle struct {
	inflight
	engines []*engine.Engine
	er      engine.Request
}

func (o *oracle) See(engines []*engine.Engine) { o.engines = engines }

func (o *oracle) Route(now time.Duration, req *Request) int {
	o.er = engine.Request{Tokens: req.Tokens, Hashes: req.hashes, Output: req.Output, Adapter: req.Adapter}
	best, bestT := 0, time.Duration(-1)
	for i, e := range o.engines {
		if t := e.PredictTTFT(&o.er, now); bestT < 0 || t < bestT {
			best, bestT = i, t
		}
	}
	return o.pick(best)
}
