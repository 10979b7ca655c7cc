package kvroute

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
	"github.com/kvroute/caddy-kvroute/kvroute/decide"
	"github.com/kvroute/caddy-kvroute/kvroute/flow"
	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
)

// When the fleet is full (docs/design.md "When the fleet is full"): a request whose every
// candidate's batch slots are busy waits at the router, in the process's one queue
// (kvroute/flow, kept in the shared state so that it survives reloads), until a slot frees;
// it is then decided against the state of that moment. The queue's dispatcher hands each
// freed slot to the request that goes first (flow.Queue.Next) and reserves it (the upstream's
// reserved count) until that request's decision counts it, so that no new arrival takes it.
//
// Lock order: state.deciding, then waitQueue.mu, then state.mu (state.successor, for a group
// whose policy a reload retired). A waiter never holds any of them while it waits.

// maxBands bounds flow_control's bands: the process's queue has this many, whatever each
// policy names.
const maxBands = 16

// queuePoll is how often the dispatcher looks again while requests wait, beside the wake-ups
// (a request's end, a new reading, a reload): loads that age out (an engine's external load,
// a peer's count) free slots without telling it.
const queuePoll = 100 * time.Millisecond

// maxQueuedAlone bounds the requests waiting without flow_control (a variable: tests lower it).
var maxQueuedAlone = DefaultMaxQueued

// retryAfter is the Retry-After of a shed request, in seconds: slots free in seconds in a
// busy fleet, and clients back off on their own beyond it.
const retryAfter = "1"

// Queue states of a request (llmRequest.queued).
const (
	notQueued  uint8 = iota
	dispatched       // it waited and was handed a slot
	overdue          // it waited past queue_timeout without flow_control: it goes on as today
)

// waitQueue is the process's router-side queue.
type waitQueue struct {
	mu     sync.Mutex
	q      *flow.Queue
	groups map[string]*waitGroup // per flow.Item.Model: a model's waiting requests in one pool
	// held counts the requests waiting or handed a slot and not yet decided (read without mu
	// on every decision: 0 means no group can have waiters).
	held atomic.Int64
	// own is the tokens served per tenant by this replica's requests, all its life, as their
	// answers settled them (published to the cluster's peers: it never goes down, so a peer
	// adds what it grew by); peers what the peers' records added to the queue's counters so
	// far (under mu).
	own     map[string]float64
	peers   map[string]int64
	running bool          // the dispatcher goroutine runs (under mu)
	kick    chan struct{} // wakes the dispatcher
	stop    chan struct{} // closed when the state goes
	stopped bool
	memo    map[string]*upstreamState // dispatch's free slot per group (under mu)
}

// waitGroup is what the dispatcher needs to tell whether one group's requests can go: the
// pool and the policy of the latest request that joined it; once that policy is retired (a
// reload), the live policy that succeeds it and its pool (live).
type waitGroup struct {
	model string
	pool  reverseproxy.UpstreamPool
	p     *KVCacheAware
}

// live returns the policy and pool the group is judged by: its own while its policy lives,
// else its successor's (state.successor), so that a reload's new limits and upstreams count
// for the requests that wait, and removed upstreams are not looked at again.
func (grp *waitGroup) live() (*KVCacheAware, reverseproxy.UpstreamPool) {
	return liveFor(grp.p, grp.pool)
}

// liveFor returns p and pool while p lives, else the live policy that succeeds it and its
// static pool (pool when p's was dynamic or the successor has none).
func liveFor(p *KVCacheAware, pool reverseproxy.UpstreamPool) (*KVCacheAware, reverseproxy.UpstreamPool) {
	if p.reg == nil || !p.reg.retired.Load() {
		return p, pool
	}
	q := p.state.successor(p.reg)
	if q == nil {
		return p, pool
	}
	if len(p.reg.static) > 0 && len(q.pool) > 0 {
		pool = q.pool
	}
	return q.policy, pool
}

// waiter is one request waiting.
type waiter struct {
	item     flow.Item
	ready    chan struct{} // closed when it is handed a slot
	granted  bool          // under waitQueue.mu
	reserved *upstreamState
	band     string
}

