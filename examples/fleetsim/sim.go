package fleetsim

import (
	"fmt"
	"math"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
)

// event kinds, in the order events of the same moment are handled.
const (
	evStep = iota
	evSend
	evSide
	evRestart
	evTelemetry
	evOffer
	evRoute  // a request reaches the router (Transit)
	evArrive // a routed request reaches its engine (Transit)
	evAnswer // an engine's last token (or error) reaches the client (Transit)
)

type event struct {
	at   time.Duration
	seq  uint64 // insertion order: same-moment events in the order they were made
	kind int
	a, b int
}

// eventHeap is a binary min-heap of events by time, then by insertion order.
type eventHeap []event

func (h eventHeap) less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}

func (h *eventHeap) push(e event) {
	*h = append(*h, e)
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	q := *h
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q = q[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(q) && q.less(l, m) {
			m = l
		}
		if r < len(q) && q.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	*h = q
	return top
}

// sideBase numbers side-load requests apart from the scenario's.
const sideBase = 1 << 40

// Result is one run: its requests, timed, and the engines' time-averaged requests in system.
type Result struct {
	Requests []*Request
	// Start and End bound the run: the first send and the last answer (or the horizon).
	Start, End time.Duration
	// EngineLoad is each engine's running plus waiting requests, averaged over the run.
	EngineLoad []float64
	// Horizon is when an open-loop run stopped; requests not answered by then are unserved.
	Horizon time.Duration
}

// sim is one run of a scenario with a router.
type sim struct {
	sc      *Scenario
	seed    uint64
	router  Router
	engines []*engine.Engine
	ids     []EngineInfo
	events  eventHeap
	seq     uint64
	now     time.Duration

	sessions []session
	reqs     [][]*Request // per session, per call
	byID     []*Request
	next     []int // per session: the next call to send
	scale    float64
	closed   bool
	queue    int // closed loop: the next session to hand a client
	waiting  []*Request
	kicked   []bool // an evStep is pending for the engine
	epoch    []int  // per engine: restarts so far; a step event of an earlier epoch is void
	active   int    // engines in the fleet now: the rest join later (Scenario.Grow)
	sends    int    // requests sent so far
	// restarted: the restart due after a share of the requests (Restart.Share) happened.
	restarted bool

	sideRNG   *rng
	sideSeq   int
	horizon   time.Duration
	pending   int // scenario requests not yet answered
	areaT     []time.Duration
	area      []float64
	lastCount []int
	offer     bool // a request ended: offer the waiting requests again
}

func (s *sim) push(at time.Duration, kind, a, b int) {
	s.seq++
	s.events.push(event{at: at, seq: s.seq, kind: kind, a: a, b: b})
}

// Run plays scenario sc's workload b (built for the same seed) through router: open loop at
// rate requests per second, or closed loop when the scenario has clients.
func Run(sc *Scenario, b *Built, seed uint64, rate float64, router Router) *Result {
	s := &sim{sc: sc, router: router, seed: seed}
	n := len(sc.Engines)
	s.engines = make([]*engine.Engine, n)
	s.ids = make([]EngineInfo, n)
	for i, cfg := range sc.Engines {
		s.engines[i] = engine.New(cfg, 0)
		s.ids[i] = EngineInfo{ID: fmt.Sprintf("engine-%d", i), Model: "llama-3.1-8b"}
	}
	s.kicked = make([]bool, n)
	s.epoch = make([]int, n)
	s.areaT = make([]time.Duration, n)
	s.area = make([]float64, n)
	s.lastCount = make([]int, n)
	s.active = n
	if sc.Grow != nil {
		s.active = n - sc.Grow.Engines
	}
	router.Start(s.ids[:s.active])
	if o, ok := router.(Omniscient); ok {
		o.See(s.engines[:s.active])
	}

	// Each run has its own copies of the requests; text and hashes are shared.
	s.sessions = b.w.sessions
	s.reqs = make([][]*Request, len(b.reqs))
	for i, calls := range b.reqs {
		s.reqs[i] = make([]*Request, len(calls))
		for j, r := range calls {
			c := *r
			c.ID = len(s.byID)
			c.Engine = -1
			c.er = engine.Request{ID: uint64(c.ID), Tokens: c.Tokens, Hashes: c.hashes, Output: c.Output, Adapter: c.Adapter}
			s.reqs[i][j] = &c
			s.byID = append(s.byID, &c)
		}
	}
	s.pending = len(s.byID)
	s.next = make([]int, len(s.reqs))

	s.horizon = time.Duration(math.MaxInt64)
	if sc.Clients > 0 {
		s.closed = true
		for range min(sc.Clients, len(s.reqs)) {
			s.startSession()
		}
	} else {
		span := b.span
		s.scale = 1
		if rate > 0 && span > 0 {
			s.scale = float64(len(s.byID)) / span.Seconds() / rate
		}
		for i := range s.reqs {
			s.sendAt(i)
		}
		s.horizon = time.Duration(float64(span) * s.scale * OpenLoopGrace)
	}
	if sc.TelemetryInterval > 0 {
		s.push(sc.TelemetryInterval, evTelemetry, 0, 0)
	}
	if sc.Restart != nil && sc.Restart.Share == 0 {
		at := sc.Restart.At
		if !s.closed {
			at = time.Duration(float64(at) * s.scale)
		}
		s.push(at, evRestart, sc.Restart.Engine, 0)
	}
	if sc.Side != nil {
		s.sideRNG = newRNG(seed, "side")
		s.push(0, evSide, sc.Side.Engine, 0)
	}

	for len(s.events) > 0 && s.pending > 0 {
		ev := s.events.pop()
		if ev.at > s.horizon {
			break
		}
		s.now = ev.at
		switch ev.kind {
		case evSend:
			s.send(s.reqs[ev.a][ev.b])
		case evRoute:
			s.arrive(s.byID[ev.a])
		case evArrive:
			r := s.byID[ev.a]
			s.submit(r.Engine, &r.er)
		case evAnswer:
			s.answer(s.byID[ev.a], ev.b != 0)
		case evStep:
			if ev.b != s.epoch[ev.a] {
				break // the engine restarted since
			}
			s.kicked[ev.a] = false
			s.step(ev.a)
		case evTelemetry:
			for i, e := range s.engines[:s.active] {
				s.router.Reading(s.now, i, e.Reading())
			}
			s.push(s.now+sc.TelemetryInterval, evTelemetry, 0, 0)
			s.offer = len(s.waiting) > 0 // a reading may have freed a slot as the router sees it
		case evRestart:
			s.restart(ev.a)
		case evOffer:
			s.offer = len(s.waiting) > 0
		case evSide:
			s.sideSeq++
			c := sideCall(s.sideRNG, s.sideSeq)
			r := build(c, sc.CharsPerToken, wholeSegment)
			er := &engine.Request{ID: uint64(sideBase + s.sideSeq), Tokens: r.Tokens, Hashes: r.hashes, Output: r.Output}
			s.submit(ev.a, er)
			gap := time.Duration(s.sideRNG.exp() / sc.Side.Rate * float64(time.Second))
			s.push(s.now+gap, evSide, ev.a, 0)
		}
		if s.offer {
			s.offerWaiting()
		}
	}
	end := s.now
	if !s.closed && s.pending > 0 {
		end = s.horizon
	}
	res := &Result{Requests: s.byID, End: end, Horizon: s.horizon, EngineLoad: make([]float64, n)}
	res.Start = end
	for _, r := range s.byID {
		if r.Arrival < res.Start && (r.Engine >= 0 || r.Shed || r.Done > 0) {
			res.Start = r.Arrival
		}
	}
	for i := range s.engines {
		s.now = end
		s.account(i)
		if d := end - res.Start; d > 0 {
			res.EngineLoad[i] = s.area[i] / d.Seconds()
		}
	}
	return res
}

// OpenLoopGrace is how long an open-loop run goes on after its nominal span, as a multiple of
// it: requests unanswered at 1.1 × the span count as unserved.
const OpenLoopGrace = 1.1

// share is the number of the run's requests that make share of them.
func (s *sim) share(share float64) int { return int(share * float64(len(s.byID))) }

// restart restarts engine i: the requests it held end as aborted.
func (s *sim) restart(i int) {
	s.account(i)
	s.epoch[i]++
	s.kicked[i] = false
	for _, e := range s.engines[i].Restart(s.now) {
		s.handle(i, e)
	}
	s.account(i)
}

// sendAt schedules session i's next call at its nominal time, or now if that has passed.
func (s *sim) sendAt(i int) {
	j := s.next[i]
	if j >= len(s.reqs[i]) {
		return
	}
	at := time.Duration(float64(s.sessions[i].calls[j].at) * s.scale)
	s.push(max(at, s.now), evSend, i, j)
}

// startSession hands the next session to a closed-loop client.
func (s *sim) startSession() {
	if s.queue >= len(s.reqs) {
		return
	}
	i := s.queue
	s.queue++
	s.push(s.now, evSend, i, 0)
}

func (s *sim) send(r *Request) {
	r.Arrival = s.now
	s.sends++
	if g := s.sc.Grow; g != nil && s.active < len(s.engines) && s.sends > s.share(g.Share) {
		s.grow()
	}
	if rs := s.sc.Restart; rs != nil && rs.Share > 0 && !s.restarted && s.sends > s.share(rs.Share) {
		s.restarted = true
		s.restart(rs.Engine)
	}
	if t := s.sc.Transit; t != nil {
		s.push(s.now+s.delay(t.Router, r.ID, 0), evRoute, r.ID, 0)
		return
	}
	s.arrive(r)
}

// arrive offers r to the router as it reaches it.
func (s *sim) arrive(r *Request) {
	if !s.route(r) {
		s.waiting = append(s.waiting, r)
		if w, ok := s.router.(Waker); ok {
			if at := w.WakeAt(r); at > s.now {
				s.push(at, evOffer, 0, 0)
			}
		}
	}
}

// Waker is a router that bounds how long a request waits at it: WakeAt is when the simulator
// offers a request it answered Wait again even if nothing ended (0: only when a request ends).
type Waker interface {
	WakeAt(req *Request) time.Duration
}

// route asks the router; Wait queues r at the router.
func (s *sim) route(r *Request) bool {
	i := s.router.Route(s.now, r)
	switch {
	case i == Wait:
		return false
	case i == Shed || i < 0 || i >= s.active:
		r.Shed = true
		r.Done = s.now
		s.finish(r)
		return true
	}
	r.Routed = s.now
	r.Engine = i
	if t := s.sc.Transit; t != nil {
		d := t.Proxy + time.Duration(float64(t.PerKChar)*float64(r.Chars)/1000)
		s.push(s.now+s.delay(d, r.ID, 1), evArrive, r.ID, 0)
		return true
	}
	s.submit(i, &r.er)
	return true
}

func (s *sim) submit(i int, er *engine.Request) {
	s.account(i)
	s.engines[i].Submit(er, s.now)
	s.account(i)
	if !s.engines[i].Busy() && !s.kicked[i] {
		s.kicked[i] = true
		s.push(s.now, evStep, i, s.epoch[i])
	}
}

// account adds engine i's requests in system since the last change to its time integral.
func (s *sim) account(i int) {
	s.area[i] += float64(s.lastCount[i]) * (s.now - s.areaT[i]).Seconds()
	s.areaT[i] = s.now
	rd := s.engines[i]
	s.lastCount[i] = rd.Queued()
}

func (s *sim) step(i int) {
	e := s.engines[i]
	s.account(i)
	evs, busy := e.Advance(s.now)
	s.account(i)
	if busy {
		s.push(e.StepEnd(), evStep, i, s.epoch[i])
	}
	for _, ev := range evs {
		s.handle(i, ev)
	}
}

func (s *sim) handle(i int, ev engine.Event) {
	if ev.Req.ID >= sideBase {
		return
	}
	r := s.byID[ev.Req.ID]
	switch ev.Kind {
	case engine.FirstToken:
		r.engineFirst = s.now
		r.FirstToken = s.now
		if t := s.sc.Transit; t != nil {
			r.FirstToken += s.delay(t.Back, r.ID, 2)
		}
		r.Cached = ev.Cached
		s.router.FirstToken(s.now, r, i)
	case engine.Finished, engine.Aborted:
		r.engineDone = s.now
		if t := s.sc.Transit; t != nil {
			s.push(s.now+s.delay(t.Back, r.ID, 3), evAnswer, r.ID, boolInt(ev.Kind == engine.Aborted))
			return
		}
		s.answer(r, ev.Kind == engine.Aborted)
	}
}

// answer ends r as its client sees the end: the router hears of it (the proxy's end, with the
// answer's usage), and the client moves on.
func (s *sim) answer(r *Request, aborted bool) {
	r.Done = s.now
	if aborted {
		r.Aborted = true
		r.FirstToken = 0
		s.router.Done(s.now, r, r.Engine, Usage{Aborted: true})
	} else {
		s.router.Done(s.now, r, r.Engine, Usage{PromptTokens: r.Tokens, CachedTokens: r.Cached, CompletionTokens: r.Output, FirstToken: r.engineFirst})
	}
	s.finish(r)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// delay is d with request id's draw k of the transit's jitter (plus one of Transit.Extra, else
// times a lognormal factor of median 1 and log deviation Transit.Sigma, at most 50), the same
// for every policy of a run's seed.
func (s *sim) delay(d time.Duration, id, k int) time.Duration {
	t := s.sc.Transit
	if d <= 0 || t.Sigma <= 0 && len(t.Extra) == 0 {
		return d
	}
	r := rng{s: splitmix(s.seed ^ splitmix(uint64(id)<<2|uint64(k)) ^ 0x7472616e73697421)}
	if n := len(t.Extra); n > 0 {
		return d + t.Extra[r.intn(n)]
	}
	return time.Duration(float64(d) * min(50, math.Exp(t.Sigma*r.normal())))
}

// finish moves r's client on and offers the router's waiting requests again.
func (s *sim) finish(r *Request) {
	s.pending--
	sess := r.sess
	s.next[sess]++
	if s.closed {
		if s.next[sess] < len(s.reqs[sess]) {
			s.push(s.now, evSend, sess, s.next[sess])
		} else {
			s.startSession()
		}
	} else {
		s.sendAt(sess)
	}
	s.offer = len(s.waiting) > 0
}

// offerWaiting routes the router's waiting requests again, in arrival order.
//
// Passes repeat while one moves a request (routes or sheds it): a router whose queue has an
// order of its own (flow control) answers Wait to the requests offered before the one its
// queue picks, and once that one goes, the next pick may be among them.
func (s *sim) offerWaiting() {
	s.offer = false
	for moved := true; moved && len(s.waiting) > 0; {
		moved = false
		waiting := s.waiting
		s.waiting = nil
		for _, w := range waiting {
			if s.route(w) {
				moved = true
			} else {
				s.waiting = append(s.waiting, w)
			}
		}
	}
}
