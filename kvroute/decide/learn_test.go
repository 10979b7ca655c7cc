package decide

import (
	"math"
	"testing"
)

// Speed is the median of its latest SpeedWindow samples, once it has MinSpeedSamples; samples
// out of bounds are none.
func TestSpeed(t *testing.T) {
	var s Speed
	s.Observe(100)
	s.Observe(math.NaN())
	s.Observe(0.5) // below MinSpeed
	s.Observe(300)
	if v, ok := s.Value(); ok {
		t.Fatalf("two samples: %v, want none yet", v)
	}
	s.Observe(200)
	if v, ok := s.Value(); !ok || v != 200 {
		t.Fatalf("median of 100, 300, 200: %v %v", v, ok)
	}
	s.Observe(1000)
	if v, _ := s.Value(); v != 250 {
		t.Fatalf("median of four: %v, want 250", v)
	}
	// Nine more of 50 push every earlier sample out.
	for range SpeedWindow {
		s.Observe(50)
	}
	if v, _ := s.Value(); v != 50 {
		t.Fatalf("after a full window of 50: %v", v)
	}
	if allocs := testing.AllocsPerRun(100, func() { s.Observe(60); s.Value() }); allocs != 0 {
		t.Errorf("%v allocations per observation", allocs)
	}
	s.Reset()
	if _, ok := s.Value(); ok {
		t.Error("a value after Reset")
	}
}

// CharsPerToken publishes the totals' figure once they are large enough, and not while the
// chars sent and ended disagree or the engine started more requests than were sent.
func TestCharsPerToken(t *testing.T) {
	var c CharsPerToken
	iv := CharsInterval{Chars: 36000, Ended: 36000, Tokens: 10000, Sent: 10, Started: 10}
	for i := range MinCharsIntervals - 1 {
		if v, ok := c.Add(iv); ok {
			t.Fatalf("interval %d: published %v before %d intervals", i, v, MinCharsIntervals)
		}
	}
	if v, ok := c.Add(iv); !ok || math.Abs(v-3.6) > 1e-9 {
		t.Fatalf("after %d intervals: %v %v, want 3.6", MinCharsIntervals, v, ok)
	}
	// Chars ended far behind the chars sent: the midpoint may be off by more than MaxCharsBias.
	var lag CharsPerToken
	for range 8 {
		if v, ok := lag.Add(CharsInterval{Chars: 40000, Ended: 30000, Tokens: 10000, Sent: 10, Started: 10}); ok {
			t.Fatalf("published %v with ended chars 25%% behind", v)
		}
	}
	// Requests from elsewhere: the engine started twice what was sent.
	var busy CharsPerToken
	for range 8 {
		if v, ok := busy.Add(CharsInterval{Chars: 40000, Ended: 40000, Tokens: 20000, Sent: 10, Started: 20}); ok {
			t.Fatalf("published %v with the engine starting twice the requests sent", v)
		}
	}
	// An engine that does not count its starts (Started < 0): the check is left out.
	var blind CharsPerToken
	v, ok := 0.0, false
	for range MinCharsIntervals {
		v, ok = blind.Add(CharsInterval{Chars: 50000, Ended: 50000, Tokens: 10000, Sent: 10, Started: -1})
	}
	if !ok || v != 5 {
		t.Errorf("without a start count: %v %v, want 5", v, ok)
	}
}

// Outside: an engine that starts more requests than its router sent (beyond the tolerance)
// shows traffic from elsewhere for OutsideMemory intervals; one that starts no more never does;
// one that does not count its starts is taken as it is.
func TestOutside(t *testing.T) {
	const s = int64(1e9)
	var o Outside
	if !o.Observe(1*s, s, 0, 0, 0, StartsBaseline, 0) {
		t.Error("a first reading of an engine not known to count its starts: want the gauges taken as they are")
	}
	// Ten sent, ten started per interval: no evidence.
	sent := int64(0)
	for i := int64(2); i < 10; i++ {
		sent += 10
		if o.Observe(i*s, s, sent, 4, 10, StartsCounted, 0) {
			t.Fatalf("interval %d: evidence with as many started as sent", i)
		}
	}
	// Side traffic: 5 more started than sent.
	sent += 10
	if !o.Observe(10*s, s, sent, 4, 15, StartsCounted, 0) {
		t.Fatal("5 more started than sent: no evidence")
	}
	sent += 10
	if !o.Observe(10*s+int64(OutsideMemory-1)*s, s, sent, 4, 10, StartsCounted, 0) {
		t.Error("evidence forgotten before OutsideMemory intervals")
	}
	sent += 10
	if o.Observe(10*s+int64(OutsideMemory)*s, s, sent, 4, 10, StartsCounted, 0) {
		t.Error("evidence kept past OutsideMemory intervals")
	}
	// A request given up on lately counts as evidence.
	if !o.Observe(50*s, s, sent, 4, 0, StartsCounted, 45*s) {
		t.Error("a request abandoned 5 intervals ago: no evidence")
	}
	var blind Outside
	if !blind.Observe(1*s, s, 0, 0, 0, StartsUncounted, 0) {
		t.Error("an engine that does not count its starts: want the gauges taken as they are")
	}
}
