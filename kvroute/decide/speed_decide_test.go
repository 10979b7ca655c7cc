package decide

import "testing"

// Issue 34: on the scorecard's chat-slow-half-80 (two of four engines 4× slower), every
// request sent to a slow engine missed the SLO while the oracle sent none there: decision
// thresholds took an idle slow engine for the least busy, and its prefix step kept every
// conversation that had started there. With kvroute's defaults (SpeedRank) a slower engine
// (more than SlowFactor times slower in both learned prefill and decode) counts its
// busyness, the request's own included, times its slowdown, and a warm choice on it moves to
// a faster candidate in the band.
func TestDecideSlowEngines(t *testing.T) {
	const now = int64(1e9)
	fresh := now + 1
	// fast: one request in flight (busyness 4 + 0.1×250 = 29).
	fast := func() Candidate {
		return Candidate{Load: 1, QueuedTokens: 250, ReadingUntil: fresh, PrefillSpeed: 18000, DecodeSpeed: 300}
	}
	// slow: idle, learned 4.5× slower in prefill and 7.5× in decode.
	slow := func() Candidate {
		return Candidate{ReadingUntil: fresh, PrefillSpeed: 4000, DecodeSpeed: 40}
	}
	for _, tc := range []struct {
		name   string
		cands  func() []Candidate
		chosen int
		path   Path
	}{
		{"a cold prompt goes to the busier fast engine, not the idle slow one", func() []Candidate {
			return []Candidate{fast(), slow()}
		}, 0, PathFallback},
		{"a prompt warm on the slow engine moves to the fast one", func() []Candidate {
			a, b := fast(), slow()
			b.Match = 3000
			return []Candidate{a, b}
		}, 0, PathPrefixHit},
		{"the fast engine's batch full, the slow one's free: the slow one", func() []Candidate {
			a, b := fast(), slow()
			a.Load, a.Slots, b.Slots = 8, 8, 8
			return []Candidate{a, b}
		}, 1, PathImbalance},
		{"slower in prefill only (a busy engine of the same kind): the least busy, as before", func() []Candidate {
			a, b := fast(), slow()
			b.DecodeSpeed = 300
			return []Candidate{a, b}
		}, 1, PathFallback},
		{"2.4× slower in both (within SlowFactor): the least busy, as before", func() []Candidate {
			a, b := fast(), slow()
			b.PrefillSpeed, b.DecodeSpeed = 7500, 125
			return []Candidate{a, b}
		}, 1, PathFallback},
		{"a stale reading: its decode speed does not count", func() []Candidate {
			a, b := fast(), slow()
			b.ReadingUntil = now - 1
			return []Candidate{a, b}
		}, 1, PathFallback},
		{"12 requests on the fast engine: the slow one is then the least busy (512 against 4.5 × 104)", func() []Candidate {
			a, b := fast(), slow()
			a.Load, a.QueuedTokens = 12, 12*300
			return []Candidate{a, b}
		}, 1, PathImbalance},
		{"10 requests on the fast engine: still the fast one (444 against 468)", func() []Candidate {
			a, b := fast(), slow()
			a.Load, a.QueuedTokens = 10, 10*300
			return []Candidate{a, b}
		}, 0, PathImbalance},
	} {
		o := DefaultOptions()
		s := Snapshot{Now: now, Request: req(4000), Candidates: tc.cands()}
		res := Decide(&o, &s)
		if res.Chosen != tc.chosen || res.Path != tc.path {
			t.Errorf("%s: chose %d (%s), want %d (%s)", tc.name, res.Chosen, res.Path, tc.chosen, tc.path)
		}
	}
	// Without SpeedRank: the idle slow engine, and the warm one.
	for _, match := range []int{0, 3000} {
		o := DefaultOptions()
		o.SpeedRank = false
		b := slow()
		b.Match = match
		s := Snapshot{Now: now, Request: req(4000), Candidates: []Candidate{fast(), b}}
		if res := Decide(&o, &s); res.Chosen != 1 {
			t.Errorf("without SpeedRank, match %d: chose %d, want the slow engine, 1", match, res.Chosen)
		}
	}
}

// Issue 34: on chat-closed-64 (64 clients, 32 batch slots) every engine's batch was full and
// decision thresholds' imbalance step kept moving conversations off their warm engine onto
// another full batch: the request waited there as well and lost its prefix; the loads stayed
// even and every request queued (goodput 0.12× the best baseline's). With kvroute's defaults
// (FullStay) the imbalance step is skipped while every batch is full.
func TestDecideFullStay(t *testing.T) {
	const now = int64(1e9)
	fresh := now + 1
	// Loads 14 and 8 on 8 slots each: out of the band (14 − 8 > 4 and 14 > 1.5 × 8).
	warm := func() Candidate { return Candidate{Load: 14, Slots: 8, ReadingUntil: fresh, Match: 3000} }
	cold := func() Candidate { return Candidate{Load: 8, Slots: 8, ReadingUntil: fresh} }
	for _, tc := range []struct {
		name   string
		cands  func() []Candidate
		stay   bool
		chosen int
		path   Path
	}{
		{"every batch full: the warm engine keeps the request", func() []Candidate {
			return []Candidate{warm(), cold()}
		}, true, 0, PathPrefixHit},
		{"a free slot elsewhere: the imbalance step, as before", func() []Candidate {
			a, b := warm(), cold()
			b.Load = 7
			a.Load = 13
			return []Candidate{a, b}
		}, true, 1, PathImbalance},
		{"slots not learned: the imbalance step, as before", func() []Candidate {
			a, b := warm(), cold()
			a.Slots, b.Slots = 0, 0
			return []Candidate{a, b}
		}, true, 1, PathImbalance},
		{"without FullStay: the imbalance step", func() []Candidate {
			return []Candidate{warm(), cold()}
		}, false, 1, PathImbalance},
	} {
		o := DefaultOptions()
		o.FullStay = tc.stay
		s := Snapshot{Now: now, Request: req(4000), Candidates: tc.cands()}
		res := Decide(&o, &s)
		if res.Chosen != tc.chosen || res.Path != tc.path {
			t.Errorf("%s: chose %d (%s), want %d (%s)", tc.name, res.Chosen, res.Path, tc.chosen, tc.path)
		}
	}
}
