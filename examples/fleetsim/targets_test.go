package fleetsim

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

func TestDominates(t *testing.T) {
	p := Median{P50: 100, P99: 1000, Goodput: 10}
	cases := []struct {
		b    Median
		want bool
	}{
		{Median{P50: 100, P99: 1000, Goodput: 10}, false},  // equal
		{Median{P50: 99, P99: 1000, Goodput: 10}, false},   // better by 1% only
		{Median{P50: 97, P99: 1000, Goodput: 10}, true},    // better by 3% on one, as good on the rest
		{Median{P50: 50, P99: 1001, Goodput: 20}, false},   // worse on one
		{Median{P50: 100, P99: 1000, Goodput: 10.3}, true}, // goodput 3% higher
	}
	for _, c := range cases {
		if got := Dominates(c.b, p); got != c.want {
			t.Errorf("Dominates(%+v, %+v) = %v, want %v", c.b, p, got, c.want)
		}
	}
}

// TestAssess judges a card written and read back: medians over seeds, the best baseline per
// figure, dominance and the summaries.
func TestAssess(t *testing.T) {
	fig := func(hit, p50, p99, good float64) *Figures {
		return &Figures{HitRatio: Num(hit), TTFTP50: Num(p50), TTFTP99: Num(p99), Goodput: Num(good),
			E2EP99: Num(math.NaN()), Throughput: Num(good), Imbalance: 1, QueueWaitP99: 0, Shed: 0}
	}
	card := &Card{Default: "thresholds"}
	for seed, k := range []float64{1, 1.1, 0.9} { // medians are the k=1 seed's figures
		card.Scenarios = append(card.Scenarios,
			&ScenarioResult{Name: "a", Seed: seed + 1, SLO: 40, Policies: map[string]*Figures{
				"kv_cache_aware": fig(0.80, 20*k, 80*k, 10*k),
				"sglang":         fig(0.81, 20*k, 100*k, 9*k),
				"least_conn":     fig(0.60, 30*k, 90*k, 8*k),
				"round_robin":    fig(0.60, 30*k, 200*k, 7*k),
				"prefix_hash":    fig(0.70, 25*k, 120*k, 9.5*k),
				"oracle":         fig(0.80, 20*k, 40*k, 12.5*k),
			}},
			&ScenarioResult{Name: "b", Seed: seed + 1, SLO: 40, Policies: map[string]*Figures{
				"kv_cache_aware": fig(0.50, 200*k, 1000*k, 2*k),
				"sglang":         fig(0.50, 100*k, 900*k, 3*k), // dominates
				"least_conn":     fig(0.10, 150*k, 2000*k, 2*k),
				"round_robin":    fig(0.10, 150*k, 2000*k, 2*k),
				"prefix_hash":    fig(0.10, 150*k, 2000*k, 2*k),
				"oracle":         fig(0.50, 100*k, 800*k, 4*k),
			}})
	}
	js, err := card.JSON()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "scorecard.json")
	if err := writeFile(path, js); err != nil {
		t.Fatal(err)
	}
	read, err := ReadCard(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Assess(read, nil, "kv_cache_aware")
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Rows) != 2 || a.Rows[0].Seeds != 3 {
		t.Fatalf("rows %+v", a.Rows)
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	r := a.Rows[0]
	near("a: p99/best", r.P99Ratio(), 80.0/90)
	near("a: goodput/best", r.GoodRatio(), 10/9.5)
	near("a: hit diff", r.HitDelta(), -0.01)
	if r.BestBy[2] != "least_conn" || r.BestBy[3] != "prefix_hash" || len(r.DominatedBy) != 0 {
		t.Errorf("a: best by %v, dominated by %v", r.BestBy, r.DominatedBy)
	}
	if d := a.Rows[1].DominatedBy; len(d) != 1 || d[0] != "sglang" {
		t.Errorf("b: dominated by %v, want [sglang]", d)
	}
	near("p99 geomean", a.P99Geo, math.Sqrt(80.0/90*1000.0/900))
	near("goodput geomean", a.GoodGeo, math.Sqrt(10/9.5*2.0/3))
	near("oracle goodput geomean", a.OracleGood, math.Sqrt(10/12.5*2.0/4))
	if a.Dominated != 1 || a.HitOK != 1 || a.P99MaxAt != "b" || a.GoodMinAt != "b" {
		t.Errorf("dominated %d, hit ok %d, p99 max at %s, goodput min at %s", a.Dominated, a.HitOK, a.P99MaxAt, a.GoodMinAt)
	}
	if m := a.Met(); m != [7]bool{false, false, false, false, false, false, false} {
		t.Errorf("met %v, want none", m)
	}
	// A card of kvroute's policy alone is judged against a base card's baselines.
	only := &Card{}
	for _, s := range read.Scenarios {
		only.Scenarios = append(only.Scenarios, &ScenarioResult{Name: s.Name, Seed: s.Seed,
			Policies: map[string]*Figures{"kv_cache_aware": s.Policies["kv_cache_aware"]}})
	}
	if _, err := Assess(only, nil, "kv_cache_aware"); err == nil {
		t.Error("a card without baselines was judged")
	}
	b, err := Assess(only, read, "kv_cache_aware")
	if err != nil {
		t.Fatal(err)
	}
	near("with a base: p99 geomean", b.P99Geo, a.P99Geo)
}

func writeFile(path string, b []byte) error { return os.WriteFile(path, b, 0o644) }