func newWaitQueue() *waitQueue {
	return &waitQueue{
		q:      flow.New(flow.Config{Bands: maxBands}),
		groups: map[string]*waitGroup{},
		own:    map[string]float64{},
		peers:  map[string]int64{},
		kick:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
	}
}

// activeQueue is the process state's queue: a request's end (llmRequest.untrack) knows only
// its upstream, and wakes the dispatcher through it.
var activeQueue atomic.Pointer[waitQueue]

// capacityFreed wakes the dispatcher when requests wait: a request ended, a reading moved, a
// config was loaded. One atomic load when nothing waits.
func capacityFreed() {
	if wq := activeQueue.Load(); wq != nil && wq.held.Load() > 0 {
		select {
		case wq.kick <- struct{}{}:
		default:
		}
	}
}

// holding reports whether the router holds requests back (the slots learned from the engines
// are kept meanwhile: slots.go).
func (wq *waitQueue) holding() bool { return wq != nil && wq.held.Load() > 0 }

// full reports whether candidate c (the state's view u) has no free slot: its load and the
// slots reserved for requests about to be decided fill its capacity.
func full(c *decide.Candidate, u *upstreamState, now int64) bool {
	n := c.Capacity(now) // decide's: learned slots while fresh, else max_concurrency
	return n > 0 && c.Load+u.reserved.Load() >= n
}

// admit runs after gather, under state.deciding: it reports whether req must wait (every
// candidate full, or requests of its group wait already, or requests of another group that
// may use one of its free candidates: no overtaking). A request handed a slot leaves out the
// full candidates (unless all are), so that it takes a free one.
func (p *KVCacheAware) admit(g *gathered, pool reverseproxy.UpstreamPool, r *http.Request, req *llmRequest) bool {
	if p.opts.queueTimeout <= 0 && p.opts.flow == nil {
		return false
	}
	dc := g.snap.Candidates
	if req.queued != notQueued {
		if req.queued == dispatched {
			p.leaveFull(g, req)
		}
		return false
	}
	now := g.snap.Now
	for i := range dc {
		if !full(&dc[i], g.cands[i].st, now) {
			wq := p.state.wq
			if wq.held.Load() == 0 {
				return false
			}
			key := groupKey(req.Model, pool)
			wq.mu.Lock()
			waiting := wq.q.LenModel(key) > 0
			if !waiting {
				// A request that may not wait (its band's queue_timeout 0) is not held
				// back for the other groups: it would be shed while a slot is free.
				_, _, _, timeout := p.flowOf(r)
				waiting = timeout > 0 && wq.sharesFree(g, now)
			}
			wq.mu.Unlock()
			return waiting
		}
	}
	return true
}

// sharesFree reports whether a group with requests waiting (another model's, or another
// pool's) may use one of g's free candidates: the arrival then waits too, and the dispatcher
// orders them (bands, tenants, arrival), so that it does not take a freed slot ahead of them
// (under mu).
func (wq *waitQueue) sharesFree(g *gathered, now int64) bool {
	for key, grp := range wq.groups {
		if wq.q.LenModel(key) == 0 {
			continue
		}
		_, pool := grp.live()
		for i := range g.cands {
			if full(&g.snap.Candidates[i], g.cands[i].st, now) {
				continue
			}
			dial := g.cands[i].up.Dial
			if slices.ContainsFunc(pool, func(up *reverseproxy.Upstream) bool { return up != nil && up.Dial == dial }) {
				return true
			}
		}
	}
	return false
}

// leaveFull leaves out of g the full candidates, unless all are.
func (p *KVCacheAware) leaveFull(g *gathered, req *llmRequest) {
	dc, now := g.snap.Candidates, g.snap.Now
	n := 0
	for i := range dc {
		if !full(&dc[i], g.cands[i].st, now) {
			n++
		}
	}
	if n == 0 || n == len(dc) {
		return
	}
	k := 0
	for i := range dc {
		if full(&dc[i], g.cands[i].st, now) {
			continue
		}
		g.cands[k], dc[k] = g.cands[i], dc[i]
		dc[k].Key = k
		k++
	}
	g.cands, g.snap.Candidates = g.cands[:k], dc[:k]
	if g.sess.addr != "" && indexOf(g.cands, g.sess.addr) < 0 && !g.sess.keep {
		// Its session's upstream is full: the binding stays, this request goes elsewhere.
		p.skipSession(&g.sess, req)
	}
}

