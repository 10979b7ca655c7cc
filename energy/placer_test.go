package energy

import (
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"testing"
)

func energyCand(t testing.TB, e string, inFlight int) Candidate {
	t.Helper()
	return Candidate{Profile: &Profile{EnergyPerToken: mustJoules(t, e)}, InFlight: inFlight}
}

func TestParseStrategy(t *testing.T) {
	for _, s := range []Strategy{Joule, Carbon, LeastBusy, RoundRobin, Random} {
		got, err := ParseStrategy(s.String())
		if err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %v, %v", s.String(), got, err)
		}
	}
	for _, s := range []string{"", "Joule", "least-busy", "fastest"} {
		if _, err := ParseStrategy(s); err == nil {
			t.Errorf("ParseStrategy(%q) succeeded, want error", s)
		}
	}
	if got := Strategy(42).String(); got != "strategy(42)" {
		t.Errorf("String of unknown strategy = %q", got)
	}

	var cfg struct{ Fallback Strategy }
	if err := json.Unmarshal([]byte(`{"Fallback":"least_busy"}`), &cfg); err != nil || cfg.Fallback != LeastBusy {
		t.Errorf("Unmarshal strategy = %v, %v", cfg.Fallback, err)
	}
	if b, err := json.Marshal(cfg); err != nil || string(b) != `{"Fallback":"least_busy"}` {
		t.Errorf("Marshal strategy = %s, %v", b, err)
	}
}

func TestBusyness(t *testing.T) {
	if got := Busyness(2, 30); math.Abs(got-11) > 1e-12 {
		t.Errorf("Busyness(2, 30) = %v, want 11", got)
	}
}

func TestPlace(t *testing.T) {
	carbon := func(e string, ci float64, inFlight int) Candidate {
		c := energyCand(t, e, inFlight)
		c.Profile.CarbonIntensity = ci
		return c
	}
	tests := []struct {
		name     string
		strategy Strategy
		cands    []Candidate
		want     int
	}{
		{"joule picks the most efficient", Joule,
			[]Candidate{energyCand(t, "200uJ", 0), energyCand(t, "50uJ", 5), energyCand(t, "150uJ", 0)}, 1},
		{"joule breaks ties by busyness", Joule,
			[]Candidate{energyCand(t, "50uJ", 3), energyCand(t, "50uJ", 1), energyCand(t, "200uJ", 0)}, 1},
		{"joule busyness counts queued tokens", Joule,
			[]Candidate{{Profile: &Profile{EnergyPerToken: 1e-4}, InFlight: 1, QueuedTokens: 4000}, {Profile: &Profile{EnergyPerToken: 1e-4}, InFlight: 2}}, 1},
		{"carbon breaks joule ties by grid intensity", Carbon,
			[]Candidate{carbon("100uJ", 400, 0), carbon("100uJ", 56, 3), carbon("100uJ", 200, 0)}, 1},
		{"carbon trades energy for intensity", Carbon,
			[]Candidate{carbon("100uJ", 400, 0), carbon("150uJ", 56, 0)}, 1},
		{"carbon without intensities ranks by energy", Carbon,
			[]Candidate{energyCand(t, "100uJ", 0), energyCand(t, "60uJ", 9)}, 1},
		{"carbon without energies ranks by intensity", Carbon,
			[]Candidate{{Profile: &Profile{CarbonIntensity: 300}}, {Profile: &Profile{CarbonIntensity: 30}, InFlight: 4}}, 1},
		{"carbon unknown intensity is the mean", Carbon,
			// mean intensity 250: 100µJ×250 beats 80µJ×400 and 300µJ×100
			[]Candidate{carbon("80uJ", 400, 0), energyCand(t, "100uJ", 0), carbon("300uJ", 100, 0)}, 1},
		{"unknown energy is the mean: loses to a cheaper one", Joule,
			[]Candidate{energyCand(t, "300uJ", 0), {}, energyCand(t, "100uJ", 4)}, 2},
		{"unknown energy is the mean: beats a dearer one", Joule,
			[]Candidate{energyCand(t, "300uJ", 0), {Profile: &Profile{Zone: "x"}, InFlight: 7}, energyCand(t, "100uJ", 4), energyCand(t, "400uJ", 0)}, 2},
		{"unknown energy is the mean: ties go to the less busy", Joule,
			[]Candidate{energyCand(t, "100uJ", 3), {InFlight: 0}}, 1},
		{"no annotations: busyness", Joule,
			[]Candidate{{InFlight: 3}, {InFlight: 1, QueuedTokens: 10}, {InFlight: 2}}, 1},
		{"no annotations: carbon by busyness", Carbon,
			[]Candidate{{Profile: &Profile{Zone: "a"}, InFlight: 3}, {InFlight: 0}}, 1},
		{"least busy picks the idle one", LeastBusy,
			[]Candidate{energyCand(t, "1uJ", 2), {InFlight: 0}, {InFlight: 1}}, 1},
		{"least busy weighs queued tokens", LeastBusy,
			[]Candidate{{InFlight: 1, QueuedTokens: 100}, {InFlight: 2}}, 1},
		{"joule ties on cost and busyness: least cached", Joule,
			[]Candidate{{Profile: &Profile{EnergyPerToken: 1e-4}, CachedTokens: 900}, {Profile: &Profile{EnergyPerToken: 1e-4}, CachedTokens: 100}, {Profile: &Profile{EnergyPerToken: 1e-4}, CachedTokens: 500}}, 1},
		{"no annotations, equally busy: least cached", Joule,
			[]Candidate{{InFlight: 1, CachedTokens: 7000}, {InFlight: 1, CachedTokens: 20}, {InFlight: 2}}, 1},
		{"least busy ties: least cached", LeastBusy,
			[]Candidate{{CachedTokens: 50}, {CachedTokens: 10}}, 1},
		{"busyness beats cached tokens", LeastBusy,
			[]Candidate{{InFlight: 1}, {CachedTokens: 1 << 30}}, 1},
		{"single candidate", Joule, []Candidate{{}}, 0},
		{"unknown strategy places like least busy", Strategy(99),
			[]Candidate{{InFlight: 2}, {InFlight: 1}}, 1},
	}
	for _, tt := range tests {
		p := NewPlacer(tt.strategy)
		for range 20 { // deterministic answers must not depend on the coin
			if got := p.Place(tt.cands, 256); got != tt.want {
				t.Errorf("%s: Place = %d, want %d", tt.name, got, tt.want)
				break
			}
		}
	}
}

