package decide

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvroute/caddy-kvroute/energy"
)

func thresholds() Options {
	return Options{Rule: Thresholds, CacheThreshold: 0.1, BalanceAbs: 4, BalanceRel: 1.5, ExpectedTokens: 256, TTFTSlack: 5}
}

func costOpts() Options {
	o := thresholds()
	o.Rule = Cost
	return o
}

func req(chars int) Request {
	return Request{PromptChars: chars, PromptTokens: int64(chars / 4), CharsPerToken: 4}
}

func joule(uj float64) *energy.Profile {
	return &energy.Profile{EnergyPerToken: energy.Joules(uj * 1e-6)}
}

func TestFilter(t *testing.T) {
	capped := &energy.Profile{MaxConcurrency: 2}
	for _, tc := range []struct {
		name  string
		cands []Candidate
		want  []int // Keys kept
	}{
		{"none out", []Candidate{{Key: 0}, {Key: 1}}, []int{0, 1}},
		{"down out", []Candidate{{Key: 0, Down: true}, {Key: 1}}, []int{1}},
		{"all down stay", []Candidate{{Key: 0, Down: true}, {Key: 1, Down: true}}, []int{0, 1}},
		{"saturated out", []Candidate{{Key: 0, Profile: capped, Load: 2}, {Key: 1, Profile: capped, Load: 1}}, []int{1}},
		{"all saturated stay", []Candidate{{Key: 0, Profile: capped, Load: 2}, {Key: 1, Profile: capped, Load: 3}}, []int{0, 1}},
		{"tried out", []Candidate{{Key: 0, Tried: true}, {Key: 1}, {Key: 2}}, []int{1, 2}},
		// Down first: the one left up is saturated, and stays (it is all there is).
		{"down then saturated", []Candidate{{Key: 0, Down: true}, {Key: 1, Profile: capped, Load: 5}}, []int{1}},
		{"down, saturated, tried", []Candidate{{Key: 0, Down: true}, {Key: 1, Profile: capped, Load: 5}, {Key: 2, Tried: true}, {Key: 3}}, []int{3}},
	} {
		got := Filter(tc.cands)
		var keys []int
		for _, c := range got {
			keys = append(keys, c.Key)
		}
		if len(keys) != len(tc.want) {
			t.Errorf("%s: kept %v, want %v", tc.name, keys, tc.want)
			continue
		}
		for i := range keys {
			if keys[i] != tc.want[i] {
				t.Errorf("%s: kept %v, want %v", tc.name, keys, tc.want)
				break
			}
		}
	}
}

// Decision thresholds, step by step.
func TestDecideThresholds(t *testing.T) {
	leastBusy := thresholds()
	leastBusy.LeastBusyOnImbalance = true
	lb := energy.NewPlacer(energy.LeastBusy)
	leastBusy.Placer = lb
	for _, tc := range []struct {
		name    string
		opts    Options
		req     Request
		cands   []Candidate
		chosen  int
		path    Path
		session SessionOutcome
	}{
		{
			name: "session in band", opts: thresholds(), req: req(1000),
			cands:  []Candidate{{Load: 3, Session: true}, {Load: 0, Match: 900}},
			chosen: 0, path: PathSession, session: SessionKept,
		},
		{
			name: "session out of band: skipped, the prefix decides", opts: thresholds(), req: req(1000),
			cands:  []Candidate{{Load: 5, Session: true}, {Load: 0, Match: 900}, {Load: 0}},
			chosen: 1, path: PathImbalance, session: SessionSkipped,
		},
		{
			name: "imbalance: the longest prefix in band", opts: thresholds(), req: req(1000),
			cands:  []Candidate{{Load: 9, Match: 1000}, {Load: 1, Match: 200}, {Load: 0, Match: 100}},
			chosen: 1, path: PathImbalance,
		},
		{
			name: "imbalance, least_busy", opts: leastBusy, req: req(1000),
			cands:  []Candidate{{Load: 9, Match: 1000}, {Load: 1, Match: 200}, {Load: 0, Match: 100}},
			chosen: 2, path: PathImbalance,
		},
		{
			name: "imbalance, none holds any in band: the least busy", opts: thresholds(), req: req(1000),
			cands:  []Candidate{{Load: 9, Match: 1000}, {Load: 1}, {Load: 0}},
			chosen: 2, path: PathImbalance,
		},
		{
			name: "prefix above cache_threshold", opts: thresholds(), req: req(1000),
			cands:  []Candidate{{Load: 2, Profile: joule(10)}, {Load: 3, Match: 101, Profile: joule(100)}},
			chosen: 1, path: PathPrefixHit,
		},
		{
			name: "prefix at cache_threshold: fallback, the fewest joules", opts: thresholds(), req: req(1000),
			cands:  []Candidate{{Load: 2, Profile: joule(10)}, {Load: 3, Match: 100, Profile: joule(100)}},
			chosen: 0, path: PathFallback,
		},
		{
			name: "fallback least_busy", opts: Options{Rule: Thresholds, BalanceAbs: 4, BalanceRel: 1.5, Placer: lb}, req: req(1000),
			cands:  []Candidate{{Load: 2}, {Load: 1, QueuedTokens: 5}, {Load: 1, QueuedTokens: 50}},
			chosen: 1, path: PathFallback,
		},
		{
			name: "fallback: the adapter warm first", opts: thresholds(), req: Request{PromptChars: 10, PromptTokens: 3, CharsPerToken: 4, Adapter: true},
			cands:  []Candidate{{Profile: joule(10), Adapter: AdapterEvict}, {Profile: joule(100), Adapter: AdapterWarm}, {Profile: joule(50), Adapter: AdapterFreeSlot}},
			chosen: 1, path: PathFallback,
		},
		{
			name: "a Responses follow-up goes where the response is", opts: thresholds(), req: req(1000),
			cands:  []Candidate{{Load: 9, StoredResponse: true}, {Load: 0, Match: 1000}},
			chosen: 0, path: PathSession,
		},
	} {
		s := Snapshot{Now: 1, Request: tc.req, Candidates: tc.cands}
		res := Decide(&tc.opts, &s)
		if res.Chosen != tc.chosen || res.Path != tc.path || res.Session != tc.session {
			t.Errorf("%s: chose %d (%s, session %d), want %d (%s, session %d)", tc.name, res.Chosen, res.Path, res.Session, tc.chosen, tc.path, tc.session)
		}
	}
}

