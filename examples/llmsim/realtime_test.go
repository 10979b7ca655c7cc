package llmsim

import (
	"strings"
	"testing"
	"time"
)

// A stepping goroutine that wakes late (a loaded host) does not lengthen the engine's steps,
// even when a request arrives while it is late: the steps due before the arrival end at their
// nominal times. Here the host is "late" by 100 ms (the engine's clock is moved on while the
// goroutine sleeps on a 20 ms step), and a second request arrives then: the first request's
// prefill of 4 steps of 20 ms still gives its first token 80 ms after it was submitted.
func TestLateWakeUpKeepsNominalSteps(t *testing.T) {
	cfg := Config{Slots: 4, MaxBatchTokens: 64, StepFixed: 20 * time.Millisecond, PrefillPerToken: -1, PerSeq: -1}.withDefaults()
	d := newRealtime(cfg.engine())
	d.mu.Lock()
	start := d.now()
	d.mu.Unlock()
	a := d.submit(NewPrompt(strings.Repeat("x", 256*CharsPerToken), cfg.BlockTokens), 1, false, false, time.Now())
	d.mu.Lock()
	d.origin = d.origin.Add(-100 * time.Millisecond) // 100 ms pass on the engine's clock, none on the goroutine's timer
	d.mu.Unlock()
	b := d.submit(NewPrompt(strings.Repeat("y", 16*CharsPerToken), cfg.BlockTokens), 1, false, false, time.Now())
	for _, pd := range []*pending{a, b} {
		select {
		case <-pd.done:
		case <-time.After(10 * time.Second):
			t.Fatal("no answer within 10 s")
		}
	}
	if got := a.firstAt - start; got < 80*time.Millisecond || got >= 100*time.Millisecond {
		t.Errorf("first token %v after the submission, want 80 ms (4 steps of 20 ms; a step stretched to the late arrival makes it 160 ms or more)", got)
	}
	if b.firstAt < 100*time.Millisecond+start {
		t.Errorf("the late request's first token at %v, before it arrived (%v)", b.firstAt-start, 100*time.Millisecond)
	}
}