func TestPlaceEmpty(t *testing.T) {
	for _, s := range []Strategy{Joule, Carbon, LeastBusy, RoundRobin, Random} {
		if got := NewPlacer(s).Place(nil, 10); got != -1 {
			t.Errorf("%v: Place(nil) = %d, want -1", s, got)
		}
	}
}

func TestPlaceZeroTokens(t *testing.T) {
	cands := []Candidate{energyCand(t, "200uJ", 0), energyCand(t, "50uJ", 3)}
	for _, n := range []int{0, -1} {
		if got := NewPlacer(Joule).Place(cands, n); got != 1 {
			t.Errorf("Place(expectedTokens=%d) = %d, want the efficient one", n, got)
		}
	}
}

func TestRoundRobinCycles(t *testing.T) {
	p := NewPlacer(RoundRobin)
	cands := make([]Candidate, 3)
	prev := p.Place(cands, 1)
	for range 10 {
		got := p.Place(cands, 1)
		if got != (prev+1)%3 {
			t.Fatalf("round robin went from %d to %d", prev, got)
		}
		prev = got
	}
	var zero Placer // the zero value is usable
	if got := zero.Place(cands, 1); got < 0 || got > 2 {
		t.Errorf("zero Placer: Place = %d", got)
	}
}

// TestTiesSpread checks that tied candidates share the work evenly. The
// tolerance is about six standard deviations: a fair coin passes, while a
// bias towards index 0 (or any index) fails.
func TestTiesSpread(t *testing.T) {
	same := func(e string) []Candidate {
		c := make([]Candidate, 4)
		for i := range c {
			if e != "" {
				c[i] = energyCand(t, e, 1)
			} else {
				c[i] = Candidate{InFlight: 1}
			}
			c[i].QueuedTokens = 30
		}
		return c
	}
	// Mixed annotations that tie through the mean, plus a loser that must
	// never be chosen.
	viaMean := []Candidate{energyCand(t, "100uJ", 1), {InFlight: 1}, energyCand(t, "100uJ", 1), energyCand(t, "100uJ", 2)}
	// Scores that are equal only up to float rounding still tie.
	rounding := []Candidate{
		{Profile: &Profile{EnergyPerToken: 0.1 + 0.2}, InFlight: 1},
		{Profile: &Profile{EnergyPerToken: 0.3}, InFlight: 1},
	}

	tests := []struct {
		name     string
		strategy Strategy
		cands    []Candidate
		tied     int // the first tied candidates share the work, the rest get none
	}{
		{"joule", Joule, same("150uJ"), 4},
		{"carbon", Carbon, same("150uJ"), 4},
		{"no annotations", Joule, same(""), 4},
		{"least busy", LeastBusy, same(""), 4},
		{"random", Random, same(""), 4},
		{"round robin", RoundRobin, same(""), 4},
		{"unknown counts as the mean", Joule, viaMean, 3},
		{"float rounding", Joule, rounding, 2},
	}
	const n = 40000
	for _, tt := range tests {
		p := NewPlacer(tt.strategy)
		counts := make([]int, len(tt.cands))
		for range n {
			counts[p.Place(tt.cands, 100)]++
		}
		want := float64(n) / float64(tt.tied)
		tol := 6 * math.Sqrt(want*(1-1/float64(tt.tied)))
		for i, c := range counts {
			if i >= tt.tied {
				if c != 0 {
					t.Errorf("%s: candidate %d won %d times, want 0 (counts %v)", tt.name, i, c, counts)
				}
				continue
			}
			if math.Abs(float64(c)-want) > tol {
				t.Errorf("%s: candidate %d won %d of %d, want %.0f±%.0f (counts %v)", tt.name, i, c, n, want, tol, counts)
			}
		}
	}
}