// groupKey names the group a request waits in: its model in its pool (arrival order is kept
// per model; two sites with pools of their own have queues of their own).
func groupKey(model string, pool reverseproxy.UpstreamPool) string {
	var b strings.Builder
	b.WriteString(model)
	for _, up := range pool {
		if up != nil {
			b.WriteByte(0)
			b.WriteString(up.Dial)
		}
	}
	return b.String()
}

// flowOf returns the request's band (index and name), its tenant and how long it may wait.
func (p *KVCacheAware) flowOf(r *http.Request) (band int, name, tenant string, timeout time.Duration) {
	f := p.opts.flow
	if f == nil {
		return 0, defaultBand, defaultTenant, p.opts.queueTimeout
	}
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	if f.tenant != "" {
		tenant = boundKey(repl.ReplaceAll(f.tenant, ""), maxTenantLen)
	}
	if tenant == "" {
		tenant = defaultTenant
	}
	band = 0
	if f.priority != "" {
		if v := repl.ReplaceAll(f.priority, ""); v != "" {
			band = len(f.bands) - 1 // a name no band has: the lowest band
			for i, b := range f.bands {
				if b.name == v {
					band = i
					break
				}
			}
		}
	}
	return band, f.bands[band].name, tenant, f.bands[band].timeout
}

// await makes req wait for a slot (state.deciding is not held). It returns true when the
// request goes on to be decided (handed a slot, or past queue_timeout without flow_control),
// false when it was shed (answered 429 on w) or its client left.
func (p *KVCacheAware) await(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter, req *llmRequest) bool {
	wq := p.state.wq
	band, bandName, tenant, timeout := p.flowOf(r)
	start := time.Now()
	wt := &waiter{band: bandName, ready: make(chan struct{})}
	wt.item = flow.Item{Model: groupKey(req.Model, pool), Tenant: tenant, Band: band, Value: wt}
	wq.mu.Lock()
	reason := ""
	switch f := p.opts.flow; {
	case f == nil && wq.q.Len() >= maxQueuedAlone:
		reason = flow.Full.String() // without flow_control: it goes on at once, as today
	case f != nil && wq.q.Len() >= f.maxQueued:
		reason = flow.Full.String()
	case f != nil && f.maxPerTenant > 0 && wq.q.LenTenant(tenant) >= f.maxPerTenant:
		reason = flow.TenantFull.String()
	case timeout <= 0:
		reason = "timeout"
	}
	if reason != "" {
		wq.mu.Unlock()
		if p.opts.flow == nil {
			req.queued = overdue // the queue is full: it goes on as if it had not waited
			return true
		}
		p.shed(w, r, req, bandName, reason)
		return false
	}
	wq.q.Push(&wt.item)
	wq.groups[wt.item.Model] = &waitGroup{model: req.Model, pool: pool, p: p}
	wq.held.Add(1)
	wq.start(p.state)
	wq.mu.Unlock()
	metrics.queueRequests.WithLabelValues(bandName).Inc()
	capacityFreed() // a slot may have freed between the decision's look and now

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var gone bool
	select {
	case <-wt.ready:
	case <-timer.C:
	case <-r.Context().Done():
		gone = true
	}
	wq.mu.Lock()
	if wq.q.Remove(&wt.item) {
		wq.held.Add(-1)
		wq.dropGroup(wt.item.Model)
	}
	granted := wt.granted
	wq.mu.Unlock()
	metrics.queueRequests.WithLabelValues(bandName).Dec()
	waited := time.Since(start)
	metrics.queueSeconds.WithLabelValues(bandName).Observe(waited.Seconds())
	req.waited = waited
	switch {
	case gone:
		if granted {
			wq.unreserve(wt)
		}
		return false
	case granted:
		req.queued, req.slot = dispatched, wt
		return true
	case p.opts.flow != nil:
		p.shed(w, r, req, bandName, "timeout")
		return false
	}
	req.queued = overdue
	return true
}

// shedReasons are the reasons of caddy_kvroute_shed_total.
var shedReasons = [...]string{"timeout", flow.Full.String(), flow.TenantFull.String()}