// Decision cost's predictions, term by term.
func TestPredict(t *testing.T) {
	o := costOpts()
	o.Objective = Completion
	now := int64(1000)
	cands := []Candidate{
		// 2,000 queued here, the engine's 3 waiting at 1,000 each are more: 3,000.
		{Match: 2000, Prefill: 2000, Waiting: 3, MeanUncached: 1000, ReadingUntil: now, PrefillSpeed: 4000, Load: 5, Slots: 4, DecodeSpeed: 50, MeanOutput: 100},
		// A stale reading: its waiting, slots and decode speed do not count.
		{Prefill: 100, Waiting: 30, MeanUncached: 1000, ReadingUntil: now - 1, AnswerSpeed: 2000, Load: 9, Slots: 1, DecodeSpeed: 10, MeanOutput: 100},
		// The prior, an adapter to load.
		{Profile: &energy.Profile{PrefillTokensPerSecond: 1000}, Adapter: AdapterFreeSlot, ReadingUntil: now, DecodeSpeed: 20, MeanOutput: 200},
	}
	Predict(&o, &Request{PromptChars: 4000, PromptTokens: 1000, CharsPerToken: 4, MaxTokens: 1000}, cands, now)
	// The output: the mean of the mean outputs (133.3), under max_tokens.
	out := (100.0 + 100 + 200) / 3
	for i, want := range []Prediction{
		{Uncached: 500, Queued: 3000, Speed: 4000, Slot: 2.0 / 4 * 100 / 50, TTFT: 3500.0/4000 + 1, Decode: out / 50},
		{Uncached: 1000, Queued: 100, Speed: 2000, TTFT: 1100.0 / 2000},
		{Uncached: 1000, Queued: 0, Speed: 1000, TTFT: 1 + AdapterLoadSeconds, Decode: out / 20, Slower: out/20 - out/50*1.1},
	} {
		got := cands[i].Cost
		if got.Uncached != want.Uncached || got.Queued != want.Queued || got.Speed != want.Speed ||
			math.Abs(got.Slot-want.Slot) > 1e-9 || math.Abs(got.TTFT-want.TTFT) > 1e-9 ||
			math.Abs(got.Decode-want.Decode) > 1e-9 || math.Abs(got.Slower-want.Slower) > 1e-9 {
			t.Errorf("candidate %d: predicted %+v, want %+v", i, got, want)
		}
	}
	// Objective latency: no decode term.
	o.Objective = Latency
	Predict(&o, &Request{PromptChars: 4000, PromptTokens: 1000, CharsPerToken: 4}, cands, now)
	for i := range cands {
		if cands[i].Cost.Decode != 0 || cands[i].Cost.Slower != 0 {
			t.Errorf("objective latency, candidate %d: decode %v, slower %v; want 0", i, cands[i].Cost.Decode, cands[i].Cost.Slower)
		}
	}
}