func TestPlaceConcurrent(t *testing.T) {
	cands := []Candidate{energyCand(t, "100uJ", 0), energyCand(t, "100uJ", 0), {}}
	for _, s := range []Strategy{Joule, Carbon, LeastBusy, RoundRobin, Random} {
		p := NewPlacer(s)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 1000 {
					if i := p.Place(cands, 10); i < 0 || i >= len(cands) {
						t.Errorf("%v: Place = %d", s, i)
						return
					}
				}
			})
		}
		wg.Wait()
	}
}

func TestPlaceDoesNotAllocate(t *testing.T) {
	cands := benchCandidates(16)
	for _, s := range []Strategy{Joule, Carbon, LeastBusy, RoundRobin, Random} {
		p := NewPlacer(s)
		if a := testing.AllocsPerRun(100, func() { p.Place(cands, 256) }); a != 0 {
			t.Errorf("%v: Place allocates %v times per call", s, a)
		}
	}
}

// benchCandidates returns n candidates, a quarter unannotated, with load
// and several exact ties, as a mixed fleet looks.
func benchCandidates(n int) []Candidate {
	cands := make([]Candidate, n)
	for i := range cands {
		c := Candidate{InFlight: i % 3, QueuedTokens: int64(100 * (i % 2))}
		if i%4 != 3 {
			c.Profile = &Profile{
				EnergyPerToken:  Joules(float64(50+50*(i%3)) * 1e-6),
				CarbonIntensity: float64(56 + 100*(i%2)),
			}
		}
		cands[i] = c
	}
	return cands
}

func BenchmarkPlace(b *testing.B) {
	for _, n := range []int{4, 16} {
		cands := benchCandidates(n)
		for _, s := range []Strategy{Joule, Carbon, LeastBusy, RoundRobin, Random} {
			p := NewPlacer(s)
			b.Run(fmt.Sprintf("%v/n=%d", s, n), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if p.Place(cands, 256) < 0 {
							b.Fatal("no placement")
						}
					}
				})
			})
		}
	}
}

func BenchmarkParseJoules(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseJoules("150uJ"); err != nil {
			b.Fatal(err)
		}
	}
}
