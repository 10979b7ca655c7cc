package fleetsim

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// The twin's judgement (issue 41): whether the simulator predicts a real-time series. Both
// worlds are judged by the same code: a policy's figures over rounds (real time: interleaved
// rounds; the simulator: seeds), the same-run ratios of kv_cache_aware's figures over a
// baseline's, and the verdict of Dominates on the medians (with throughput for goodput: the
// demo measures no SLO).

// Round is one run's three figures: TTFT p50 and p99 (ms) and requests per second.
type Round struct {
	P50, P99, RPS float64
}

// Ratios are the medians of a pair's same-run ratios, policy over baseline, with their spread.
type Ratios struct {
	P50, P99, RPS          float64
	P50Lo, P99Lo, RPSLo    float64
	P50Hi, P99Hi, RPSHi    float64
	Rounds                 int
	Dominated              bool // the baseline's medians dominate the policy's (Dominates)
	PolicyMed, BaselineMed Round
}

// CompareRounds judges policy against baseline over rounds of the same index (the same
// round, or the same seed): medians of the per-round ratios, and the verdict on the medians.
func CompareRounds(policy, baseline []Round) Ratios {
	n := min(len(policy), len(baseline))
	var p50, p99, rps []float64
	for k := range n {
		p, b := policy[k], baseline[k]
		p50 = append(p50, p.P50/b.P50)
		p99 = append(p99, p.P99/b.P99)
		rps = append(rps, p.RPS/b.RPS)
	}
	r := Ratios{Rounds: n, PolicyMed: medRound(policy[:n]), BaselineMed: medRound(baseline[:n])}
	r.P50, r.P50Lo, r.P50Hi = medSpan(p50)
	r.P99, r.P99Lo, r.P99Hi = medSpan(p99)
	r.RPS, r.RPSLo, r.RPSHi = medSpan(rps)
	pm, bm := r.PolicyMed, r.BaselineMed
	r.Dominated = Dominates(Median{P50: bm.P50, P99: bm.P99, Goodput: bm.RPS}, Median{P50: pm.P50, P99: pm.P99, Goodput: pm.RPS})
	return r
}

// AgreementTolerance is how far the simulator's ratio may be from real time's, as a share of
// real time's, for the two to agree (issue 41: ±15%).
const AgreementTolerance = 0.15

// Agreement is the simulator's prediction of one pair against real time's measurement.
type Agreement struct {
	Sim, Real          Ratios
	P50, P99, RPS      bool // each ratio within AgreementTolerance of real time's
	Verdict            bool // the same verdict
	P50Off, P99Off     float64
	RPSOff             float64
	PolicyName, Versus string
}

// Agrees reports whether every ratio and the verdict agree.
func (a Agreement) Agrees() bool { return a.P50 && a.P99 && a.RPS && a.Verdict }

// Agree judges the simulator's ratios against real time's.
func Agree(sim, real Ratios) Agreement {
	off := func(s, r float64) float64 { return s/r - 1 }
	a := Agreement{Sim: sim, Real: real, P50Off: off(sim.P50, real.P50), P99Off: off(sim.P99, real.P99), RPSOff: off(sim.RPS, real.RPS)}
	a.P50 = math.Abs(a.P50Off) <= AgreementTolerance
	a.P99 = math.Abs(a.P99Off) <= AgreementTolerance
	a.RPS = math.Abs(a.RPSOff) <= AgreementTolerance
	a.Verdict = sim.Dominated == real.Dominated
	return a
}

// WriteRatios prints a pair's ratios and verdict on one line.
func WriteRatios(w io.Writer, policy, baseline string, r Ratios) {
	verdict := "not dominated"
	if r.Dominated {
		verdict = "DOMINATED"
	}
	fmt.Fprintf(w, "  %s / %s over %d rounds: TTFT p50 %.2f (%.2f-%.2f), p99 %.2f (%.2f-%.2f), requests/s %.2f (%.2f-%.2f); medians %.1f/%.0f/%.1f against %.1f/%.0f/%.1f: %s\n",
		policy, baseline, r.Rounds, r.P50, r.P50Lo, r.P50Hi, r.P99, r.P99Lo, r.P99Hi, r.RPS, r.RPSLo, r.RPSHi,
		r.PolicyMed.P50, r.PolicyMed.P99, r.PolicyMed.RPS, r.BaselineMed.P50, r.BaselineMed.P99, r.BaselineMed.RPS, verdict)
}

// WriteAgreement prints the simulator's ratios against real time's.
func WriteAgreement(w io.Writer, a Agreement) {
	mark := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "NO"
	}
	dom := func(d bool) string {
		if d {
			return "dominated"
		}
		return "not dominated"
	}
	fmt.Fprintf(w, "  %s / %s: TTFT p50 sim %.2f real %.2f (%+.0f%% %s), p99 sim %.2f real %.2f (%+.0f%% %s), requests/s sim %.2f real %.2f (%+.0f%% %s); verdict sim %s, real %s (%s)\n",
		a.PolicyName, a.Versus, a.Sim.P50, a.Real.P50, 100*a.P50Off, mark(a.P50), a.Sim.P99, a.Real.P99, 100*a.P99Off, mark(a.P99),
		a.Sim.RPS, a.Real.RPS, 100*a.RPSOff, mark(a.RPS), dom(a.Sim.Dominated), dom(a.Real.Dominated), mark(a.Verdict))
}

