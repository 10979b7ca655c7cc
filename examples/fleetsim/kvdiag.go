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

// kvDiagRouter runs a kvRouter and looks at the engines at each of its decisions.
type kvDiagRouter struct {
	*kvRouter
	sc      *Scenario
	engines []*engine.Engine
	d       *KVDiagnosis
	er      engine.Request
}

func (r *kvDiagRouter) See(engines []*engine.Engine) { r.engines = engines }

func (r *kvDiagRouter) Route(now time.Duration, req *Request) int {
	n := len(r.engines)
	slotsFull, queued := make([]bool, n), make([]bool, n)
	anyFree := false
	r.er = engine.Request{Tokens: req.Tokens, Hashes: req.hashes, Output: req.Output, Adapter: req.Adapter}
	ttft := make([]time.Duration, n)
	best := time.Duration(-1)
	for i, e := range r.engines {
		rd := e.Reading()
		slotsFull[i] = rd.Running >= r.sc.Engines[i].MaxNumSeqs
		queued[i] = rd.Waiting > 0
		anyFree = anyFree || !slotsFull[i] && !queued[i]
		ttft[i] = e.PredictTTFT(&r.er, now)
		if best < 0 || ttft[i] < best {
			best = ttft[i]
		}
	}
	i := r.kvRouter.Route(now, req)
	d, k := r.d, r.kvRouter
	p := &d.Paths[k.last.path]
	p.Decisions++
	if !anyFree {
		d.AllBusy++
	} else if slotsFull[i] {
		p.SlotsFull++
	} else if queued[i] {
		p.Queued++
	}
	lost := ttft[i] - best
	p.Regret += lost
	if lost <= LostMS*time.Millisecond {
		return i
	}
	p.Lost++
	c := &k.last.cands[i]
	switch share := float64(c.Match) / float64(max(1, req.Chars)); {
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
	for j := range k.last.cands {
		least = least && k.last.cands[j].Load >= c.Load
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
	return i
}

// DiagnoseKV runs scenario sc's seed with kvroute's decision rule and diagnoses it; tune, when
// set, changes the decision's options first (an experiment: kvroute's defaults otherwise).
func DiagnoseKV(sc *Scenario, seed uint64, rule decide.Rule, tune func(*KVSettings)) (*KVDiagnosis, *Figures, error) {
	capacity, slo, err := Calibrate(sc)
	if err != nil {
		return nil, nil, err
	}
	b, err := Build(sc, seed)
	if err != nil {
		return nil, nil, err
	}
	r := &kvDiagRouter{kvRouter: newKVRouter(rule, "kv_"+RuleName(rule), seed), sc: sc, d: &KVDiagnosis{}}
	if tune != nil {
		r.tune(tune)
	}
	res := Run(sc, b, seed, sc.Load*capacity, r)
	return r.d, Measure(res, slo), nil
}

// Write prints the diagnosis: a line per path, then the lost decisions' traits.
func (d *KVDiagnosis) Write(w io.Writer, name string) {
	total, lost := 0, 0
	for _, p := range d.Paths {
		total += p.Decisions
		lost += p.Lost
	}
	fmt.Fprintf(w, "%s: %d decisions, no engine free at %d\n", name, total, d.AllBusy)
	for i, p := range d.Paths {
		if p.Decisions == 0 {
			continue
		}
		fmt.Fprintf(w, "  %-10s %5d decisions: chose a full batch %4d, a queue %4d while another engine was free; mean TTFT lost %6.1f ms; lost >%d ms %4d\n",
			decide.Path(i), p.Decisions, p.SlotsFull, p.Queued, float64(p.Regret)/1e6/float64(p.Decisions), LostMS, p.Lost)
	}
	fmt.Fprintf(w, "  of the %d lost: match none %d, ≤0.1 %d, ≤0.5 %d, >0.5 %d; least loaded by the router's count %d; slots learned %d, full by them %d\n",
		lost, d.MatchNone, d.MatchLow, d.MatchMid, d.MatchHigh, d.LeastLoaded, d.SlotsKnown, d.RouterSawFull)
}
