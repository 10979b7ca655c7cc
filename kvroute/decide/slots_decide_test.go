package decide

import (
	"testing"

	"github.com/kvroute/caddy-kvroute/energy"
)

var energyProfileCap4 = energy.Profile{MaxConcurrency: 4}

// Issue 34: decision thresholds queued requests behind full batches while another engine had
// a free slot (on the demo's fleet of 4 engines × 4 slots, 38% of decisions): its least-busy
// ranking (4 per request plus 0.1 per prompt token in flight) made an engine whose slots all
// decode short prompts look idler than one with a free slot and a long prompt, and its prefix
// step kept a warm engine whatever its batch. With kvroute's defaults the decision sees the
// learned slots (SlotRank, SlotMove).
func TestDecideSlots(t *testing.T) {
	const now = int64(1e9)
	fresh := now + 1
	// full: 4 slots learned, 4 in flight, short prompts (busyness 4×4 + 0.1×100 = 26).
	full := func() Candidate {
		return Candidate{Load: 4, Slots: 4, ReadingUntil: fresh, QueuedTokens: 100, PrefillSpeed: 10000, DecodeSpeed: 50, MeanOutput: 200}
	}
	// free: a free slot, one long prompt in flight (busyness 4×3 + 0.1×2000 = 212).
	free := func() Candidate {
		return Candidate{Load: 3, Slots: 4, ReadingUntil: fresh, QueuedTokens: 2000, PrefillSpeed: 10000, DecodeSpeed: 50, MeanOutput: 200}
	}
	for _, tc := range []struct {
		name   string
		cands  func() []Candidate
		chosen int
		path   Path
	}{
		{"a cold prompt goes to the free slot, not the idler-looking full batch", func() []Candidate {
			return []Candidate{full(), free()}
		}, 1, PathFallback},
		{"slots not learned: the least busy, as before", func() []Candidate {
			a, b := full(), free()
			a.Slots, b.Slots = 0, 0
			return []Candidate{a, b}
		}, 0, PathFallback},
		{"a stale reading: its slots do not count", func() []Candidate {
			a, b := full(), free()
			a.ReadingUntil, b.ReadingUntil = now-1, now-1
			return []Candidate{a, b}
		}, 0, PathFallback},
		{"max_concurrency stands for slots not learned", func() []Candidate {
			a, b := full(), free()
			a.Slots, b.Slots = 0, 0
			a.Profile = &energyProfileCap4
			return []Candidate{a, b}
		}, 1, PathFallback},
		{"a warm full batch gives the request up when its slot wait (1 s) costs more than the move (0.15 s)", func() []Candidate {
			a, b := full(), free()
			a.Match = 2000 // half the prompt
			return []Candidate{a, b}
		}, 1, PathPrefixHit},
		{"a warm full batch keeps it when its slot wait (0.05 s) costs less than the move", func() []Candidate {
			a, b := full(), free()
			a.Match, a.DecodeSpeed = 2000, 1000
			return []Candidate{a, b}
		}, 0, PathPrefixHit},
	} {
		o := DefaultOptions()
		s := Snapshot{Now: now, Request: req(4000), Candidates: tc.cands()}
		res := Decide(&o, &s)
		if res.Chosen != tc.chosen || res.Path != tc.path {
			t.Errorf("%s: chose %d (%s), want %d (%s); costs %+v", tc.name, res.Chosen, res.Path, tc.chosen, tc.path, s.Candidates)
		}
	}
	// decision thresholds as SGLang's rules, without the slot rules: the full batch.
	o := DefaultOptions()
	o.SlotRank, o.SlotMove = false, false
	s := Snapshot{Now: now, Request: req(4000), Candidates: []Candidate{full(), free()}}
	if res := Decide(&o, &s); res.Chosen != 0 {
		t.Errorf("without SlotRank: chose %d, want the least busy, 0", res.Chosen)
	}
}