// Decision cost's choices.
func TestDecideCost(t *testing.T) {
	energyOpts := costOpts()
	energyOpts.Objective, energyOpts.TTFTSlack = Energy, 0.5
	for _, tc := range []struct {
		name    string
		opts    Options
		req     Request
		cands   []Candidate
		chosen  int
		path    Path
		session SessionOutcome
	}{
		{
			name: "cold: the lowest predicted TTFT", opts: costOpts(), req: req(4000),
			cands:  []Candidate{{Prefill: 500}, {Prefill: 100}, {Prefill: 300}},
			chosen: 1, path: PathFallback,
		},
		{
			name: "warm keeps within the bound", opts: costOpts(), req: req(4000),
			cands:  []Candidate{{Match: 3600, Prefill: 5000}, {}},
			chosen: 0, path: PathPrefixHit,
		},
		{
			name: "warm loses past the bound", opts: costOpts(), req: req(4000),
			cands:  []Candidate{{Match: 3600, Prefill: 50000}, {}},
			chosen: 1, path: PathImbalance,
		},
		{
			name: "a session stays while its TTFT is within the bound", opts: costOpts(), req: req(4000),
			cands:  []Candidate{{Match: 3600, Prefill: 5000, Session: true}, {}},
			chosen: 0, path: PathSession, session: SessionKept,
		},
		{
			name: "a session follows its cache held elsewhere", opts: costOpts(), req: req(4000),
			cands:  []Candidate{{Match: 1000, Session: true}, {Match: 3600}},
			chosen: 1, path: PathPrefixHit, session: SessionFollows,
		},
		{
			name: "a session skipped past the bound", opts: costOpts(), req: req(4000),
			cands:  []Candidate{{Match: 3600, Prefill: 50000, Session: true}, {Prefill: 10}},
			chosen: 1, path: PathImbalance, session: SessionSkipped,
		},
		{
			name: "out of band never", opts: costOpts(), req: req(4000),
			cands:  []Candidate{{Load: 9}, {Load: 2, Prefill: 20000}},
			chosen: 1, path: PathFallback,
		},
		{
			name: "energy: the fewest joules within the slack", opts: energyOpts, req: req(4000),
			cands:  []Candidate{{Profile: joule(100)}, {Profile: joule(10), Prefill: 400}, {Profile: joule(1), Prefill: 100000}},
			chosen: 1, path: PathFallback,
		},
		{
			name: "slots full: the warm one loses to its slot wait", opts: costOpts(), req: req(4000),
			cands: []Candidate{
				{Match: 3600, Load: 2, Slots: 2, DecodeSpeed: 10, MeanOutput: 100, ReadingUntil: 10},
				{Load: 0, Slots: 2, DecodeSpeed: 10, MeanOutput: 100, ReadingUntil: 10},
			},
			chosen: 1, path: PathImbalance,
		},
	} {
		s := Snapshot{Now: 1, Request: tc.req, Candidates: tc.cands}
		res := Decide(&tc.opts, &s)
		if res.Chosen != tc.chosen || res.Path != tc.path || res.Session != tc.session {
			t.Errorf("%s: chose %d (%s, session %d), want %d (%s, session %d); costs %+v", tc.name, res.Chosen, res.Path, res.Session, tc.chosen, tc.path, tc.session, tc.cands)
		}
	}
}

func TestDecideEmpty(t *testing.T) {
	o := thresholds()
	if res := Decide(&o, &Snapshot{}); res.Chosen != -1 {
		t.Errorf("no candidates: chose %d, want -1", res.Chosen)
	}
}

// Decide allocates nothing, whatever the rule and path.
func TestDecideAllocatesNothing(t *testing.T) {
	cands := make([]Candidate, 8)
	profs := make([]*energy.Profile, len(cands))
	for i := range profs {
		profs[i] = joule(float64(10 + i))
	}
	for _, o := range []Options{thresholds(), costOpts(), {Rule: Cost, Objective: Carbon, BalanceAbs: 4, BalanceRel: 1.5}, DefaultOptions()} {
		allocs := testing.AllocsPerRun(100, func() {
			for i := range cands {
				// Kvroute's defaults see slots and speeds: every other engine 4× slower.
				speed := float64(1 + 3*(i%2))
				cands[i] = Candidate{Key: i, Load: int64(i % 3), Match: 100 * (i % 4), Profile: profs[i], Prefill: int64(100 * i),
					ReadingUntil: 2, Slots: 2, PrefillSpeed: 16000 / speed, DecodeSpeed: 200 / speed}
			}
			s := Snapshot{Now: 1, Request: req(1000), Candidates: Filter(cands)}
			Decide(&o, &s)
		})
		if allocs != 0 {
			t.Errorf("rule %d objective %d: %v allocations per decision, want 0", o.Rule, o.Objective, allocs)
		}
	}
}