// exportQueueMetrics makes the queue's series of each band the policy configures exist from its
// config's start, at 0 until a request waits or is shed: an operator looking for them before
// the first wait finds them.
func (p *KVCacheAware) exportQueueMetrics() {
	f := p.opts.flow
	if f == nil {
		if p.opts.queueTimeout > 0 {
			metrics.queueRequests.WithLabelValues(defaultBand)
			metrics.queueSeconds.WithLabelValues(defaultBand)
		}
		return
	}
	for _, b := range f.bands {
		metrics.queueRequests.WithLabelValues(b.name)
		metrics.queueSeconds.WithLabelValues(b.name)
		for _, reason := range shedReasons {
			metrics.shed.WithLabelValues(b.name, reason)
		}
	}
}

// leftUpstream is what Select returns for a request whose client left while it waited: one of
// the pool's upstreams, which the request never reaches. Caddy's transport fails at once on the
// request's cancelled context, and reverse_proxy then records the client's 499 without counting
// a failure or retrying (its handling of context.Canceled), where no upstream would make it log
// a 503 "no upstreams available", an error of the fleet's. Nothing of the decision is recorded.
func leftUpstream(pool reverseproxy.UpstreamPool) *reverseproxy.Upstream {
	for _, up := range pool {
		if up != nil {
			return up
		}
	}
	return nil
}

// unreserve gives back the slot a waiter was handed (it is decided now, or its client left).
// It runs once per waiter handed a slot.
func (wq *waitQueue) unreserve(wt *waiter) {
	if wt.reserved != nil {
		wt.reserved.reserved.Add(-1)
		wt.reserved = nil
	}
	wq.held.Add(-1)
	capacityFreed()
}

// dropGroup forgets a group nobody waits in (under mu).
func (wq *waitQueue) dropGroup(key string) {
	if wq.q.LenModel(key) == 0 {
		delete(wq.groups, key)
	}
}

// start runs the dispatcher unless it runs (under mu). It ends when nothing waits.
func (wq *waitQueue) start(s *state) {
	if wq.running || wq.stopped {
		return
	}
	wq.running = true
	go wq.dispatchLoop(s)
}

func (wq *waitQueue) dispatchLoop(s *state) {
	tick := time.NewTicker(queuePoll)
	defer tick.Stop()
	for {
		select {
		case <-wq.kick:
		case <-tick.C:
		case <-wq.stop:
			wq.releaseAll()
			return
		}
		s.deciding.Lock()
		wq.mu.Lock()
		wq.addPeers(s.node())
		wq.dispatch()
		idle := wq.q.Len() == 0
		if idle {
			wq.running = false
		}
		wq.mu.Unlock()
		s.deciding.Unlock()
		if idle {
			return
		}
	}
}

// dispatch hands each free slot to the request that goes first (under state.deciding and mu).
func (wq *waitQueue) dispatch() {
	now := time.Now().UnixNano()
	// Each group's free slot is looked up once per grant, not once per waiting flow (Next
	// asks for every backlogged tenant's flows): the answers hold until a slot is reserved.
	memo := wq.memo
	if memo == nil {
		memo = map[string]*upstreamState{}
		wq.memo = memo
	}
	defer clear(memo)
	ready := func(key string) bool {
		free, ok := memo[key]
		if !ok {
			free = wq.freeSlot(key, now)
			memo[key] = free
		}
		return free != nil
	}
	for wq.q.Len() > 0 {
		it := wq.q.Next(ready)
		if it == nil {
			return
		}
		free, ok := memo[it.Model] // ready answered true for this group, and nothing moved since
		if !ok {
			free = wq.freeSlot(it.Model, now)
		}
		clear(memo) // the reservation below may fill it
		wt := it.Value.(*waiter)
		if free != nil {
			free.reserved.Add(1)
		}
		wt.reserved, wt.granted = free, true
		wq.dropGroup(it.Model)
		close(wt.ready)
	}
}

