package fleetsim

import (
	"fmt"
	"io"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
	"github.com/kvroute/caddy-kvroute/kvroute/decide"
)

// KVDiagnosis is what kvroute's decision did on one run, seen against the engines' true state
// at each decision (issue 34: why it queues requests behind busy engines while others are
// free). The router is told nothing of it.
type KVDiagnosis struct {
	Paths [4]KVPathFigures // per decide.Path
	// Other is the decisions of a router without kvroute's paths (a baseline's in real time:
	// the demo's -diagnose).
	Other KVPathFigures
	// AllBusy counts the decisions at which no engine had a free batch slot and an empty queue.
	AllBusy int
	// Of the decisions that lost more than LostMS of true TTFT: the chosen engine's share of
	// the prompt matched (none, at most cache_threshold 0.1, to 0.5, above), whether the chosen engine
	// was the least loaded as the router counts (requests in flight), whether the router had
	// learned its slots, and whether its learned slots said it was full.
	MatchNone, MatchLow, MatchMid, MatchHigh int
	LeastLoaded                              int
	SlotsKnown, RouterSawFull                int
}

// KVPathFigures are one decision path's decisions.
type KVPathFigures struct {
	Decisions int
	// SlotsFull: the chosen engine's batch slots were all taken (running ≥ max_num_seqs)
	// while another engine had a free slot and nothing waiting; Queued: requests waited on the
	// chosen engine (the KV room or the token budget held them back) while another engine had
	// a free slot and nothing waiting.
	SlotsFull, Queued int
	// Regret is the sum of the chosen engine's true TTFT less the best engine's, as the greedy
	// oracle predicts them (engine.PredictTTFT) at the decision; Lost counts the decisions that
	// lost more than LostMS.
	Regret time.Duration
	Lost   int
}

// LostMS is the TTFT a decision must lose against the best engine to count as lost.
const LostMS = 50

// DecisionRecord is one decision seen both ways: what the router believed of each engine when
// it chose, and what was true at the engines (in the simulator, at the decision; in real time,
// as the request arrived at the engine it was sent to: the demo's -diagnose). Engines are in
// the fleet's order; one the router left out has a zero Belief.
type DecisionRecord struct {
	ID string `json:"id"` // the request: its index in the simulator, Caddy's id in real time
	// Sent is when its client sent it, Decided when the router chose, and At when it arrived
	// at its engine, from the run's start (in the simulator the three are one moment; in real
	// time Decided is known for kv_cache_aware only, else 0).
	Sent        time.Duration `json:"sent_ns"`
	Decided     time.Duration `json:"decided_ns"`
	At          time.Duration `json:"at_ns"`
	Path        string        `json:"path"`
	Chosen      int           `json:"chosen"`
	PromptChars int           `json:"prompt_chars"`
	// PromptTokens is what the router estimated, Tokens the engines' own count.
	PromptTokens int64    `json:"prompt_tokens"`
	Tokens       int      `json:"tokens"`
	Believed     []Belief `json:"believed"`
	Truth        []Truth  `json:"truth"`
	// TTFT is the request's time to first token as its client saw it (from the send),
	// EngineTTFT at its engine (from its arrival there; in the simulator the same), and
	// Cached the prompt tokens its engine found at admission (0 before the answer).
	TTFT       time.Duration `json:"ttft_ns"`
	EngineTTFT time.Duration `json:"engine_ttft_ns"`
	Cached     int           `json:"cached"`
	// EngineDone is when its engine gave its last token and Done when its client had it,
	// from the run's start (0: not known).
	EngineDone time.Duration `json:"engine_done_ns"`
	Done       time.Duration `json:"done_ns"`
}

// Belief is what the router believed of one engine at a decision.
type Belief struct {
	Candidate    bool    `json:"candidate"` // the engine was among the decision's candidates
	Load         int64   `json:"load"`
	Slots        int64   `json:"slots"` // learned batch slots (0: none)
	Match        int     `json:"match_chars"`
	QueuedTokens int64   `json:"queued_tokens"`
	Prefill      int64   `json:"prefill_tokens"`
	PrefillSpeed float64 `json:"prefill_tokens_per_second"`
	// ReadingAge is how old its engine's last reading was (-1: none).
	ReadingAge time.Duration `json:"reading_age_ns"`
	Predicted  time.Duration `json:"predicted_ttft_ns"`
}

// Truth is what one engine held at a decision: its batch and queue, its batch slots
// (max_num_seqs), the request's prompt tokens its cache held, and the greedy oracle's
// prediction of the request's TTFT there (engine.PredictTTFT).
type Truth struct {
	Running int           `json:"running"`
	Waiting int           `json:"waiting"`
	Slots   int           `json:"slots"`
	Cached  int           `json:"cached"`
	TTFT    time.Duration `json:"ttft_ns"`
}