func medRound(rs []Round) Round {
	var a, b, c []float64
	for _, r := range rs {
		a, b, c = append(a, r.P50), append(b, r.P99), append(c, r.RPS)
	}
	m1, _, _ := medSpan(a)
	m2, _, _ := medSpan(b)
	m3, _, _ := medSpan(c)
	return Round{m1, m2, m3}
}

// medSpan is the median of xs (the mean of the middle two for an even count) and its range.
func medSpan(xs []float64) (med, lo, hi float64) {
	if len(xs) == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	med = s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return med, s[0], s[len(s)-1]
}

// FitTransit fits a Transit to real-time decision records (the demo's -diagnose -decisions):
// Router the median of send to decision (kv_cache_aware's records, the only ones with a
// decision time; else 0.4 of the shorter prompts' send to arrival), Proxy and PerKChar a line
// through the medians of send to arrival of the shorter and the longer half of the prompts
// (by chars), Back the median of the first and the last token's way back, Sigma the log
// deviation of every delay over its half's median (from the 50th to the 90th percentile of a
// normal), and Extra the quantiles of what each delay adds to that median.
func FitTransit(recs []*DecisionRecord) (Transit, error) {
	type hop struct{ chars, before float64 }
	var hops []hop
	var decide, back []float64
	for _, r := range recs {
		if r.TTFT <= 0 || r.EngineTTFT <= 0 {
			continue
		}
		chars := float64(r.PromptChars)
		if chars == 0 {
			chars = float64(r.Tokens) * 4
		}
		hops = append(hops, hop{chars, float64(r.At - r.Sent)})
		if r.Decided > 0 {
			decide = append(decide, float64(r.Decided-r.Sent))
		}
		back = append(back, float64(r.Sent+r.TTFT-r.At-r.EngineTTFT))
		if r.Done > 0 && r.EngineDone > 0 {
			back = append(back, float64(r.Done-r.EngineDone))
		}
	}
	if len(hops) < 20 {
		return Transit{}, fmt.Errorf("fit transit: %d answered requests: too few", len(hops))
	}
	slices.SortFunc(hops, func(a, b hop) int { return cmp.Compare(a.chars, b.chars) })
	var small, large, smallChars, largeChars []float64
	for i, h := range hops {
		if i < len(hops)/2 {
			small, smallChars = append(small, h.before), append(smallChars, h.chars)
		} else {
			large, largeChars = append(large, h.before), append(largeChars, h.chars)
		}
	}
	s50, _, _ := medSpan(small)
	l50, _, _ := medSpan(large)
	sc, _, _ := medSpan(smallChars)
	lc, _, _ := medSpan(largeChars)
	b50, _, _ := medSpan(back)
	t := Transit{Back: time.Duration(b50)}
	router := 0.4 * s50
	if len(decide) >= 10 {
		router, _, _ = medSpan(decide)
	}
	router = min(router, s50)
	t.Router = time.Duration(router)
	if lc > sc {
		t.PerKChar = time.Duration(max(0, (l50-s50)/((lc-sc)/1000)))
	}
	t.Proxy = time.Duration(max(0, s50-router-float64(t.PerKChar)*sc/1000))
	var logs, extra []float64
	for _, g := range [][]float64{small, large, back} {
		m, _, _ := medSpan(g)
		for _, v := range g {
			if v > 0 && m > 0 {
				logs = append(logs, math.Log(v/m))
			}
			extra = append(extra, max(0, v-m))
		}
	}
	slices.Sort(logs)
	slices.Sort(extra)
	t.Sigma = logs[int(0.9*float64(len(logs)))] / 1.2816
	// 101 ranks at the middles of equal shares: the top is the 99.5th percentile, not the
	// one worst delay of the series.
	t.Extra = make([]time.Duration, 101)
	for i := range t.Extra {
		t.Extra[i] = time.Duration(extra[min(len(extra)-1, (2*i+1)*len(extra)/202)])
	}
	return t, nil
}

// String writes the transit as DemoTransit's fields.
func (t Transit) String() string {
	s := fmt.Sprintf("router %v, proxy %v + %v per 1,000 chars, back %v, sigma %.2f", t.Router, t.Proxy, t.PerKChar, t.Back, t.Sigma)
	if n := len(t.Extra); n > 0 {
		s += fmt.Sprintf(", added p50 %v p75 %v p90 %v p99 %v max %v", t.Extra[n/2], t.Extra[3*n/4], t.Extra[9*n/10], t.Extra[99*n/100], t.Extra[n-1])
	}
	return s
}
