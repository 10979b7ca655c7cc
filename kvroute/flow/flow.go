// Package flow is kvroute's router-side queue: the requests that wait at the router while
// every engine that could serve them is full (late binding), and, with flow control, the order
// in which they go when capacity frees: priority bands, then fair shares between tenants by
// tokens served (the Virtual Token Counter of Sheng et al., OSDI 2024), then arrival order.
//
// A tenant's tokens served are two figures. Settled: what the answers of its requests showed
// they used (or, for a request whose answer told nothing, its estimate once it ended); it only
// grows. Pending: the estimates of its requests in flight (Charge), each replaced by what its
// answer shows (Settle). The order counts both, so that a tenant's requests in flight weigh as
// they do in VTC, where input is charged at admission and output as it is generated. A tenant
// that starts waiting is lifted to the settled figures of the others, never to their pending
// ones: an estimate that the answer corrects down (a declared max_tokens, an output shorter
// than expected) would otherwise stay in every tenant lifted to it meanwhile, and buy the
// tenant that declared it precedence until it has been served all it declared. The pending
// output is charged at an estimate (Estimate), never at the declared max_tokens when larger.
//
// It is pure (stdlib only, no clock, no locks, no goroutines): kvroute's Select (in Caddy,
// under its own lock, on the wall clock) and the fleet simulator (on a virtual clock) run the
// same queue. Timeouts are the caller's: it removes a request that waited too long (Remove).
//
// Without flow control every request is in band 0 of tenant "": requests go in arrival order
// per model (a request whose model has no free capacity never holds up another model's).
// With it, Next serves the highest band with a request that can go; inside a band, the tenant
// with the fewest tokens served; inside a tenant, its earliest request that can go (order is
// kept per tenant, band and model).
package flow

import (
	"math"
	"slices"
)

// Config is a queue's settings.
type Config struct {
	// Bands is the number of priority bands, highest first (band 0); below 1: one band.
	Bands int
	// MaxQueued bounds the requests waiting, all flows together; MaxQueuedPerTenant each
	// tenant's (0: no bound).
	MaxQueued, MaxQueuedPerTenant int
	// MaxTenants bounds the tenants remembered (their tokens served): beyond it, the idle
	// tenants least recently seen are forgotten (DefaultMaxTenants when 0). A tenant that waits,
	// or has a request in flight, is never forgotten.
	MaxTenants int
}

// DefaultMaxTenants is the tenants a queue remembers when its Config gives no bound.
const DefaultMaxTenants = 10000

// Verdict is what Push did with a request.
type Verdict uint8

const (
	// Queued: the request waits.
	Queued Verdict = iota
	// Full: MaxQueued requests already wait.
	Full
	// TenantFull: MaxQueuedPerTenant requests of its tenant already wait.
	TenantFull
)

var verdictNames = [...]string{"queued", "queue_full", "tenant_full"}

func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "unknown"
}

// Item is one waiting request. The caller sets Model, Tenant, Band and Value before Push and
// reads them back from Next; the rest is the queue's.
type Item struct {
	Model  string
	Tenant string
	Band   int // clamped to the queue's bands
	Value  any // the caller's

	seq        uint64
	list       *fifo
	prev, next *Item
}

// Waiting reports whether it is in a queue.
func (it *Item) Waiting() bool { return it.list != nil }

// fifo is one flow's requests for one model, in arrival order.
type fifo struct {
	model      string
	tenant     *tenant
	band       int
	head, tail *Item
	n          int
}

// tenant is one fairness id's counters and its waiting requests.
type tenant struct {
	name string
	// settled is the tokens its answers showed used (never goes down); pending the estimates
	// of its requests in flight. It goes in the order of settled + pending.
	settled, pending float64
	flying           int    // its requests charged and not settled
	seen             uint64 // the queue's clock when it last pushed or was served
	queued           int    // requests waiting, all bands
	// flows are its non-empty fifos, per band.
	flows [][]*fifo
}

// Queue is the router-side queue. It is not safe for concurrent use: the caller locks.
type Queue struct {
	cfg     Config
	bands   int
	n       int
	perBand []int
	models  map[string]int // requests waiting per model
	tenants map[string]*tenant
	// backlogged are the tenants with requests waiting, per band.
	backlogged [][]*tenant
	seq        uint64  // arrival order
	clock      uint64  // ticks per Push and Serve (for forgetting idle tenants)
	high       float64 // the highest settled count seen: where a tenant arriving at an empty queue starts
}

// New returns an empty queue.
func New(cfg Config) *Queue {
	bands := max(cfg.Bands, 1)
	if cfg.MaxTenants <= 0 {
		cfg.MaxTenants = DefaultMaxTenants
	}
	return &Queue{
		cfg: cfg, bands: bands,
		perBand:    make([]int, bands),
		models:     map[string]int{},
		tenants:    map[string]*tenant{},
		backlogged: make([][]*tenant, bands),
	}
}