// Add counts one decision in the diagnosis: by its path (Other without one), and, when it lost
// more than LostMS, by what the router believed of the engine it chose (when it says).
func (d *KVDiagnosis) Add(rec *DecisionRecord) {
	if rec.Chosen < 0 || rec.Chosen >= len(rec.Truth) {
		return
	}
	p := &d.Other
	for i := range d.Paths {
		if decide.Path(i).String() == rec.Path {
			p = &d.Paths[i]
		}
	}
	i := rec.Chosen
	anyFree := false
	best := time.Duration(-1)
	for _, t := range rec.Truth {
		anyFree = anyFree || t.Running < t.Slots && t.Waiting == 0
		if best < 0 || t.TTFT < best {
			best = t.TTFT
		}
	}
	p.Decisions++
	switch t := rec.Truth[i]; {
	case !anyFree:
		d.AllBusy++
	case t.Running >= t.Slots:
		p.SlotsFull++
	case t.Waiting > 0:
		p.Queued++
	}
	lost := rec.Truth[i].TTFT - best
	p.Regret += lost
	if lost <= LostMS*time.Millisecond {
		return
	}
	p.Lost++
	if i >= len(rec.Believed) {
		return
	}
	c := &rec.Believed[i]
	switch share := float64(c.Match) / float64(max(1, rec.PromptChars)); {
	case c.Match == 0:
		d.MatchNone++
	case share <= 0.1:
		d.MatchLow++
	case share <= 0.5:
		d.MatchMid++
	default:
		d.MatchHigh++
	}
	least := true
	for j := range rec.Believed {
		least = least && (!rec.Believed[j].Candidate || rec.Believed[j].Load >= c.Load)
	}
	if least {
		d.LeastLoaded++
	}
	if c.Slots > 0 {
		d.SlotsKnown++
		if c.Load >= c.Slots {
			d.RouterSawFull++
		}
	}
}

// kvDiagRouter runs a kvRouter and looks at the engines at each of its decisions.
type kvDiagRouter struct {
	*kvRouter
	sc      *Scenario
	engines []*engine.Engine
	d       *KVDiagnosis
	er      engine.Request
	// records, when set, gets every decision (DiagnoseKV's trace), its answer filled in at
	// the first token.
	records *[]*DecisionRecord
	pending map[int]*DecisionRecord
}

func (r *kvDiagRouter) See(engines []*engine.Engine) { r.engines = engines }

func (r *kvDiagRouter) Route(now time.Duration, req *Request) int {
	r.er = engine.Request{Tokens: req.Tokens, Hashes: req.hashes, Output: req.Output, Adapter: req.Adapter}
	rec := &DecisionRecord{ID: fmt.Sprint(req.ID), Sent: req.Arrival, Decided: now, At: now, PromptChars: req.Chars, Tokens: req.Tokens, Truth: truth(r.sc, r.engines, &r.er, now)}
	i := r.kvRouter.Route(now, req)
	if i < 0 {
		return i
	}
	k := r.kvRouter
	rec.Path, rec.Chosen, rec.PromptTokens = k.last.path.String(), i, k.last.req.PromptTokens
	rec.Believed = make([]Belief, len(r.engines))
	for _, c := range k.last.cands {
		u := &k.up[c.Key]
		b := Belief{Candidate: true, Load: c.Load, Slots: c.Slots, Match: c.Match, QueuedTokens: c.QueuedTokens,
			Prefill: c.Prefill, PrefillSpeed: c.PrefillSpeed, ReadingAge: -1, Predicted: time.Duration(c.Cost.TTFT * 1e9)}
		if u.hasPrev {
			b.ReadingAge = now - u.prevAt
		}
		rec.Believed[c.Key] = b
	}
	r.d.Add(rec)
	if r.records != nil {
		*r.records = append(*r.records, rec)
		r.pending[req.ID] = rec
	}
	return i
}

func (r *kvDiagRouter) FirstToken(now time.Duration, req *Request, i int) {
	if rec := r.pending[req.ID]; rec != nil {
		rec.TTFT, rec.EngineTTFT, rec.Cached = now-req.Arrival, now-req.Routed, req.Cached
		delete(r.pending, req.ID)
	}
	r.kvRouter.FirstToken(now, req, i)
}

// DiagnoseKV runs scenario sc's seed with kvroute's decision rule and diagnoses it; tune, when
// set, changes the decision's options first (an experiment: kvroute's defaults otherwise);
// records, when set, gets every decision.
func DiagnoseKV(sc *Scenario, seed uint64, rule decide.Rule, tune func(*KVSettings), records *[]*DecisionRecord) (*KVDiagnosis, *Figures, error) {
	capacity, slo, err := Calibrate(sc)
	if err != nil {
		return nil, nil, err
	}
	b, err := Build(sc, seed)
	if err != nil {
		return nil, nil, err
	}
	r := &kvDiagRouter{kvRouter: newKVRouter(rule, "kv_"+RuleName(rule), seed), sc: sc, d: &KVDiagnosis{}, records: records, pending: map[int]*DecisionRecord{}}
	if tune != nil {
		r.tune(tune)
	}
	res := Run(sc, b, seed, sc.Load*capacity, r)
	if records != nil {
		ends(res, *records)
	}
	return r.d, Measure(res, slo), nil
}

