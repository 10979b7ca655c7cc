package kvroute

// decision cost's slot signal (slots.go) through the in-process Caddy: loopback engines export
// vLLM's gauges (running, waiting) and decode totals, the policy learns each one's slot count
// and decode speed, and a warm upstream whose slots are full loses a request to a cold one.

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
)

// slotPrefix is a system prompt of about 2,000 tokens that the warm upstream holds.
var slotPrefix = strings.Repeat("You are a careful assistant. ", 276)

// feedDecode makes the engines' decode totals grow at 100 output tokens per second per request
// (100 tokens and 1 s of decode every 10 ms) until the test ends, so that the policy learns
// that decode speed. They export no prefill or TTFT count: the mean output per request stays
// unlearned and expected_tokens (400 here) stands in, a service time of 4 s.
func feedDecode(t *testing.T, engines ...*engine) {
	t.Helper()
	feedDecodeAt(t, func(*engine) int { return 100 }, engines...)
}

// feedDecodeAt is feedDecode at rate(e) output tokens per second per request for each engine,
// read at every step (a test may change it).
func feedDecodeAt(t *testing.T, rate func(*engine) int, engines ...*engine) {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tokens := make([]int64, len(engines))
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			const l = `engine="0",model_name="m"`
			for i, e := range engines {
				// Each step adds rate tokens and 1 s of decode: the totals only grow while
				// the rate holds, so they are kept per engine.
				tokens[i] += int64(rate(e))
				page := fmt.Sprintf(`# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{%[1]s} %[2]d
# TYPE vllm:request_decode_time_seconds histogram
vllm:request_decode_time_seconds_bucket{%[1]s,le="10"} %[3]d
vllm:request_decode_time_seconds_bucket{%[1]s,le="+Inf"} %[3]d
vllm:request_decode_time_seconds_sum{%[1]s} %[3]d
vllm:request_decode_time_seconds_count{%[1]s} %[3]d
`, l, tokens[i], n)
				e.mu.Lock()
				e.extra = page
				e.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// learnedField reads one field of an upstream's learned figures from GET /kvroute/ as JSON
// (absent: NaN), so that a field this build lacks reads as absent rather than not compiling.
func learnedField(t *testing.T, addr, field string) float64 {
	t.Helper()
	_, body := adminCall(t, http.MethodGet, "/kvroute/")
	var st struct {
		Upstreams map[string]struct {
			Learned map[string]any `json:"learned"`
		} `json:"upstreams"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("GET /kvroute/: %v", err)
	}
	v, ok := st.Upstreams[addr].Learned[field].(float64)
	if !ok {
		return math.NaN()
	}
	return v
}

// waitScrapes waits until e has been read n more times: a reading set before the call has then
// been taken in (the first of them may have read the figures before).
func waitScrapes(t *testing.T, e *engine, n int64) {
	t.Helper()
	from := e.scrapes.Load()
	waitUntil(t, 20*time.Second, func() bool { return e.scrapes.Load() >= from+n }, fmt.Sprintf("%d more readings of %s", n, e.name))
}

// slotScene is two engines behind decision cost: warm holds slotPrefix and held requests that
// hang there (its own in flight: its load), cold holds nothing. Both have learned a decode
// speed of 100 tokens per second; expected_tokens is expected (no mean output is learned: the
// engines export no started-request count), so a service time is expected / 100 seconds. The
// tests then set warm's gauges to what they want learned.
type slotScene struct {
	warm, cold *engine
	client     *http.Client
	session    string // the probe's session id ("": none), bound to warm by the warm-up
	// decode is each engine's decode speed as its totals report it, tokens per second per
	// request (100 until setDecode).
	decode map[*engine]*atomic.Int64
	// probeMaxTokens is the probe's max_tokens (0: chatBody's 16).
	probeMaxTokens int
}

func newSlotScene(t *testing.T, held, expected int, session string, options ...string) *slotScene {
	t.Helper()
	leakCheck(t)
	engines := []*engine{newEngine(t, "u1", 1000), newEngine(t, "u2", 1000)}
	s := &slotScene{client: newClient(t, 30*time.Second), session: session, decode: map[*engine]*atomic.Int64{}}
	for _, e := range engines {
		s.decode[e] = new(atomic.Int64)
		s.decode[e].Store(100)
	}
	feedDecodeAt(t, func(e *engine) int { return int(s.decode[e].Load()) }, engines...)
	startCaddy(t, telemetryConfig(engines, "", "", append([]string{"decision cost", fmt.Sprintf("expected_tokens %d", expected)}, options...)...))
	var headers []string
	if session != "" {
		headers = []string{"X-Session-ID", session} // the session is bound where the warm-up goes
	}
	rep, resp := send(t, s.client, baseURL+"/v1/chat/completions", chatBody("m", slotPrefix, "warm up"), headers...)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("warm-up: status %d", resp.StatusCode)
	}
	s.warm, s.cold = engines[0], engines[1]
	if rep.Upstream == engines[1].name {
		s.warm, s.cold = engines[1], engines[0]
	}
	for _, e := range engines {
		defer func() {
			if t.Failed() {
				_, body := adminCall(t, http.MethodGet, "/kvroute/")
				t.Logf("status: %s", body)
			}
		}()
		waitUntil(t, 20*time.Second, func() bool {
			l := upstreamStatus(t, e.addr()).Learned
			return l != nil && l.DecodeLearned && math.Abs(l.DecodeTokensPerSecond-100) < 1
		}, "the decode speed of "+e.name+" learned")
	}
	// Requests that hold the prefix hang on warm: each goes there by its prefix (nothing known
	// of any slot yet, loads within the balance band).
	s.warm.setHang(true)
	t.Cleanup(func() { s.warm.setHang(false) })
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	for i := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := chatBody("m", slotPrefix, fmt.Sprintf("held question %d", i))
			req, _ := http.NewRequest(http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader(body))
			if resp, err := s.client.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		waitUntil(t, 20*time.Second, func() bool { return s.warm.active.Load() == int64(i+1) }, fmt.Sprintf("held request %d on warm", i))
	}
	if n := s.cold.hits.Load(); n != 0 {
		t.Fatalf("%d held requests went to the cold upstream", n)
	}
	return s
}

// probe sends a request that holds the prefix and reports whether it went to the warm
// upstream (where it hangs with the others) or the cold one.
func (s *slotScene) probe(t *testing.T) (toWarm bool) {
	t.Helper()
	active, hits := s.warm.active.Load(), s.cold.hits.Load()
	done := make(chan struct{})
	go func() {
		defer close(done)
		body := chatBody("m", slotPrefix, "the probe's question")
		if s.probeMaxTokens > 0 {
			body = strings.Replace(body, `"max_tokens":16`, fmt.Sprintf(`"max_tokens":%d`, s.probeMaxTokens), 1)
		}
		req, _ := http.NewRequest(http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader(body))
		if s.session != "" {
			req.Header.Set("X-Session-ID", s.session)
		}
		if resp, err := s.client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	t.Cleanup(func() { s.warm.setHang(false); <-done })
	waitUntil(t, 20*time.Second, func() bool { return s.warm.active.Load() > active || s.cold.hits.Load() > hits }, "the probe at an upstream")
	return s.warm.active.Load() > active
}

// read has the warm engine report running and waiting until the policy has read it enough
// to learn from it, and waits until the warm upstream's load, as the decision sees it, is load.
func (s *slotScene) read(t *testing.T, running, waiting int, load int64) {
	t.Helper()
	s.warm.set(running, waiting, "")
	waitScrapes(t, s.warm, minSlotSamples+2)
	s.waitLoad(t, load)
}

// setDecode has e's totals report tokens per second per request from now on, and waits
// until the policy has learned it.
func (s *slotScene) setDecode(t *testing.T, e *engine, tokensPerSecond int64) {
	t.Helper()
	s.decode[e].Store(tokensPerSecond)
	waitUntil(t, 20*time.Second, func() bool {
		l := upstreamStatus(t, e.addr()).Learned
		return l != nil && l.DecodeLearned && math.Abs(l.DecodeTokensPerSecond-float64(tokensPerSecond)) < 0.5
	}, fmt.Sprintf("a decode speed of %d learned for %s", tokensPerSecond, e.name))
}

// waitLoad waits until the warm upstream's load, as the decision sees it, is n.
func (s *slotScene) waitLoad(t *testing.T, n int64) {
	t.Helper()
	waitUntil(t, 20*time.Second, func() bool { return upstreamStatus(t, s.warm.addr()).Load == n }, fmt.Sprintf("the warm upstream's load at %d", n))
}

// A warm upstream whose two slots are full and whose queue is two long (the engine reports 2
// running, 2 waiting: the four requests held there) loses a request to the cold upstream: it
// would wait 1.5 service times of 4 s (400 expected output tokens at 100 per second) for a
// slot, beyond ttft_slack 5 of the cold upstream's prefill of the prompt plus what the move
// forfeits (2 × 2,000 tokens at 5,000 per second, 0.8 s: bound 4.8 s).
func TestCostSlotsFullWarmLosesRequest(t *testing.T) {
	s := newSlotScene(t, 4, 400, "")
	s.read(t, 2, 2, 4)
	if got := learnedField(t, s.warm.addr(), "slots"); got != 2 {
		t.Errorf("learned slots %v, want 2 (the running count of readings with a queue)", got)
	}
	if s.probe(t) {
		t.Errorf("with its 2 slots full and 2 waiting, the warm upstream kept the request; want it sent to the cold upstream")
	}
}

// A warm upstream whose slot wait is within ttft_slack of the best move's TTFT, but longer than
// what the move costs, loses the request: 3 in flight on 2 slots, one waiting, wait 0.5 × 4 s
// = 2 s against a move to the cold upstream of 0.4 s of prefill and 0.4 s it forfeits (0.8 s,
// bound 4.8 s). Sticky until saturated: a wait is not cache churn, and 5 move costs of it
// would be a second or more in a fleet like llm-d's (keepsWarm).
func TestCostSlotsWaitBeyondMoveCostLeaves(t *testing.T) {
	s := newSlotScene(t, 3, 400, "")
	s.read(t, 2, 1, 3)
	if got := learnedField(t, s.warm.addr(), "slots"); got != 2 {
		t.Errorf("learned slots %v, want 2", got)
	}
	if s.probe(t) {
		t.Errorf("with a 2 s wait for a slot against a 0.8 s move, the warm upstream kept the request; want it sent to the cold upstream")
	}
}

// The same wait on the session's upstream: the session leaves it (the session path applies the
// slot rule too), though the balance band and ttft_slack alone would keep it there.
func TestCostSlotsSessionLeavesOnWait(t *testing.T) {
	s := newSlotScene(t, 3, 400, "slot-session")
	s.read(t, 2, 1, 3)
	if got := learnedField(t, s.warm.addr(), "slots"); got != 2 {
		t.Errorf("learned slots %v, want 2", got)
	}
	if s.probe(t) {
		t.Errorf("with a 2 s wait for a slot against a 0.8 s move, the session's upstream kept the request; want it sent to the cold upstream")
	}
}

// A warm upstream whose slot wait is shorter than what a move costs keeps the request: the
// same 3 in flight on 2 slots, a service time of 0.2 s (20 expected output tokens), a wait of
// 0.1 s against the 0.8 s move.
func TestCostSlotsShortWaitKeeps(t *testing.T) {
	s := newSlotScene(t, 3, 20, "")
	s.read(t, 2, 1, 3)
	if got := learnedField(t, s.warm.addr(), "slots"); got != 2 {
		t.Fatalf("learned slots %v, want 2", got)
	}
	if !s.probe(t) {
		t.Errorf("with a 0.1 s wait for a slot against a 0.8 s move, the warm upstream lost the request")
	}
}

// A warm upstream with free slots keeps the request: it learned 8 slots (8 running, 1 waiting,
// read while others were sent there), then runs the 4 requests held there and queues none.
func TestCostSlotsFreeWarmKeepsRequest(t *testing.T) {
	s := newSlotScene(t, 4, 400, "")
	s.warm.set(8, 1, "")
	waitScrapes(t, s.warm, minSlotSamples+2)
	s.warm.set(4, 0, "")
	waitScrapes(t, s.warm, 3)
	s.waitLoad(t, 4)
	if got := learnedField(t, s.warm.addr(), "slots"); got != 8 {
		t.Fatalf("learned slots %v, want 8", got)
	}
	if !s.probe(t) {
		t.Errorf("with 4 of its 8 slots busy, the warm upstream lost the request")
	}
}

// objective completion: a warm upstream whose engine decodes 4× slower than the cold one (25
// output tokens per second per request against 100) loses the request: its 100 expected
// output tokens (the probe's max_tokens 500 does not bound them) take 4 s there against 1 s,
// and the move costs 0.8 s (the cold upstream's prefill of the 2,000-token prompt at 5,000
// per second, and as much again for what it forfeits). Its TTFT is the lowest: under
// objective latency it keeps the request.
func TestCostCompletionSlowDecoderLosesWarmRequest(t *testing.T) {
	for _, tc := range []struct {
		objective string
		toWarm    bool
	}{{"completion", false}, {"latency", true}} {
		t.Run(tc.objective, func(t *testing.T) {
			s := newSlotScene(t, 0, 100, "", "objective "+tc.objective)
			s.probeMaxTokens = 500
			s.setDecode(t, s.warm, 25)
			if got := s.probe(t); got != tc.toWarm {
				t.Errorf("objective %s, with 3 s more of decode than a 0.8 s move: the probe went to the warm upstream %v, want %v", tc.objective, got, tc.toWarm)
			}
		})
	}
}

// objective completion: a warm upstream a little slower at decode (80 tokens per second
// against 100: 1.25 s against 1 s) keeps the request, the 0.25 s being less than the move
// costs; and so does a session's upstream 4× slower when the request's max_tokens bounds its
// output (the probe's 16 of the 100 expected: 0.64 s against 0.16 s).
func TestCostCompletionSlightlySlowerDecoderKeeps(t *testing.T) {
	t.Run("80 against 100", func(t *testing.T) {
		s := newSlotScene(t, 0, 100, "", "objective completion")
		s.probeMaxTokens = 500
		s.setDecode(t, s.warm, 80)
		if !s.probe(t) {
			t.Errorf("with 0.25 s more of decode than the cold upstream against a 0.8 s move, the warm upstream lost the request")
		}
	})
	t.Run("session, max_tokens 16", func(t *testing.T) {
		s := newSlotScene(t, 0, 100, "decode-session", "objective completion")
		s.setDecode(t, s.warm, 25)
		if !s.probe(t) {
			t.Errorf("with 0.48 s more of decode (16 tokens) against a 0.8 s move, the session's upstream lost the request")
		}
	})
}

// objective completion: a session leaves an upstream 4× slower at decode as a warm request
// does (band.keeps).
func TestCostCompletionSlowDecoderSessionLeaves(t *testing.T) {
	s := newSlotScene(t, 0, 100, "decode-session", "objective completion")
	s.probeMaxTokens = 500
	s.setDecode(t, s.warm, 25)
	if s.probe(t) {
		t.Errorf("with 3 s more of decode than a 0.8 s move, the session's upstream kept the request")
	}
}

// Without a learned slot count (the engine never reports a queue), the prediction is the
// prefill queue's alone: no slot wait on any candidate, and the warm upstream keeps the
// request, however many are in flight there.
func TestCostSlotsUnlearnedChangeNothing(t *testing.T) {
	s := newSlotScene(t, 4, 400, "")
	s.read(t, 4, 0, 4)
	if got := learnedField(t, s.warm.addr(), "slots"); got != 0 && !math.IsNaN(got) {
		t.Errorf("learned slots %v from readings without a queue, want none", got)
	}
	if !s.probe(t) {
		t.Errorf("no slot count learned: the warm upstream lost the request")
	}
	_, body := adminCall(t, http.MethodGet, "/kvroute/")
	var st struct {
		Recent []struct {
			Candidates []map[string]any `json:"candidates"`
		} `json:"recent_decisions"`
	}
	if err := json.Unmarshal(body, &st); err != nil || len(st.Recent) == 0 {
		t.Fatalf("recent decisions: %v %s", err, body)
	}
	for _, c := range st.Recent[0].Candidates {
		if w, ok := c["slot_wait_ms"].(float64); !ok || w != 0 {
			t.Errorf("the probe's candidate %v: slot_wait_ms %v, want 0", c["upstream"], c["slot_wait_ms"])
		}
	}
}

// Bad readings teach nothing and break nothing: a queue with nothing running, a negative
// running count, ones beyond any engine's (2^40 and the readers' own bound of 10^9 refuse;
// maxSlots + 1 and 999,999,999 reach the policy). Then good readings teach 2 slots, and a reading of
// an absurd load bounds the predicted slot wait (the upstream then leaves the balance band;
// decisions go on).
func TestCostSlotsBadReadings(t *testing.T) {
	leakCheck(t)
	engines := []*engine{newEngine(t, "u1", 1000), newEngine(t, "u2", 1000)}
	feedDecode(t, engines...)
	startCaddy(t, telemetryConfig(engines, "", "", "decision cost", "expected_tokens 400"))
	client := newClient(t, 30*time.Second)
	e := engines[0]
	ask := func(i int) {
		t.Helper()
		if _, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(i))); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	ask(0)
	waitUntil(t, 20*time.Second, func() bool {
		l := upstreamStatus(t, e.addr()).Learned
		return l != nil && l.DecodeLearned
	}, "the decode speed learned")
	for i, r := range [][2]int{{0, 5}, {-3, 2}, {1 << 40, 3}, {maxSlots + 1, 1}, {999_999_999, 3}} {
		e.set(r[0], r[1], "")
		waitScrapes(t, e, minSlotSamples+2)
		ask(i + 1)
		if got := learnedField(t, e.addr(), "slots"); got != 0 && !math.IsNaN(got) {
			t.Errorf("running %d, waiting %d: learned %v slots, want none", r[0], r[1], got)
		}
	}
	e.set(2, 2, "")
	waitScrapes(t, e, minSlotSamples+2)
	waitUntil(t, 20*time.Second, func() bool { return learnedField(t, e.addr(), "slots") == 2 }, "2 slots learned")
	// The readers refuse a gauge beyond 10^9 (telemetry.Parse): just under it is the largest
	// load a reading can bring.
	e.set(999_999_999, 3, "")
	waitScrapes(t, e, 3)
	waitUntil(t, 20*time.Second, func() bool { return upstreamStatus(t, e.addr()).Load > 5e8 }, "the absurd load counted")
	ask(10)
	if got := learnedField(t, e.addr(), "slots"); got != 2 {
		t.Errorf("after a reading of 999,999,999 running: %v slots, want 2 kept", got)
	}
	st := getStatus(t)
	if len(st.RecentDecisions) == 0 {
		t.Fatal("no recent decision")
	}
	for _, c := range st.RecentDecisions[0].Candidates {
		if c.PredictedTTFT > maxSlotWaitSeconds*1e3+1e3 || math.IsNaN(c.PredictedTTFT) {
			t.Errorf("candidate %s: predicted TTFT %v ms, want at most the bound of %v s and a little", c.Upstream, c.PredictedTTFT, maxSlotWaitSeconds)
		}
	}
}

// The slot count is the median of the latest readings with a queue: one odd reading does not
// move it, a lasting change does.
func TestSlotLearnMedian(t *testing.T) {
	var s slotLearn
	now := int64(1e18)
	read := func(running, waiting int64) {
		s.observe(&telemetry.Reading{Figures: telemetry.Figures{Running: running, Waiting: waiting, Known: telemetry.HasRunning | telemetry.HasWaiting}}, now, false)
	}
	read(2, 1)
	read(2, 3)
	if n, _ := s.figures(now); n != 0 {
		t.Errorf("after 2 readings: %d slots, want none yet", n)
	}
	read(7, 1) // one odd reading
	read(2, 0) // no queue, no more than the figure: no sample
	read(0, 4) // nothing running: no sample
	if n, _ := s.figures(now); n != 2 {
		t.Errorf("2, 2 and one odd 7: %d slots, want 2", n)
	}
	for range slotWindow {
		read(8, 2)
	}
	if n, _ := s.figures(now); n != 8 {
		t.Errorf("a lasting 8: %d slots, want 8", n)
	}
	s.reset()
	if n, out := s.figures(now); n != 0 || out != 0 {
		t.Errorf("after a reset: %d slots, %v output, want none", n, out)
	}
}

// TestSlotLearnTooLowRecovers: a queue that formed below the slot count (a chunked-prefill
// budget, a burst between scheduler steps) taught 2; the engine then runs 8 with no queue,
// which a figure of 2 cannot explain: the figure follows, though the engine never queues again
// (the slot term keeps traffic off a "full" engine, so it would not).
func TestSlotLearnTooLowRecovers(t *testing.T) {
	var s slotLearn
	now := int64(1e18)
	read := func(running, waiting int64) {
		s.observe(&telemetry.Reading{Figures: telemetry.Figures{Running: running, Waiting: waiting, Known: telemetry.HasRunning | telemetry.HasWaiting}}, now, false)
	}
	for range minSlotSamples {
		read(2, 1)
	}
	if n, _ := s.figures(now); n != 2 {
		t.Fatalf("learned %d slots, want 2", n)
	}
	for range slotWindow {
		read(8, 0)
	}
	if n, _ := s.figures(now); n != 8 {
		t.Errorf("8 running without a queue against a figure of 2: %d slots, want 8", n)
	}
}

// TestSlotLearnSamplesAge: a slot count stands slotSampleLife after its last sample, then
// lapses (no term) until the engine queues again: an engine reconfigured behind its address
// without a restart the counters show is not priced at its old batch forever.
func TestSlotLearnSamplesAge(t *testing.T) {
	var s slotLearn
	now := int64(1e18)
	for range minSlotSamples {
		s.observe(&telemetry.Reading{Figures: telemetry.Figures{Running: 4, Waiting: 1, Known: telemetry.HasRunning | telemetry.HasWaiting}}, now, false)
	}
	if n, _ := s.figures(now + int64(slotSampleLife)); n != 4 {
		t.Errorf("at the end of the samples' life: %d slots, want 4", n)
	}
	if n, _ := s.figures(now + int64(slotSampleLife) + 1); n != 0 {
		t.Errorf("past the samples' life: %d slots, want none", n)
	}
}

// TestSlotWaitNeedsAFreshReading: learned figures price a slot wait only while the engine's
// reading is fresh; with telemetry off since, its reader gone or its metrics failing, the
// figures may describe an engine that is no longer there.
func TestSlotWaitNeedsAFreshReading(t *testing.T) {
	p := &KVCacheAware{}
	p.opts.expectedTokens = 100
	u := &upstreamState{addr: "a:1"}
	u.learn.figures.Store(&learnedFigures{Slots: 2, DecodeLearned: true, DecodeTokensPerSecond: 100})
	c := candidate{st: u, load: 3}
	now := time.Now().UnixNano()
	if w := p.slotWait(&c, now); w != 0 {
		t.Errorf("no reading of the engine: wait %v, want 0", w)
	}
	u.engine.Store(&engineView{until: now + int64(time.Second)})
	if w := p.slotWait(&c, now); math.Abs(w-1) > 1e-9 {
		t.Errorf("fresh reading, 3 in flight on 2 slots, 1 s of service: wait %v, want 1 s", w)
	}
	if w := p.slotWait(&c, now+int64(2*time.Second)); w != 0 {
		t.Errorf("stale reading: wait %v, want 0", w)
	}
	u.learn.forgetSlots()
	if f := u.learn.figures.Load(); f.Slots != 0 || !f.DecodeLearned {
		t.Errorf("after forgetSlots: %+v, want no slots and the decode speed kept", f)
	}
	if w := p.slotWait(&c, now); w != 0 {
		t.Errorf("slots forgotten: wait %v, want 0", w)
	}
}

// TestSlotLearnKeptWhileHeld: while the router holds requests back (its queue), the engines
// run at their figure with no queue of their own; those readings keep the figure standing
// past slotSampleLife (else the router would stop holding requests back and the engines would
// queue until it was learned again). Readings below the figure are no sample, held or not.
func TestSlotLearnKeptWhileHeld(t *testing.T) {
	for _, held := range []bool{false, true} {
		var s slotLearn
		now := int64(1e18)
		read := func(running, waiting int64) {
			s.observe(&telemetry.Reading{Figures: telemetry.Figures{Running: running, Waiting: waiting, Known: telemetry.HasRunning | telemetry.HasWaiting}}, now, held)
		}
		for range minSlotSamples {
			read(4, 1)
		}
		for range 3 * slotWindow {
			now += int64(slotSampleLife) / 4
			read(4, 0) // at the figure, no queue: the router holds the rest (or nothing waits)
			read(3, 0) // below it: never a sample
		}
		n, _ := s.figures(now)
		if want := map[bool]int64{false: 0, true: 4}[held]; n != want {
			t.Errorf("held=%v: %d slots after %v of readings at the figure, want %d", held, n, time.Duration(3*slotWindow*slotSampleLife/4), want)
		}
	}
}