// freeSlot returns the least loaded candidate of the group with a free slot, or nil.
func (wq *waitQueue) freeSlot(key string, now int64) *upstreamState {
	grp := wq.groups[key]
	if grp == nil {
		return nil
	}
	p, pool := grp.live()
	var buf [16]candidate
	cands := p.candidates(buf[:0], pool, grp.model, now)
	var best *upstreamState
	bestLoad := int64(math.MaxInt64)
	for i := range cands {
		c := &cands[i]
		if c.st.health.down.Load() {
			continue
		}
		// The load is read here, under state.deciding (candidates may leave it to gather).
		load := p.state.load(c.st, now)
		d := decide.Candidate{Profile: c.prof, Load: load}
		engineFacts(&d, c.st)
		if full(&d, c.st, now) {
			continue
		}
		if l := load + c.st.reserved.Load(); l < bestLoad {
			best, bestLoad = c.st, l
		}
	}
	return best
}

// releaseAll hands every waiter on at once, without a slot reserved, when the state goes
// (the last config let go).
func (wq *waitQueue) releaseAll() {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	for {
		it := wq.q.Next(func(string) bool { return true })
		if it == nil {
			break
		}
		wt := it.Value.(*waiter)
		wt.granted = true
		close(wt.ready)
	}
	clear(wq.groups)
	wq.running = false
}

// close stops the dispatcher (state.Destruct).
func (wq *waitQueue) close() {
	wq.mu.Lock()
	if !wq.stopped {
		wq.stopped = true
		close(wq.stop)
	}
	running := wq.running
	wq.mu.Unlock()
	if !running {
		wq.releaseAll()
	}
}

// shed answers 429 with Retry-After and an error in the request's API format, when there is a
// response writer (Select returns nil after it: Caddy's 503 then finds the answer written).
func (p *KVCacheAware) shed(w http.ResponseWriter, r *http.Request, req *llmRequest, band, reason string) {
	req.shed.Store(true)
	metrics.shed.WithLabelValues(band, reason).Inc()
	if w == nil {
		return
	}
	msg := "the fleet is full: try again later"
	switch reason {
	case flow.Full.String():
		msg = "too many requests wait for the fleet: try again later"
	case flow.TenantFull.String():
		msg = "too many of your requests wait for the fleet: try again later"
	}
	f := req.Format
	if f == llmreq.None {
		f = llmreq.Hint(r) // a body that did not parse: its path and headers name its API
	}
	body := shedBody(f, msg, reason)
	h := w.Header()
	h.Set("Retry-After", retryAfter)
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(body)
	// The answer is whole (its length is given): the client has it now, while reverse_proxy
	// may go on calling Select until lb_try_duration ends (it gets nil at once: Select).
	_ = http.NewResponseController(w).Flush()
}

// shedBody is a 429's error body in the API format f: Anthropic's for /v1/messages, Ollama's
// ({"error":"..."}, the string its clients read) for /api/chat and /api/generate, OpenAI's for
// the others.
func shedBody(f llmreq.Format, msg, reason string) []byte {
	var v any
	switch f {
	case llmreq.Messages:
		v = map[string]any{"type": "error", "error": map[string]string{"type": "rate_limit_error", "message": msg}}
	case llmreq.OllamaChat, llmreq.OllamaGenerate:
		v = map[string]string{"error": msg}
	default:
		v = map[string]any{"error": map[string]any{"message": msg, "type": "rate_limit_exceeded", "code": reason, "param": nil}}
	}
	b, _ := json.Marshal(v)
	return append(b, '\n')
}

// fairCharge is a request's charge in its tenant's tokens served (flow_control): counted as
// pending when it is dispatched (flow.Queue.Charge), settled once (flow.Queue.Settle) by its
// answer's usage or, when no answer tells, at its end at what it was charged. Its fields are
// under waitQueue.mu once by is set.
type fairCharge struct {
	by      atomic.Pointer[waitQueue] // the queue charged; nil until charged
	tenant  string
	weight  float64 // output_weight
	output  float64 // the output tokens charged (flow.Estimate's), for usage without them
	charged float64
	settled bool
}

// chargee is the request whose charge this one's decision makes: the client's request for a
// prefill leg (llm_disaggregate), so that a request split in two is charged once.
func (lr *llmRequest) chargee() *llmRequest {
	if lr.legOf != nil {
		return lr.legOf
	}
	return lr
}

