package decide

import "testing"

// Slots in virtual time: the slot count is the median of the samples that stand, a sample
// lapses SlotSampleLife after it was taken, and the mean output is tokens over started
// requests across the window.
func TestSlots(t *testing.T) {
	var s Slots
	at := int64(1_000)
	for _, g := range [][2]int64{{4, 1}, {4, 2}, {9, 1}} { // one odd reading
		s.ObserveGauges(g[0], g[1], at)
	}
	s.ObserveGauges(3, 0, at) // no queue, fewer than the figure: no sample
	s.ObserveGauges(0, 5, at) // nothing running: no sample
	if n, _ := s.Figures(at); n != 4 {
		t.Errorf("4, 4 and an odd 9: %d slots, want 4", n)
	}
	s.ObserveGauges(12, 0, at+1) // more running than the figure, no queue: a sample
	s.ObserveGauges(12, 0, at+2)
	if n, _ := s.Figures(at + 2); n != 9 {
		t.Errorf("4, 4, 9, 12, 12: %d slots, want 9", n)
	}
	if n, _ := s.Figures(at + SlotSampleLife + 1); n != 0 {
		t.Errorf("after the first samples lapsed (2 left): %d slots, want none", n)
	}
	if n, _ := s.Figures(at + 2 + SlotSampleLife + 1); n != 0 {
		t.Errorf("all lapsed: %d slots, want none", n)
	}
	for range OutputWindow + 3 {
		s.ObserveOutput(300, 2)
	}
	s.ObserveOutput(-1, 1) // no observation
	if _, out := s.Figures(at); out != 150 {
		t.Errorf("300 tokens per 2 requests: mean output %v, want 150", out)
	}
	s.Reset()
	if n, out := s.Figures(at); n != 0 || out != 0 {
		t.Errorf("after Reset: %d slots, %v output", n, out)
	}
	if a := testing.AllocsPerRun(100, func() { s.ObserveGauges(4, 1, at); s.Figures(at) }); a != 0 {
		t.Errorf("%v allocations per observation", a)
	}
}

// While the router holds requests back for want of a slot, an engine runs at its slots without
// a queue: ObserveGauges takes no sample then, and the figure would lapse after SlotSampleLife,
// the router stop holding, the engine queue again: a reading taken while holding keeps it.
func TestSlotsKeptWhileHeld(t *testing.T) {
	var s Slots
	at := int64(1_000)
	for range MinSlotSamples {
		s.ObserveGauges(4, 2, at)
	}
	step := SlotSampleLife / 4
	for k := int64(1); k <= 12; k++ { // three sample lives at the figure, no queue
		s.ObserveGauges(4, 0, at+k*step)
		s.ObserveHeld(4, at+k*step)
	}
	if n, _ := s.Figures(at + 12*step); n != 4 {
		t.Errorf("held at 4 running for 3 sample lives: %d slots, want 4", n)
	}
	s.ObserveHeld(3, at+13*step) // fewer running than the figure: no sample
	s.ObserveHeld(9, at+13*step) // more: a sample, as ObserveGauges takes it
	if n, _ := s.Figures(at + 13*step); n != 4 {
		t.Errorf("4, 4, 4, 4, 9: %d slots, want 4", n)
	}
	var none Slots
	none.ObserveHeld(4, at) // nothing learned: holding teaches nothing
	if n, _ := none.Figures(at); n != 0 {
		t.Errorf("held with no figure: %d slots, want none", n)
	}
	if a := testing.AllocsPerRun(100, func() { s.ObserveHeld(4, at); s.Figures(at) }); a != 0 {
		t.Errorf("%v allocations per held observation", a)
	}
}
