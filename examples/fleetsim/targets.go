package fleetsim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/kvroute/caddy-kvroute/kvroute/decide"
)

// Issue 34's targets, judged on a scorecard the same way for every change: per scenario, the
// median over seeds of each figure of one policy (kv_cache_aware unless told otherwise)
// against the best baseline of that scenario on that figure (BaselineNames), and against the
// greedy oracle.
//
//   - never dominated: no baseline is at least as good on TTFT p50, TTFT p99 and goodput
//     together and better by more than DominanceMargin on one of them;
//   - TTFT p99: geometric mean of the ratios to the best baseline's ≤ 0.85, none above 1.05;
//   - goodput: geometric mean of the ratios ≥ 1.05, none below 0.97;
//   - hit ratio ≥ sglang's − 0.005 in at least 75% of the scenarios;
//   - goodput: geometric mean of the ratios to the oracle's ≥ 0.85 (TTFT p50 and p99 shown).

// BaselineNames are the baselines the targets compare with (never the oracle).
var BaselineNames = []string{"sglang", "least_conn", "round_robin", "prefix_hash"}

// Targets' thresholds (issue 34).
const (
	DominanceMargin = 0.02
	TargetP99Geo    = 0.85
	TargetP99Max    = 1.05
	TargetGoodGeo   = 1.05
	TargetGoodMin   = 0.97
	TargetHitSlack  = 0.005
	TargetHitShare  = 0.75
	TargetOracleGeo = 0.85
)

// Median are one policy's figures on one scenario, each the median over the seeds (NaN where
// no seed has it).
type Median struct {
	Hit, P50, P99, Goodput float64
}

// TargetRow is one scenario of an Assessment.
type TargetRow struct {
	Scenario string
	Seeds    int
	P        Median // the policy assessed
	// Best is the best baseline per figure (highest hit and goodput, lowest TTFTs), BestBy
	// who has it (hit, p50, p99, goodput).
	Best   Median
	BestBy [4]string
	SGLang Median
	Oracle Median
	// DominatedBy names the baselines that dominate the policy.
	DominatedBy []string
}

// P99Ratio, GoodRatio: the policy's against the best baseline's; HitDelta: against sglang's.
func (r *TargetRow) P99Ratio() float64  { return r.P.P99 / r.Best.P99 }
func (r *TargetRow) GoodRatio() float64 { return r.P.Goodput / r.Best.Goodput }
func (r *TargetRow) HitDelta() float64  { return r.P.Hit - r.SGLang.Hit }

// Assessment is a policy's standing against issue 34's targets on one card.
type Assessment struct {
	Policy string
	Rows   []TargetRow
	// Summaries over the scenarios.
	Dominated                 int
	P99Geo, P99Max            float64
	P99MaxAt                  string
	GoodGeo, GoodMin          float64
	GoodMinAt                 string
	HitOK                     int
	OracleGood, OracleP50     float64
	OracleP99                 float64
	OracleGoodMin             float64
	OracleGoodMinAt, Problems string
}

