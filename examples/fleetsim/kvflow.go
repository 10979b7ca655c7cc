package fleetsim

import (
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/decide"
	"github.com/kvroute/caddy-kvroute/kvroute/flow"
)

// kv_flow is kv_cache_aware with flow control (issue 35): kvroute's decision behind the
// router-side queue of package kvroute/flow, the one kvroute's Select runs in Caddy, with the
// flow_control block of the example:
//
//	flow_control {
//		tenant   {http.request.header.X-Tenant}     # Request.Tenant
//		priority {http.request.header.X-Priority}   # Request.Priority
//		band interactive { queue_timeout 10s }
//		band batch       { queue_timeout 5m }
//		max_queued 10000
//	}
//
// A request waits only while every engine is saturated: its requests in flight (the router's
// count, plus the external load its readings show) reach the batch slots learned from its
// readings (decide.Slots; an engine whose slots are not learned yet is never saturated: the
// simulator has no max_concurrency). A request that arrives while an engine is free and none
// of its model waits goes at once. When capacity frees (a request ends, a reading changes
// what is learned), the queue's Next picks who goes (the highest band; in it, the tenant with
// the fewest tokens served; its earliest request) and that request is routed by kvroute's
// decision at that moment, among the engines that are not saturated. A request that waits
// past its band's queue timeout is shed (a 429), and so is one that finds max_queued waiting.
// Tokens served are charged to the tenant at dispatch, the router's estimate of the prompt
// tokens plus kvFlowOutputWeight × max_tokens, and corrected when the answer's usage comes
// (prompt tokens plus the weight × completion tokens).
type kvFlow struct {
	*kvRouter
	q     *flow.Queue
	bands []flowBand
	// held are the requests waiting, per band in arrival order: a band's timeout is the same
	// for all, so its first request still waiting is its next to time out.
	held    [][]*flowHeld
	charged map[int]float64 // tokens charged per request in flight
	leave   []bool          // per engine: saturated, left out of the decision
	now     time.Duration
	// slack is how many requests an engine may hold beyond its learned slots before it counts
	// as saturated, and spread how many more a request dispatched may go to
	// (the decision then chooses among the engines below slots + slack + spread, not only
	// those with a free slot): both 0 in kv_flow, as issue 35 has it; docs/simulator.md
	// shows what other values change (experiments, not a policy of the card).
	slack, spread int64
}

// flowBand is one band of flow_control: the priority that names it and its queue timeout.
type flowBand struct {
	name    string
	timeout time.Duration
}

// kv_flow's flow_control (the example).
var kvFlowBands = []flowBand{{"interactive", 10 * time.Second}, {"batch", 5 * time.Minute}}

const (
	kvFlowMaxQueued = 10000
	// kvFlowOutputWeight is what an output token counts in tokens served against a prompt
	// token's 1 (the Virtual Token Counter's weights, Sheng et al., OSDI 2024: 1 and 2).
	kvFlowOutputWeight = 2
)

type flowHeld struct {
	it       flow.Item
	req      *Request
	deadline time.Duration
}

func newKVFlow(k *kvRouter) *kvFlow {
	return &kvFlow{kvRouter: k, bands: kvFlowBands, charged: map[int]float64{},
		q: flow.New(flow.Config{Bands: len(kvFlowBands), MaxQueued: kvFlowMaxQueued})}
}

func (f *kvFlow) Start(engines []EngineInfo) {
	f.kvRouter.Start(engines)
	f.held = make([][]*flowHeld, len(f.bands))
	f.leave = make([]bool, len(engines))
}

// band is the band a priority names: the first for none or an unknown name.
func (f *kvFlow) band(priority string) int {
	for i, b := range f.bands {
		if b.name == priority {
			return i
		}
	}
	return 0
}

// saturated reports whether engine i's requests in flight reach its learned batch slots
// (plus the slack).
func (f *kvFlow) saturated(i int) bool { return f.full(i, f.slack) }