// charge counts the request's tokens in its tenant's pending ones when it is dispatched
// (flow_control): its prompt's estimate plus output_weight × the output expected of it (the
// chosen upstream's mean output, else expected_tokens; its max_tokens when smaller:
// flow.Estimate). Its answer's usage settles it (settleTokens), else its end (settleUnanswered).
// A retry, or the second leg of a split request, is not charged again.
func (p *KVCacheAware) charge(r *http.Request, req *llmRequest, g *gathered, chosen int) {
	f := p.opts.flow
	if f == nil {
		return
	}
	root := req.chargee()
	c := &root.fair
	if c.by.Load() != nil {
		return
	}
	expected := g.snap.Candidates[chosen].MeanOutput
	if !(expected > 0) {
		expected = float64(p.opts.expectedTokens)
	}
	prompt := float64(g.estimate)
	est := flow.Estimate(prompt, req.MaxTokens, expected, f.outputWeight)
	_, _, tenant, _ := p.flowOf(r)
	wq := p.state.wq
	wq.mu.Lock()
	if c.by.Load() != nil { // the other leg of a split request, decided meanwhile
		wq.mu.Unlock()
		return
	}
	c.tenant, c.weight, c.charged = tenant, f.outputWeight, est
	if f.outputWeight > 0 {
		c.output = (est - prompt) / f.outputWeight
	}
	wq.q.Charge(tenant, est)
	c.by.Store(wq)
	wq.mu.Unlock()
	if root != req {
		// The client's request settles it when it ends, whether or not its decode leg is
		// ever decided (its client may leave during the prefill leg).
		context.AfterFunc(req.legEnd, root.settleUnanswered)
	}
}

// settleTokens settles the request's charge at what its answer's usage shows: its prompt
// tokens plus output_weight × its output tokens (the output charged when the usage has none).
// A prefill leg's answer (one token, llm_disaggregate) is not the request's: the decode leg's
// settles it.
func (s *state) settleTokens(lr *llmRequest, u usage) {
	if !u.ok || lr.legOf != nil {
		return
	}
	c := &lr.fair
	wq := c.by.Load()
	if wq == nil {
		return
	}
	wq.mu.Lock()
	defer wq.mu.Unlock()
	out := c.output
	if u.outputKnown {
		out = u.output
	}
	wq.settle(c, max(0, u.prompt)+c.weight*max(0, out))
}

// settleUnanswered settles the request's charge at what it was charged when no answer told
// what it used (without llm_feedback, an answer without usage, a client that left): at its end.
func (lr *llmRequest) settleUnanswered() {
	if lr.legOf != nil {
		return
	}
	c := &lr.fair
	wq := c.by.Load()
	if wq == nil {
		return
	}
	wq.mu.Lock()
	wq.settle(c, c.charged)
	wq.mu.Unlock()
}

// settle settles c at used, once (under mu).
func (wq *waitQueue) settle(c *fairCharge, used float64) {
	if c.settled {
		return
	}
	c.settled = true
	wq.q.Settle(c.tenant, c.charged, used)
	if len(wq.own) >= flow.DefaultMaxTenants {
		// Client-chosen names: the least served are forgotten (the peers' sums then hold
		// what was published of them).
		keep := make([]TenantStatus, 0, len(wq.own))
		for name, v := range wq.own {
			keep = append(keep, TenantStatus{Name: name, TokensServed: v})
		}
		sortTenants(keep)
		for _, t := range keep[flow.DefaultMaxTenants*9/10:] {
			delete(wq.own, t.Name)
		}
	}
	if used > 0 && !math.IsInf(used, 0) {
		wq.own[c.tenant] += used
	}
}

// addPeers adds to the queue's counters what the cluster's peers served since the last call
// (under mu). A peer's record is its tenants' totals: a total that went down (a peer gone or
// restarted, a tenant out of its record) takes nothing back, and counts again once it passes
// what was added.
func (wq *waitQueue) addPeers(n *cluster.Node) {
	if n == nil {
		return
	}
	for name, total := range n.PeerTokens() {
		if d := total - wq.peers[name]; d > 0 {
			wq.q.Serve(name, float64(d))
			wq.peers[name] = total
		}
	}
	if len(wq.peers) > flow.DefaultMaxTenants {
		clear(wq.peers) // bounded: re-learned from the totals, counted at most once more
	}
}