// ReadCard reads a scorecard.json: every figure, each class's included (null: NaN).
func ReadCard(path string) (*Card, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c Card
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	// The policies in the order a card runs them (kvroute's, kv_flow beside kv_cache_aware,
	// the baselines), then any other by name.
	rank := map[string]int{}
	for i, p := range Policies {
		rank[p.Name] = 2 * i
	}
	rank[FlowPolicy(decide.DefaultRule).Name] = rank["kv_cache_aware"] + 1
	seen := map[string]bool{}
	for _, s := range c.Scenarios {
		if s == nil || s.Policies == nil {
			return nil, fmt.Errorf("%s: a scenario without policies", path)
		}
		for p, f := range s.Policies {
			if f == nil {
				return nil, fmt.Errorf("%s: %s seed %d: policy %s without figures", path, s.Name, s.Seed, p)
			}
			if !seen[p] {
				seen[p] = true
				c.order = append(c.order, p)
			}
		}
	}
	slices.SortFunc(c.order, func(a, b string) int {
		ra, oka := rank[a]
		rb, okb := rank[b]
		switch {
		case oka && okb:
			return ra - rb
		case oka != okb:
			if oka {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return &c, nil
}

// medians returns, per scenario name (in the card's order) and policy, the median figures.
func (c *Card) medians() (names []string, seeds map[string]int, med map[string]map[string]Median) {
	type acc struct{ hit, p50, p99, good []float64 }
	all := map[string]map[string]*acc{}
	seeds = map[string]int{}
	for _, s := range c.Scenarios {
		if all[s.Name] == nil {
			all[s.Name] = map[string]*acc{}
			names = append(names, s.Name)
		}
		seeds[s.Name]++
		for p, f := range s.Policies {
			a := all[s.Name][p]
			if a == nil {
				a = &acc{}
				all[s.Name][p] = a
			}
			a.hit = append(a.hit, float64(f.HitRatio))
			a.p50 = append(a.p50, float64(f.TTFTP50))
			a.p99 = append(a.p99, float64(f.TTFTP99))
			a.good = append(a.good, float64(f.Goodput))
		}
	}
	med = map[string]map[string]Median{}
	for n, ps := range all {
		med[n] = map[string]Median{}
		for p, a := range ps {
			med[n][p] = Median{median(a.hit), median(a.p50), median(a.p99), median(a.good)}
		}
	}
	return names, seeds, med
}

// median of the defined values of v (the lower middle of an even count's two: the mean);
// NaN when none is.
func median(v []float64) float64 {
	var d []float64
	for _, x := range v {
		if !math.IsNaN(x) {
			d = append(d, x)
		}
	}
	if len(d) == 0 {
		return math.NaN()
	}
	slices.Sort(d)
	if len(d)%2 == 1 {
		return d[len(d)/2]
	}
	return (d[len(d)/2-1] + d[len(d)/2]) / 2
}

// Assess judges policy on card against issue 34's targets. Baselines and the oracle missing
// from card (a card that ran kvroute's policies only) are taken from base, when given.
func Assess(card, base *Card, policy string) (*Assessment, error) {
	names, seeds, med := card.medians()
	var bmed map[string]map[string]Median
	if base != nil {
		_, _, bmed = base.medians()
	}
	fig := func(scen, p string) (Median, bool) {
		if m, ok := med[scen][p]; ok {
			return m, true
		}
		m, ok := bmed[scen][p]
		return m, ok
	}
	a := &Assessment{Policy: policy}
	var p99s, goods, ogood, op50, op99 []float64
	a.P99Max, a.GoodMin, a.OracleGoodMin = math.Inf(-1), math.Inf(1), math.Inf(1)
	for _, n := range names {
		pm, ok := med[n][policy]
		if !ok {
			continue
		}
		row := TargetRow{Scenario: n, Seeds: seeds[n], P: pm,
			Best: Median{math.Inf(-1), math.Inf(1), math.Inf(1), math.Inf(-1)}}
		for _, b := range BaselineNames {
			bm, ok := fig(n, b)
			if !ok {
				return nil, fmt.Errorf("%s: no figures for baseline %s (give a base card that has them)", n, b)
			}
			if bm.Hit > row.Best.Hit {
				row.Best.Hit, row.BestBy[0] = bm.Hit, b
			}
			if bm.P50 < row.Best.P50 {
				row.Best.P50, row.BestBy[1] = bm.P50, b
			}
			if bm.P99 < row.Best.P99 {
				row.Best.P99, row.BestBy[2] = bm.P99, b
			}
			if bm.Goodput > row.Best.Goodput {
				row.Best.Goodput, row.BestBy[3] = bm.Goodput, b
			}
			if Dominates(bm, pm) {
				row.DominatedBy = append(row.DominatedBy, b)
			}
		}
		row.SGLang, _ = fig(n, "sglang")
		row.Oracle, _ = fig(n, "oracle")
		if len(row.DominatedBy) > 0 {
			a.Dominated++
		}
		if r := row.P99Ratio(); r > a.P99Max {
			a.P99Max, a.P99MaxAt = r, n
		}
		if r := row.GoodRatio(); r < a.GoodMin {
			a.GoodMin, a.GoodMinAt = r, n
		}
		if r := pm.Goodput / row.Oracle.Goodput; r < a.OracleGoodMin {
			a.OracleGoodMin, a.OracleGoodMinAt = r, n
		}
		if row.HitDelta() >= -TargetHitSlack-1e-9 {
			a.HitOK++
		}
		p99s = append(p99s, row.P99Ratio())
		goods = append(goods, row.GoodRatio())
		ogood = append(ogood, pm.Goodput/row.Oracle.Goodput)
		op50 = append(op50, pm.P50/row.Oracle.P50)
		op99 = append(op99, pm.P99/row.Oracle.P99)
		a.Rows = append(a.Rows, row)
	}
	if len(a.Rows) == 0 {
		return nil, fmt.Errorf("no scenario has policy %s", policy)
	}
	a.P99Geo, a.GoodGeo = geomean(p99s), geomean(goods)
	a.OracleGood, a.OracleP50, a.OracleP99 = geomean(ogood), geomean(op50), geomean(op99)
	return a, nil
}

// Dominates reports whether b is at least as good as p on TTFT p50, TTFT p99 and goodput
// together and better by more than DominanceMargin on one of them.
func Dominates(b, p Median) bool {
	if !(b.P50 <= p.P50 && b.P99 <= p.P99 && b.Goodput >= p.Goodput) {
		return false
	}
	return b.P50 < p.P50*(1-DominanceMargin) || b.P99 < p.P99*(1-DominanceMargin) ||
		b.Goodput > p.Goodput*(1+DominanceMargin)
}

// geomean is the geometric mean of the positive finite values of v.
func geomean(v []float64) float64 {
	s, n := 0.0, 0
	for _, x := range v {
		if x > 0 && !math.IsInf(x, 0) {
			s += math.Log(x)
			n++
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return math.Exp(s / float64(n))
}

// Met reports each target: never dominated, p99 geomean, p99 max, goodput geomean, goodput
// min, hit share, goodput against the oracle.
func (a *Assessment) Met() [7]bool {
	n := float64(len(a.Rows))
	return [7]bool{
		a.Dominated == 0,
		a.P99Geo <= TargetP99Geo,
		a.P99Max <= TargetP99Max,
		a.GoodGeo >= TargetGoodGeo,
		a.GoodMin >= TargetGoodMin,
		float64(a.HitOK) >= TargetHitShare*n-1e-9,
		a.OracleGood >= TargetOracleGeo,
	}
}

func yes(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// Write prints the assessment: a row per scenario, then the targets.
func (a *Assessment) Write(w io.Writer) {
	fmt.Fprintf(w, "%s (medians over seeds): hit / TTFT p50 ms / p99 ms / goodput; ratios to the best baseline per figure\n", a.Policy)
	fmt.Fprintf(w, "%-20s %-31s %-16s %-16s %8s %-22s %s\n", "scenario", "policy", "p99/best", "good/best", "hit-sgl", "vs oracle p50/p99/good", "dominated by")
	for i := range a.Rows {
		r := &a.Rows[i]
		dom := strings.Join(r.DominatedBy, ",")
		if dom == "" {
			dom = "-"
		}
		fmt.Fprintf(w, "%-20s %5.3f/%6.0f/%7.0f/%7.2f  %5.2f %-10s %5.2f %-10s %+8.3f %5.2f/%5.2f/%5.2f       %s\n",
			r.Scenario, r.P.Hit, r.P.P50, r.P.P99, r.P.Goodput,
			r.P99Ratio(), r.BestBy[2], r.GoodRatio(), r.BestBy[3], r.HitDelta(),
			r.P.P50/r.Oracle.P50, r.P.P99/r.Oracle.P99, r.P.Goodput/r.Oracle.Goodput, dom)
	}
	m := a.Met()
	n := len(a.Rows)
	fmt.Fprintf(w, "targets (%d scenarios):\n", n)
	fmt.Fprintf(w, "  never dominated:           %d dominated                         %s\n", a.Dominated, yes(m[0]))
	fmt.Fprintf(w, "  TTFT p99 geomean <= %.2f:   %.3f                                %s\n", TargetP99Geo, a.P99Geo, yes(m[1]))
	fmt.Fprintf(w, "  TTFT p99 max <= %.2f:       %.3f (%s)                  %s\n", TargetP99Max, a.P99Max, a.P99MaxAt, yes(m[2]))
	fmt.Fprintf(w, "  goodput geomean >= %.2f:    %.3f                                %s\n", TargetGoodGeo, a.GoodGeo, yes(m[3]))
	fmt.Fprintf(w, "  goodput min >= %.2f:        %.3f (%s)                  %s\n", TargetGoodMin, a.GoodMin, a.GoodMinAt, yes(m[4]))
	fmt.Fprintf(w, "  hit >= sglang-%.3f:        %d of %d (need %.0f%%)                 %s\n", TargetHitSlack, a.HitOK, n, TargetHitShare*100, yes(m[5]))
	fmt.Fprintf(w, "  goodput/oracle geomean >= %.2f: %.3f (min %.3f %s); TTFT p50 %.3f, p99 %.3f x oracle  %s\n",
		TargetOracleGeo, a.OracleGood, a.OracleGoodMin, a.OracleGoodMinAt, a.OracleP50, a.OracleP99, yes(m[6]))
}

// WriteDiff prints two assessments of the same policy side by side, per scenario: before and
// after on each figure, and the after/before ratio.
func WriteDiff(w io.Writer, before, after *Assessment) {
	fmt.Fprintf(w, "%-20s %-31s %-31s %s\n", "scenario", "before hit/p50/p99/goodput", "after", "after/before p50 p99 goodput, hit diff")
	idx := map[string]*TargetRow{}
	for i := range before.Rows {
		idx[before.Rows[i].Scenario] = &before.Rows[i]
	}
	for i := range after.Rows {
		r := &after.Rows[i]
		b := idx[r.Scenario]
		if b == nil {
			continue
		}
		mark := ""
		if len(b.DominatedBy) > 0 || len(r.DominatedBy) > 0 {
			mark = fmt.Sprintf("  dominated: %v -> %v", b.DominatedBy, r.DominatedBy)
		}
		fmt.Fprintf(w, "%-20s %5.3f/%6.0f/%7.0f/%7.2f   %5.3f/%6.0f/%7.0f/%7.2f   %5.2f %5.2f %5.2f %+6.3f%s\n", r.Scenario,
			b.P.Hit, b.P.P50, b.P.P99, b.P.Goodput, r.P.Hit, r.P.P50, r.P.P99, r.P.Goodput,
			r.P.P50/b.P.P50, r.P.P99/b.P.P99, r.P.Goodput/b.P.Goodput, r.P.Hit-b.P.Hit, mark)
	}
}