func BenchmarkDecide(b *testing.B) {
	cands := make([]Candidate, 8)
	prof := joule(10)
	for _, o := range []Options{thresholds(), costOpts()} {
		b.Run([]string{"thresholds", "cost"}[o.Rule], func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				for i := range cands {
					cands[i] = Candidate{Key: i, Load: int64(i % 3), Match: 100 * (i % 4), Profile: prof, Prefill: int64(100 * i)}
				}
				s := Snapshot{Now: 1, Request: req(4000), Candidates: cands}
				Decide(&o, &s)
			}
		})
	}
}

// markSlower counts a candidate's decode beyond the fastest one's and a tolerance of a tenth
// of it: like engines' learned speeds differ by noise, and a noise-sized difference must
// leave the ranking to the load; past the tolerance it grows from 0, with no step. A candidate
// without a learned decode speed counts as no slower. (Moved from kvroute's cost_test.go.)
func TestMarkSlower(t *testing.T) {
	for _, tc := range []struct {
		decode, want []float64
	}{
		{[]float64{1, 1.05, 1.09}, []float64{0, 0, 0}},         // within a tenth: the same
		{[]float64{1, 1.11}, []float64{0, 0.01}},               // a hair past it: a hair slower
		{[]float64{1, 4, 1.2}, []float64{0, 2.9, 0.1}},         // 4× slower: 2.9 s more
		{[]float64{0, 2, 1}, []float64{0, 0.9, 0}},             // not learned: no evidence
		{[]float64{0, 0}, []float64{0, 0}},                     // none learned
		{[]float64{math.Inf(1), 1}, []float64{math.Inf(1), 0}}, // a speed of ~0: never chosen for it
	} {
		cands := make([]Candidate, len(tc.decode))
		for i, d := range tc.decode {
			cands[i].Cost.Decode = d
			cands[i].Cost.Slower = -1 // stale
		}
		markSlower(cands)
		for i := range cands {
			if got := cands[i].Cost.Slower; !(math.Abs(got-tc.want[i]) <= 1e-9) && got != tc.want[i] {
				t.Errorf("decode times %v: candidate %d slower by %v, want %v", tc.decode, i, got, tc.want[i])
			}
		}
	}
}

// keepsWarm measures a warm upstream's slower decode against the alternative a move would
// take, its own slower decode counted: with w 3 s slower at decode, an idle alternative just
// as slow (move 0.8 s) and a fast one with a queue (move 1 s), the move goes to the fast one,
// and w's 3 s beyond it are more than that move costs. Compared with the equally slow one
// (the cheapest on TTFT alone), w's decode looked free and it kept the request. (Moved from
// kvroute's cost_test.go.)
func TestKeepsWarmAgainstTheMoveItWouldMake(t *testing.T) {
	cands := []Candidate{
		{Cost: Prediction{Uncached: 0, Speed: 5000, TTFT: 0.01, Slower: 3}},   // w
		{Cost: Prediction{Uncached: 2000, Speed: 5000, TTFT: 0.4, Slower: 3}}, // as slow, idle
		{Cost: Prediction{Uncached: 2000, Speed: 5000, TTFT: 0.6}},            // fast, queued
	}
	d := decision{cands: cands, band: band{abs: 4, rel: 1.5, cost: true, slack: 5}}
	if d.keepsWarm(&cands[0]) {
		t.Errorf("w, 3 s slower at decode than the fast alternative whose move costs 1 s, kept the request")
	}
	// Alike decoders: w keeps it (its TTFT is the lowest, nothing else is slower).
	for i := range cands {
		cands[i].Cost.Slower = 0
	}
	if !d.keepsWarm(&cands[0]) {
		t.Errorf("w lost the request with no slower decode and no slot wait")
	}
}

// With a seeded source, ties go the same way on every run (a simulator's determinism), and
// still spread: never all to the first candidate.
func TestDecideSeededTies(t *testing.T) {
	run := func(seed uint64) []int {
		o := thresholds()
		o.Rand = rand.New(rand.NewPCG(seed, 1))
		var got []int
		for range 64 {
			cands := make([]Candidate, 4) // four idle, cold, alike: every step ties
			s := Snapshot{Now: 1, Request: req(1000), Candidates: cands}
			got = append(got, Decide(&o, &s).Chosen)
		}
		return got
	}
	a, b := run(7), run(7)
	seen := map[int]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 7 twice: decision %d went to %d, then to %d", i, a[i], b[i])
		}
		seen[a[i]] = true
	}
	if len(seen) < 4 {
		t.Errorf("64 tied decisions went to %d of 4 candidates: %v", len(seen), a)
	}
	if c := run(8); slices.Equal(a, c) {
		t.Errorf("seeds 7 and 8 made the same 64 choices")
	}
}
