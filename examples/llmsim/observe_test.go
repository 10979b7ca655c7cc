package llmsim

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// seen is an Observer that records what it is told.
type seen struct {
	mu       sync.Mutex
	arrivals []Arrival
	firsts   map[string]int // id -> cached tokens at the first token
	at       map[string]time.Time
	done     map[string]bool
	bad      []string // finished before the first token, or written before the last
}

func (s *seen) Arrived(_ *Server, a *Arrival) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.arrivals = append(s.arrivals, *a)
}

func (s *seen) Finished(id string, at, written time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if at.Before(s.at[id]) || written.Before(at) {
		s.bad = append(s.bad, id)
	}
	s.done[id] = true
}

func (s *seen) FirstToken(id string, at time.Time, cached int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.firsts[id], s.at[id] = cached, at
}

// An observer sees each request arrive with its id and what the engine held then (the second
// request of the same prompt finds the first's blocks cached and the first running), and its
// first token with the cached tokens admission found; without one, nothing is told.
func TestObserve(t *testing.T) {
	cfg := Config{Name: "w", Slots: 1, StepFixed: 20 * time.Millisecond, PrefillPerToken: -1, PerSeq: -1}
	s, ts := startServer(t, cfg)
	o := &seen{firsts: map[string]int{}, at: map[string]time.Time{}, done: map[string]bool{}}
	s.Observe(o)
	prompt := strings.Repeat("the same long prompt ", 40)
	send := func(id string, tokens int) {
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/completions",
			strings.NewReader(`{"model":"`+s.Config().Model+`","prompt":"`+prompt+`","max_tokens":`+strconv.Itoa(tokens)+`}`))
		req.Header.Set(HeaderRequestID, id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return
		}
		resp.Body.Close()
	}
	send("a", 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); send("b", 50) }() // 50 steps of 20 ms: still running when c comes
	deadline := time.Now().Add(5 * time.Second)
	for r, _ := counts(s); r == 0 && time.Now().Before(deadline); r, _ = counts(s) {
		time.Sleep(5 * time.Millisecond)
	}
	send("c", 1)
	wg.Wait()
	s.Observe(nil)
	send("d", 1)

	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.arrivals) != 3 {
		t.Fatalf("%d arrivals, want a, b and c (d came after Observe(nil))", len(o.arrivals))
	}
	a, c := o.arrivals[0], o.arrivals[2]
	if a.ID != "a" || a.Worker != "w" || a.View.Running != 0 || a.View.Cached != 0 || a.View.Slots != 1 || a.Output != 1 || a.Prompt.Tokens == 0 {
		t.Errorf("first arrival %+v: want a, on an empty engine of 1 slot", a)
	}
	if c.ID != "c" || c.View.Running != 1 || c.View.Cached == 0 || c.View.TTFT < 20*time.Millisecond {
		t.Errorf("third arrival %+v: want c, with b running (the one slot taken), the prompt cached and a TTFT of at least a step", c)
	}
	if len(o.done) != 3 || len(o.bad) > 0 {
		t.Errorf("finished %v, out of order %v", o.done, o.bad)
	}
	if o.firsts["a"] != 0 || o.firsts["c"] == 0 || o.at["c"].Before(c.At) {
		t.Errorf("first tokens: cached %v at %v (c arrived %v): a found nothing cached, c its prompt", o.firsts, o.at, c.At)
	}
}