// full reports whether engine i's requests in flight reach its learned slots plus extra.
func (f *kvFlow) full(i int, extra int64) bool {
	u := &f.up[i]
	return u.slotCount > 0 && u.inFlight+u.externalLoad(int64(f.now)) >= u.slotCount+extra
}

// ready reports whether an engine can take a request of model now (every engine serves every
// model in the simulator).
func (f *kvFlow) ready(string) bool {
	for i := range f.up {
		if !f.saturated(i) {
			return true
		}
	}
	return false
}

func (f *kvFlow) Route(now time.Duration, req *Request) int {
	f.now = now
	if f.q.LenModel(req.Model) == 0 && f.ready(req.Model) {
		return f.dispatch(now, req)
	}
	b := f.band(req.Priority)
	h := &flowHeld{req: req, deadline: now + f.bands[b].timeout}
	h.it = flow.Item{Model: req.Model, Tenant: req.Tenant, Band: b, Value: h}
	if f.q.Push(&h.it) != flow.Queued {
		return Shed
	}
	f.held[b] = append(f.held[b], h)
	return Wait
}

// dispatch routes req by kvroute's decision among the engines not saturated (with spread:
// not full beyond it), and charges its tenant.
func (f *kvFlow) dispatch(now time.Duration, req *Request) int {
	for i := range f.leave {
		f.leave[i] = f.full(i, f.slack+f.spread)
	}
	f.kvRouter.leave = f.leave
	i := f.kvRouter.Route(now, req)
	f.kvRouter.leave = nil
	tokens := float64(f.tokensOf(req.Model, int64(req.Chars))) + kvFlowOutputWeight*float64(req.Output)
	f.q.Serve(req.Tenant, tokens)
	f.charged[req.ID] = tokens
	return i
}

// Release sheds the first request past its band's timeout, else dispatches the request the
// queue picks among those an engine can take now; nil when neither.
func (f *kvFlow) Release(now time.Duration) (*Request, int) {
	f.now = now
	if f.q.Len() == 0 {
		return nil, 0
	}
	for b := range f.held {
		if h := f.head(b); h != nil && h.deadline <= now {
			f.q.Remove(&h.it)
			f.held[b] = f.held[b][1:]
			return h.req, Shed
		}
	}
	it := f.q.Next(f.ready)
	if it == nil {
		return nil, 0
	}
	h := it.Value.(*flowHeld)
	return h.req, f.dispatch(now, h.req)
}

// head is band b's first request still waiting (those dispatched are dropped), or nil.
func (f *kvFlow) head(b int) *flowHeld {
	for len(f.held[b]) > 0 {
		if h := f.held[b][0]; h.it.Waiting() {
			return h
		}
		f.held[b][0] = nil
		f.held[b] = f.held[b][1:]
	}
	return nil
}

// Wake is the earliest queue timeout of the requests waiting (0: none waits).
func (f *kvFlow) Wake() time.Duration {
	var at time.Duration
	for b := range f.held {
		if h := f.head(b); h != nil && (at == 0 || h.deadline < at) {
			at = h.deadline
		}
	}
	return at
}

func (f *kvFlow) Done(now time.Duration, req *Request, i int, u Usage) {
	f.kvRouter.Done(now, req, i, u)
	charged, ok := f.charged[req.ID]
	if !ok {
		return
	}
	delete(f.charged, req.ID)
	if !u.Aborted {
		f.q.Serve(req.Tenant, float64(u.PromptTokens)+kvFlowOutputWeight*float64(u.CompletionTokens)-charged)
	}
}

// FlowPolicy is kv_flow: kv_cache_aware (decision def) with flow control, drawing from the
// same stream as kv_cache_aware.
func FlowPolicy(def decide.Rule) Policy {
	return Policy{"kv_flow", func(seed uint64) Router { return newKVFlow(newKVRouter(def, "kv_"+RuleName(def), seed)) }}
}