// Bands returns the queue's number of bands.
func (q *Queue) Bands() int { return q.bands }

// Len returns the requests waiting.
func (q *Queue) Len() int { return q.n }

// LenBand returns the requests waiting in band b.
func (q *Queue) LenBand(b int) int {
	if b < 0 || b >= q.bands {
		return 0
	}
	return q.perBand[b]
}

// LenModel returns the requests waiting for model.
func (q *Queue) LenModel(model string) int { return q.models[model] }

// LenTenant returns the requests of tenant name waiting.
func (q *Queue) LenTenant(name string) int {
	if t := q.tenants[name]; t != nil {
		return t.queued
	}
	return 0
}

// Push adds it at the end of its flow, unless a bound refuses it (its verdict says which).
// A tenant with nothing waiting banks no credit for the time it was idle: its settled count is
// lifted to the least settled count of the tenants waiting (or, when none waits, the highest
// seen), so that it competes from where the others stand, as the Virtual Token Counter does;
// their pending estimates are left out (see the package comment).
func (q *Queue) Push(it *Item) Verdict {
	if it.list != nil {
		panic("flow: Push of an item already waiting")
	}
	if q.cfg.MaxQueued > 0 && q.n >= q.cfg.MaxQueued {
		return Full
	}
	t := q.tenants[it.Tenant]
	if q.cfg.MaxQueuedPerTenant > 0 && t != nil && t.queued >= q.cfg.MaxQueuedPerTenant {
		return TenantFull
	}
	if t == nil {
		t = q.tenant(it.Tenant)
	}
	it.Band = min(max(it.Band, 0), q.bands-1)
	if t.queued == 0 {
		t.settled = max(t.settled, q.floor())
	}
	q.clock++
	t.seen = q.clock
	f := t.flow(it.Band, it.Model)
	if f == nil {
		f = &fifo{model: it.Model, tenant: t, band: it.Band}
		if len(t.flows[it.Band]) == 0 {
			q.backlogged[it.Band] = append(q.backlogged[it.Band], t)
		}
		t.flows[it.Band] = append(t.flows[it.Band], f)
	}
	q.seq++
	it.seq = q.seq
	it.list = f
	it.prev, it.next = f.tail, nil
	if f.tail != nil {
		f.tail.next = it
	} else {
		f.head = it
	}
	f.tail = it
	f.n++
	t.queued++
	q.n++
	q.perBand[it.Band]++
	q.models[it.Model]++
	return Queued
}

// floor is where a tenant that starts waiting starts: the least settled count of those
// waiting, or, when none waits, the highest settled count seen.
func (q *Queue) floor() float64 {
	lo, any := 0.0, false
	for b := range q.backlogged {
		for _, t := range q.backlogged[b] {
			if !any || t.settled < lo {
				lo, any = t.settled, true
			}
		}
	}
	if !any {
		return q.high
	}
	return lo
}

// Each calls fn for each request waiting, band by band, highest first.
func (q *Queue) Each(fn func(*Item)) {
	for b := range q.backlogged {
		for _, t := range q.backlogged[b] {
			for _, f := range t.flows[b] {
				for it := f.head; it != nil; it = it.next {
					fn(it)
				}
			}
		}
	}
}

// Remove takes it out of the queue (its client left, or it waited too long); false when it was
// not waiting.
func (q *Queue) Remove(it *Item) bool {
	f := it.list
	if f == nil {
		return false
	}
	if it.prev != nil {
		it.prev.next = it.next
	} else {
		f.head = it.next
	}
	if it.next != nil {
		it.next.prev = it.prev
	} else {
		f.tail = it.prev
	}
	it.prev, it.next, it.list = nil, nil, nil
	f.n--
	t := f.tenant
	t.queued--
	q.n--
	q.perBand[f.band]--
	if q.models[f.model]--; q.models[f.model] <= 0 {
		delete(q.models, f.model)
	}
	if f.n == 0 {
		flows := t.flows[f.band]
		t.flows[f.band] = slices.DeleteFunc(flows, func(g *fifo) bool { return g == f })
		if len(t.flows[f.band]) == 0 {
			q.backlogged[f.band] = slices.DeleteFunc(q.backlogged[f.band], func(u *tenant) bool { return u == t })
		}
	}
	return true
}

// Next removes and returns the request that goes first among those whose model ready says
// can go now (nil: none): the highest band with one; in it, the tenant with the fewest tokens
// served, settled and pending (ties: the earliest request); the tenant's earliest request that
// can go. ready may be called more than once for a model: it must answer the same each time.
func (q *Queue) Next(ready func(model string) bool) *Item {
	if q.n == 0 {
		return nil
	}
	for b := range q.bands {
		if q.perBand[b] == 0 {
			continue
		}
		var best *Item
		var bestServed float64
		for _, t := range q.backlogged[b] {
			served := t.served()
			if best != nil && served > bestServed {
				continue
			}
			var head *Item
			for _, f := range t.flows[b] {
				if (head == nil || f.head.seq < head.seq) && ready(f.model) {
					head = f.head
				}
			}
			if head == nil {
				continue
			}
			if best == nil || served < bestServed || head.seq < best.seq {
				best, bestServed = head, served
			}
		}
		if best != nil {
			q.Remove(best)
			return best
		}
	}
	return nil
}

