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
