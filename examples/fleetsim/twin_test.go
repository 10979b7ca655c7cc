package fleetsim

import (
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
)

// timing records when the router hears of each request.
type timing struct {
	Router
	routed, first, done map[int]time.Duration
}

func (t *timing) Route(now time.Duration, r *Request) int {
	t.routed[r.ID] = now
	return t.Router.Route(now, r)
}

func (t *timing) FirstToken(now time.Duration, r *Request, i int) {
	t.first[r.ID] = now
	t.Router.FirstToken(now, r, i)
}

func (t *timing) Done(now time.Duration, r *Request, i int, u Usage) {
	t.done[r.ID] = now
	if u.FirstToken != t.first[r.ID] {
		panic("the answer's first token is not the engine's")
	}
	t.Router.Done(now, r, i, u)
}

func (t *timing) Reading(now time.Duration, i int, rd engine.Reading) { t.Router.Reading(now, i, rd) }

// With a transit, a request reaches the router Router after its send and its engine Proxy
// (plus PerKChar per 1,000 chars) after the decision; its client sees the first token Back
// after the engine gave it, and the answer's end Back after the engine's, when the router
// hears of the end and a closed-loop client sends its next request.
func TestTransit(t *testing.T) {
	sc := scenario(t, "chat-closed-16")
	sc.Requests = 160
	sc.Transit = &Transit{Router: 2 * time.Millisecond, Proxy: 3 * time.Millisecond, PerKChar: time.Millisecond, Back: 5 * time.Millisecond}
	b, err := Build(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	tm := &timing{Router: policy(t, "least_conn").New(1), routed: map[int]time.Duration{}, first: map[int]time.Duration{}, done: map[int]time.Duration{}}
	res := Run(sc, b, 1, 0, tm)
	next := map[int]time.Duration{} // session -> when its previous answer ended at the client
	for _, r := range res.Requests {
		proxy := 3*time.Millisecond + time.Duration(float64(time.Millisecond)*float64(r.Chars)/1000)
		if tm.routed[r.ID] != r.Arrival+2*time.Millisecond || r.Routed != tm.routed[r.ID] {
			t.Fatalf("request %d sent at %v, routed at %v, want 2 ms later", r.ID, r.Arrival, tm.routed[r.ID])
		}
		if r.FirstToken != r.engineFirst+5*time.Millisecond || r.engineFirst < r.Routed+proxy {
			t.Fatalf("request %d: routed %v, first token %v at the engine (not before %v), %v at the client (want 5 ms later)", r.ID, r.Routed, r.engineFirst, r.Routed+proxy, r.FirstToken)
		}
		if r.Done != r.engineDone+5*time.Millisecond || tm.done[r.ID] != r.Done {
			t.Fatalf("request %d: done %v at the engine, %v at the client, the router heard at %v", r.ID, r.engineDone, r.Done, tm.done[r.ID])
		}
		if at, ok := next[r.sess]; ok && r.Arrival != at {
			t.Fatalf("request %d sent at %v, its session's previous answer ended at %v", r.ID, r.Arrival, at)
		}
		next[r.sess] = r.Done
	}
	f := Measure(res, time.Second)
	if f.TTFTP50 < 10 {
		t.Errorf("TTFT p50 %v ms: the transit's 2+3+5 ms at least are not in it", f.TTFTP50)
	}
}

// The jitter draws are the request's, whatever the policy: two policies of one seed see each
// request's path take the same time.
func TestTransitJitterPerRequest(t *testing.T) {
	sc := scenario(t, "chat-80")
	sc.Requests = 200
	sc.Transit = &Transit{Router: time.Millisecond, Proxy: time.Millisecond, Back: time.Millisecond, Sigma: 1}
	b, err := Build(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	a := Run(sc, b, 1, 20, policy(t, "least_conn").New(1))
	c := Run(sc, b, 1, 20, policy(t, "round_robin").New(1))
	spread := false
	for i, r := range a.Requests {
		if r.Routed-r.Arrival != c.Requests[i].Routed-c.Requests[i].Arrival {
			t.Fatalf("request %d: routed %v after its send under least_conn, %v under round_robin", i, r.Routed-r.Arrival, c.Requests[i].Routed-c.Requests[i].Arrival)
		}
		spread = spread || r.Routed-r.Arrival > 2*time.Millisecond
	}
	if !spread {
		t.Error("no draw above 2x the median: no jitter")
	}
}

// CompareRounds takes medians of same-round ratios; a baseline at least as good on all three
// medians and better by more than 2% on one dominates; Agree holds within ±15%.
func TestCompareRounds(t *testing.T) {
	kv := []Round{{100, 400, 10}, {110, 390, 10}, {90, 420, 10}}
	base := []Round{{50, 410, 10}, {60, 400, 10.1}, {55, 430, 9.9}}
	r := CompareRounds(kv, base)
	if r.Rounds != 3 || r.P50 != 110.0/60 || r.P50Lo != 90.0/55 || r.P50Hi != 2 || r.Dominated {
		t.Errorf("ratios %+v: want p50 1.83 (the median of 100/50, 110/60 and 90/55), not dominated (the baseline's p99 median is higher)", r)
	}
	worse := []Round{{100, 440, 9}, {110, 430, 9}, {90, 450, 9}}
	if d := CompareRounds(worse, kv); !d.Dominated {
		t.Errorf("%+v: kv's medians are better on all three: dominates", d)
	}
	if d := CompareRounds(kv, kv); d.Dominated {
		t.Error("a policy dominates itself")
	}
	a := Agree(Ratios{P50: 1.1, P99: 1, RPS: 1}, Ratios{P50: 1.3, P99: 1.1, RPS: 1})
	if a.P50 || !a.P99 || !a.RPS || !a.Verdict || a.Agrees() {
		t.Errorf("agreement %+v: p50 is 15.4%% off, p99 9%%", a)
	}
}

// FitTransit recovers a transit from records whose delays follow it: 0.5 ms to the decision,
// 0.5 ms + 50 µs per 1,000 chars to the engine, 2 ms back, and a stall of 40 ms on one hop in
// ten.
func TestFitTransit(t *testing.T) {
	var recs []*DecisionRecord
	for i := range 400 {
		chars := 1000 + (i%2)*199000 // small and large prompts
		stall := time.Duration(0)
		if i%10 == 0 {
			stall = 40 * time.Millisecond
		}
		sent := time.Duration(i) * time.Second
		decided := sent + 500*time.Microsecond
		at := decided + 500*time.Microsecond + time.Duration(chars)*50 + stall
		recs = append(recs, &DecisionRecord{Sent: sent, Decided: decided, At: at, PromptChars: chars,
			EngineTTFT: 10 * time.Millisecond, TTFT: at - sent + 10*time.Millisecond + 2*time.Millisecond,
			EngineDone: at + time.Second, Done: at + time.Second + 2*time.Millisecond})
	}
	tr, err := FitTransit(recs)
	if err != nil {
		t.Fatal(err)
	}
	near := func(got, want time.Duration) bool { return got >= want*9/10 && got <= want*11/10 }
	if !near(tr.Router, 500*time.Microsecond) || !near(tr.PerKChar, 50*time.Microsecond) || !near(tr.Back, 2*time.Millisecond) ||
		!near(tr.Router+tr.Proxy+tr.PerKChar, 1050*time.Microsecond) {
		t.Errorf("fitted %v", tr)
	}
	n := len(tr.Extra)
	if tr.Extra[n/2] != 0 || tr.Extra[n-1] < 39*time.Millisecond || tr.Extra[80*n/100] != 0 {
		t.Errorf("added delays %v: want none up to the 85th percentile and a 40 ms stall at the top", tr.Extra)
	}
	if _, err := FitTransit(recs[:15]); err == nil {
		t.Error("15 records fitted")
	}
}