// TokensServed is the node's TokensSource: this replica's tokens served per tenant.
func (h clusterHandler) TokensServed() map[string]int64 {
	wq := h.s.wq
	wq.mu.Lock()
	defer wq.mu.Unlock()
	m := make(map[string]int64, len(wq.own))
	for name, v := range wq.own {
		if v >= 1 {
			m[name] = int64(v)
		}
	}
	return m
}

// QueueStatus is the queue in GET /kvroute/.
type QueueStatus struct {
	Waiting int `json:"waiting"`
	// Bands is the requests waiting per band, by name as the metrics name them ("default"
	// without flow_control's bands); bands of two policies with the same name together.
	Bands map[string]int `json:"bands,omitempty"`
	// Tenants are the tenants remembered (top tenantLabels by tokens served): tokens served
	// as the fair share counts them, and requests waiting.
	Tenants []TenantStatus `json:"tenants,omitempty"`
}

// TenantStatus is one tenant's share.
type TenantStatus struct {
	Name string `json:"name"`
	// TokensServed is what its answers showed used (settled); TokensInFlight the estimates
	// of its requests not answered yet (docs/design.md "When the fleet is full").
	TokensServed   float64 `json:"tokens_served"`
	TokensInFlight float64 `json:"tokens_in_flight,omitempty"`
	Waiting        int     `json:"waiting"`
}

// status reads the queue.
func (s *state) queueStatus() *QueueStatus {
	wq := s.wq
	wq.mu.Lock()
	wq.addPeers(s.node())
	defer wq.mu.Unlock()
	st := &QueueStatus{Waiting: wq.q.Len(), Bands: map[string]int{}}
	wq.q.Each(func(it *flow.Item) { st.Bands[it.Value.(*waiter).band]++ })
	st.Tenants = wq.topTenants(tenantLabels)
	return st
}

// topTenants returns the n tenants with the most tokens served (under mu).
func (wq *waitQueue) topTenants(n int) []TenantStatus {
	var all []TenantStatus
	wq.q.Tenants(func(name string, settled, pending float64, queued int) {
		all = append(all, TenantStatus{Name: name, TokensServed: settled, TokensInFlight: pending, Waiting: queued})
	})
	sortTenants(all)
	if len(all) > n {
		all = all[:n]
	}
	return all
}

// sortTenants orders tenants by tokens served, in flight included, most first (names break
// ties).
func sortTenants(ts []TenantStatus) {
	slices.SortFunc(ts, func(a, b TenantStatus) int {
		switch x, y := a.TokensServed+a.TokensInFlight, b.TokensServed+b.TokensInFlight; {
		case x > y:
			return -1
		case x < y:
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// tenantCollector reports the tokens served per tenant, read at scrape time: the
// tenantLabels tenants with the most by name, the rest summed as "other" (tenant names come
// from clients: never a label per name without bound).
type tenantCollector struct{}

var descTenantTokens = prometheus.NewDesc(ns+"_"+sub+"_tenant_tokens_served",
	"Tokens served per flow_control tenant as its fair share counts them, settled by its answers (prompt plus output_weight × output as their usage showed; an unanswered request at what it was charged; requests in flight are not in it; an idle tenant's count is lifted to the others' when it comes back). The most served tenants by name, the rest as other.",
	[]string{"tenant"}, nil)

func (*tenantCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descTenantTokens }

func (*tenantCollector) Collect(ch chan<- prometheus.Metric) {
	s := currentState()
	if s == nil {
		return
	}
	wq := s.wq
	wq.mu.Lock()
	wq.addPeers(s.node())
	var all []TenantStatus
	wq.q.Tenants(func(name string, settled, _ float64, _ int) {
		all = append(all, TenantStatus{Name: name, TokensServed: settled})
	})
	wq.mu.Unlock()
	sortTenants(all)
	other, others := 0.0, false
	for i, t := range all {
		if i >= tenantLabels || t.Name == "other" {
			other, others = other+t.TokensServed, true
			continue
		}
		ch <- prometheus.MustNewConstMetric(descTenantTokens, prometheus.GaugeValue, t.TokensServed, t.Name)
	}
	if others {
		ch <- prometheus.MustNewConstMetric(descTenantTokens, prometheus.GaugeValue, other, "other")
	}
}
