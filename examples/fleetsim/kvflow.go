package fleetsim

import (
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/decide"
	"github.com/kvroute/caddy-kvroute/kvroute/flow"
)

// kv_flow is kv_cache_aware with flow control (issue 35): kvroute's router with late binding
// (kvroute.go: admit, full, WakeAt) on the queue of package kvroute/flow, the one kvroute's
// Select runs in Caddy, with priority bands and tenants, configured as the example:
//
//	flow_control {
//		tenant   {http.request.header.X-Tenant}     # Request.Tenant
//		priority {http.request.header.X-Priority}   # Request.Priority
//		band interactive { queue_timeout 10s }
//		band batch       { queue_timeout 5m }
//		max_queued 10000
//	}
//
// A request waits only while every engine is full (kvRouter.full: its requests in flight, the
// router's count plus the external load its readings show, reach the batch slots learned
// from its readings while a reading stands; an engine whose slots are not learned is never
// full: the simulator has no max_concurrency). A request that arrives while an engine is free
// and none waits goes at once. When the simulator offers the waiting requests again (a
// request ends, a reading, a timeout), the queue's Next picks who goes (the highest band; in
// it, the tenant with the fewest tokens served; its earliest request) while an engine is
// free, and that request is routed by kvroute's decision at that moment among the engines
// that are not full. A request offered once it has waited its band's queue timeout is shed (a
// 429), and so is one that finds max_queued waiting. Tokens served are charged to the tenant
// as pending at dispatch, as kvroute's Select charges them (flow.Estimate: the router's
// estimate of the prompt tokens plus kvFlowOutputWeight × the chosen engine's mean output,
// else expected_tokens, at most max_tokens), and settled when the answer's usage comes
// (prompt tokens plus the weight × completion tokens; an aborted request at its charge).
type flowControl struct {
	bands     []flowBand
	maxQueued int
	charged   map[int]float64 // tokens charged per request in flight
	// pick is the request Next chose, taken out of the queue: the simulator offers the
	// waiting requests in arrival order, and the others wait until it is offered.
	pick *flow.Item
	// spread lets a request go to an engine up to spread requests beyond full, so that the
	// decision chooses among more than the engines with a free slot (an experiment: 0 in
	// kv_flow; docs/simulator.md).
	spread int64
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

// admitted is admitFlow's answer for a request that goes to an engine now.
const admitted = 0

// band is the band a priority names: the first for none, the last for an unknown name (as
// kvroute's flow_control: a misspelled or forged priority never outranks a named band).
func (f *flowControl) band(priority string) int {
	if priority == "" {
		return 0
	}
	for i, b := range f.bands {
		if b.name == priority {
			return i
		}
	}
	return len(f.bands) - 1
}

// anyFree reports whether an engine has a free slot as the router knows it (every engine
// serves every model in the simulator).
func (k *kvRouter) anyFree(at int64) bool {
	for i := range k.up {
		if !k.full(i, at) {
			return true
		}
	}
	return false
}

// admitFlow is late binding with flow control: admitted (req goes now, to an engine with a
// free slot), Wait (it waits in the queue) or Shed (its band's timeout passed, or the queue
// is full).
func (k *kvRouter) admitFlow(now time.Duration, req *Request) int {
	f := k.fc
	at := int64(now)
	it := k.items[req.ID]
	if it == nil {
		if f.pick == nil && k.queue.LenModel(req.Model) == 0 && k.anyFree(at) {
			return admitted
		}
		it = &flow.Item{Model: req.Model, Tenant: req.Tenant, Band: f.band(req.Priority), Value: req.ID}
		if k.queue.Push(it) != flow.Queued {
			return Shed
		}
		k.items[req.ID] = it
		k.held = true
		return Wait
	}
	if now-req.Arrival >= f.bands[it.Band].timeout {
		k.queue.Remove(it)
		if f.pick == it {
			f.pick = nil
		}
		delete(k.items, req.ID)
		return Shed
	}
	if f.pick == nil && k.anyFree(at) {
		f.pick = k.queue.Next(func(string) bool { return true })
	}
	if f.pick != it {
		return Wait
	}
	f.pick = nil
	delete(k.items, req.ID)
	return admitted
}

// charge counts req's estimated tokens in its tenant's pending ones at dispatch; expected is
// the output expected of it (the chosen engine's mean output, else expected_tokens).
func (f *flowControl) charge(q *flow.Queue, req *Request, promptEstimate int64, expected float64) {
	tokens := flow.Estimate(float64(promptEstimate), req.Output, expected, kvFlowOutputWeight)
	q.Charge(req.Tenant, tokens)
	f.charged[req.ID] = tokens
}

// correct settles req's charge at what its answer's usage says (an aborted request at its
// estimate: there is no usage to settle it with).
func (f *flowControl) correct(q *flow.Queue, req *Request, u Usage) {
	charged, ok := f.charged[req.ID]
	if !ok {
		return
	}
	delete(f.charged, req.ID)
	used := charged
	if !u.Aborted {
		used = float64(u.PromptTokens) + kvFlowOutputWeight*float64(u.CompletionTokens)
	}
	q.Settle(req.Tenant, charged, used)
}

// FlowPolicy is kv_flow: kv_cache_aware (decision def) with flow control, drawing from the
// same stream as kv_cache_aware; tune as in KVPolicies (an experiment: its HoldMargin and
// FlowSpread count here, its QueueTimeout does not: the bands' timeouts do).
func FlowPolicy(def decide.Rule, tune ...func(*KVSettings)) Policy {
	return Policy{"kv_flow", func(seed uint64) Router {
		k := newKVRouter(def, "kv_"+RuleName(def), seed)
		k.tune(tune...)
		var st KVSettings
		for _, t := range tune {
			t(&st)
		}
		k.fc = &flowControl{bands: kvFlowBands, maxQueued: kvFlowMaxQueued, spread: st.FlowSpread}
		return k
	}}
}