// Estimate is what a request is charged while it is in flight: its prompt tokens plus weight
// × the output expected of it, expected (the mean output learned from the engines, else a
// configured default), or its max_tokens when smaller (an engine stops there). A max_tokens
// above the expectation is not the output's measure: clients send their context window, or
// 2,147,483,647, and an answer that shows what was used settles the charge anyway (Settle).
func Estimate(prompt float64, maxTokens int, expected, weight float64) float64 {
	out := expected
	if !(out > 0) || math.IsInf(out, 0) {
		out = 0
	}
	if maxTokens > 0 {
		out = min(out, float64(maxTokens))
	}
	return max(prompt, 0) + weight*out
}

// Charge counts a dispatched request's estimate (Estimate) in tenant name's pending tokens,
// until Settle replaces it. Requests that never waited count too.
func (q *Queue) Charge(name string, estimate float64) {
	if !(estimate > 0) || math.IsInf(estimate, 0) {
		return
	}
	t := q.touch(name)
	t.pending += estimate
	t.flying++
}

// Settle replaces a request's charge (what Charge counted of it) by used, the tokens its
// answer showed it used (its estimate again when the answer told nothing).
func (q *Queue) Settle(name string, charged, used float64) {
	t := q.touch(name)
	if charged > 0 && !math.IsInf(charged, 0) && t.flying > 0 {
		t.flying--
		t.pending = max(0, t.pending-charged)
		if t.flying == 0 {
			t.pending = 0 // no rounding left over
		}
	}
	q.settle(t, used)
}

// Serve counts tokens served to tenant name that no Charge counted: a cluster peer's (so that
// a tenant cannot get N times its share over N replicas). A figure below 0 counts nothing.
func (q *Queue) Serve(name string, tokens float64) {
	if !(tokens > 0) || math.IsInf(tokens, 0) {
		return
	}
	q.settle(q.touch(name), tokens)
}

func (q *Queue) settle(t *tenant, used float64) {
	if used > 0 && !math.IsInf(used, 0) {
		t.settled += used
		q.high = max(q.high, t.settled)
	}
}

// touch returns tenant name, remembered as seen now.
func (q *Queue) touch(name string) *tenant {
	t := q.tenants[name]
	if t == nil {
		t = q.tenant(name)
	}
	q.clock++
	t.seen = q.clock
	return t
}

// Served returns tenant name's tokens served: settled (its answers) and pending (its requests
// in flight).
func (q *Queue) Served(name string) (settled, pending float64) {
	if t := q.tenants[name]; t != nil {
		return t.settled, t.pending
	}
	return 0, 0
}

// Tenants calls fn for each tenant remembered: its name, tokens served (settled, pending) and
// requests waiting.
func (q *Queue) Tenants(fn func(name string, settled, pending float64, queued int)) {
	for name, t := range q.tenants {
		fn(name, t.settled, t.pending, t.queued)
	}
}

// served is what orders t among the tenants waiting.
func (t *tenant) served() float64 { return t.settled + t.pending }

// tenant returns a new tenant named name, forgetting idle ones first if the bound is reached.
func (q *Queue) tenant(name string) *tenant {
	if len(q.tenants) >= q.cfg.MaxTenants {
		q.forget()
	}
	t := &tenant{name: name, flows: make([][]*fifo, q.bands)}
	q.tenants[name] = t
	return t
}

// forget drops the idle tenants (nothing waiting, nothing in flight) least recently seen until
// a tenth of the bound is free (or no idle tenant is left): what they were served is
// forgotten, as an idle tenant's credit is.
func (q *Queue) forget() {
	idle := make([]*tenant, 0, len(q.tenants))
	for _, t := range q.tenants {
		if t.queued == 0 && t.flying == 0 {
			idle = append(idle, t)
		}
	}
	slices.SortFunc(idle, func(a, b *tenant) int {
		switch {
		case a.seen < b.seen:
			return -1
		case a.seen > b.seen:
			return 1
		}
		return 0
	})
	drop := len(q.tenants) - q.cfg.MaxTenants*9/10
	for _, t := range idle[:min(max(drop, 1), len(idle))] {
		delete(q.tenants, t.name)
	}
}

// flow returns t's fifo for model in band b, or nil.
func (t *tenant) flow(b int, model string) *fifo {
	for _, f := range t.flows[b] {
		if f.model == model {
			return f
		}
	}
	return nil
}