// Write prints the diagnosis: a line per path, then the lost decisions' traits.
func (d *KVDiagnosis) Write(w io.Writer, name string) {
	total, lost := d.Other.Decisions, d.Other.Lost
	for _, p := range d.Paths {
		total += p.Decisions
		lost += p.Lost
	}
	fmt.Fprintf(w, "%s: %d decisions, no engine free at %d\n", name, total, d.AllBusy)
	line := func(label string, p KVPathFigures) {
		fmt.Fprintf(w, "  %-10s %5d decisions: chose a full batch %4d, a queue %4d while another engine was free; mean TTFT lost %6.1f ms; lost >%d ms %4d\n",
			label, p.Decisions, p.SlotsFull, p.Queued, float64(p.Regret)/1e6/float64(p.Decisions), LostMS, p.Lost)
	}
	for i, p := range d.Paths {
		if p.Decisions > 0 {
			line(decide.Path(i).String(), p)
		}
	}
	if d.Other.Decisions > 0 {
		// A router without kvroute's paths: nothing of what it believed is known.
		line("all", d.Other)
		return
	}
	fmt.Fprintf(w, "  of the %d lost: match none %d, ≤0.1 %d, ≤0.5 %d, >0.5 %d; least loaded by the router's count %d; slots learned %d, full by them %d\n",
		lost, d.MatchNone, d.MatchLow, d.MatchMid, d.MatchHigh, d.LeastLoaded, d.SlotsKnown, d.RouterSawFull)
}

// truthRouter records, for any router, what the engines held at each of its decisions (a
// baseline's in TraceRun: what it believed is its own).
type truthRouter struct {
	Router
	sc      *Scenario
	engines []*engine.Engine
	er      engine.Request
	records []*DecisionRecord
	pending map[int]*DecisionRecord
}

func (r *truthRouter) See(engines []*engine.Engine) {
	r.engines = engines
	if o, ok := r.Router.(Omniscient); ok {
		o.See(engines)
	}
}

// truth is what every engine holds now for req (DecisionRecord.Truth).
func truth(sc *Scenario, engines []*engine.Engine, er *engine.Request, now time.Duration) []Truth {
	out := make([]Truth, len(engines))
	for i, e := range engines {
		rd := e.Reading()
		out[i] = Truth{Running: rd.Running, Waiting: rd.Waiting, Slots: sc.Engines[i].MaxNumSeqs, Cached: e.Lookup(er), TTFT: e.PredictTTFT(er, now)}
	}
	return out
}

func (r *truthRouter) Route(now time.Duration, req *Request) int {
	r.er = engine.Request{Tokens: req.Tokens, Hashes: req.hashes, Output: req.Output, Adapter: req.Adapter}
	tr := truth(r.sc, r.engines, &r.er, now)
	i := r.Router.Route(now, req)
	if i < 0 {
		return i
	}
	rec := &DecisionRecord{ID: fmt.Sprint(req.ID), Sent: req.Arrival, Decided: now, At: now, Chosen: i, PromptChars: req.Chars, Tokens: req.Tokens, Truth: tr}
	r.records = append(r.records, rec)
	r.pending[req.ID] = rec
	return i
}

func (r *truthRouter) FirstToken(now time.Duration, req *Request, i int) {
	if rec := r.pending[req.ID]; rec != nil {
		rec.TTFT, rec.EngineTTFT, rec.Cached = now-req.Arrival, now-req.Routed, req.Cached
		delete(r.pending, req.ID)
	}
	r.Router.FirstToken(now, req, i)
}

// TraceRun runs policy p on scenario sc's workload b (built for seed) at rate, as Run does,
// and returns every decision seen both ways: kvroute's policies with what they believed
// (as DiagnoseKV), the others with what the engines held alone.
func TraceRun(sc *Scenario, b *Built, seed uint64, rate float64, p Policy) (*Result, []*DecisionRecord) {
	rt := p.New(seed)
	var res *Result
	var records []*DecisionRecord
	if k, ok := rt.(*kvRouter); ok && k.fc == nil {
		r := &kvDiagRouter{kvRouter: k, sc: sc, d: &KVDiagnosis{}, records: &records, pending: map[int]*DecisionRecord{}}
		res = Run(sc, b, seed, rate, r)
	} else {
		r := &truthRouter{Router: rt, sc: sc, pending: map[int]*DecisionRecord{}}
		res = Run(sc, b, seed, rate, r)
		records = r.records
	}
	ends(res, records)
	return res, records
}

// ends fills in each record's end, at the engine and at the client, from the run.
func ends(res *Result, records []*DecisionRecord) {
	for _, rec := range records {
		var id int
		if _, err := fmt.Sscan(rec.ID, &id); err == nil && id >= 0 && id < len(res.Requests) {
			rec.EngineDone, rec.Done = res.Requests[id].engineDone, res.Requests[id].Done
		}
	}
}
