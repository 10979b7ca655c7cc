package engine

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

const ms = time.Millisecond
const us = time.Microsecond

// testConfig makes step times easy to add up by hand: 1 ms + 10 µs per prefill token + 100 µs
// per sequence; blocks of 4 tokens.
func testConfig() Config {
	return Config{
		MaxNumSeqs:      2,
		MaxBatchTokens:  100,
		BlockTokens:     4,
		CapacityBlocks:  1000,
		StepFixed:       1 * ms,
		PerPrefillToken: 10 * us,
		PerSeq:          100 * us,
	}
}

// run drives e until it is idle, submitting each request at its time, and returns the timeline
// as "time kind id(cached)" lines.
func run(t *testing.T, e *Engine, subs []sub) []string {
	t.Helper()
	var log []string
	now := time.Duration(0)
	for len(subs) > 0 || e.Busy() {
		next := time.Duration(1 << 62)
		if e.Busy() {
			next = e.StepEnd()
		}
		if len(subs) > 0 && subs[0].at <= next {
			// Every request of the same moment is queued before the engine schedules.
			now = subs[0].at
			for len(subs) > 0 && subs[0].at == now {
				e.Submit(subs[0].r, now)
				subs = subs[1:]
			}
			if e.Busy() && e.StepEnd() > now {
				continue
			}
		} else {
			now = next
		}
		evs, _ := e.Advance(now)
		for _, ev := range evs {
			log = append(log, fmt.Sprintf("%v %v %d(%d)", now, ev.Kind, ev.Req.ID, ev.Cached))
		}
	}
	return log
}

type sub struct {
	at time.Duration
	r  *Request
}

func req(id uint64, tokens, output int, hashes ...uint64) *Request {
	return &Request{ID: id, Tokens: tokens, Output: output, Hashes: hashes}
}

func check(t *testing.T, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("timeline:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A batch that fills: two sequences at most, the third request waits until both finish.
//
//	0.0 ms  A and B admitted: 40 prefill tokens, 2 seqs: 1 + 0.4 + 0.2 = 1.6 ms
//	1.6 ms  first tokens of A and B; decode step 1 + 0.2 = 1.2 ms (C waits: batch full)
//	2.8 ms  second tokens; decode step 1.2 ms
//	4.0 ms  A and B finish (3 tokens); C admitted: 1 + 0.2 + 0.1 = 1.3 ms
//	5.3 ms  C's first token; two decode steps of 1.1 ms
//	7.5 ms  C finishes
func TestBatchFills(t *testing.T) {
	e := New(testConfig(), 0)
	a, b, c := req(1, 20, 3), req(2, 20, 3), req(3, 20, 3)
	e.Submit(a, 0)
	e.Submit(b, 0)
	e.Submit(c, 0)
	e.Advance(0)
	if r := e.Reading(); r.Running != 2 || r.Waiting != 1 {
		t.Errorf("after the first schedule: running %d waiting %d, want 2 and 1", r.Running, r.Waiting)
	}
	// D would be admitted with C when A and B finish at 4.0 ms: 40 tokens, 2 seqs, 1.6 ms.
	if got := e.PredictTTFT(req(4, 20, 3), 0); got != 5600*us {
		t.Errorf("PredictTTFT(D) = %v, want 5.6ms", got)
	}
	got := run(t, e, nil)
	check(t, got, []string{
		"1.6ms first-token 1(0)",
		"1.6ms first-token 2(0)",
		"4ms finished 1(0)",
		"4ms finished 2(0)",
		"5.3ms first-token 3(0)",
		"7.5ms finished 3(0)",
	})
	if r := e.Reading(); r.Finished != 3 || r.PromptTokens != 60 || r.GenerationTokens != 9 || r.TTFTCount != 3 {
		t.Errorf("counters: %+v", r)
	}
}

// A long prompt is prefilled in chunks of the token budget; a short request joins in the step
// where the budget has room.
//
//	0.0 ms  L admitted, 100 of its 250 tokens: 1 + 1.0 + 0.1 = 2.1 ms; S waits (no budget)
//	2.1 ms  L's next 100 tokens: 2.1 ms
//	4.2 ms  L's last 50 and S's 30: 1 + 0.8 + 0.2 = 2.0 ms
//	6.2 ms  first tokens of L and S; a decode step of 1.2 ms
//	7.4 ms  both finish
func TestChunkedPrefill(t *testing.T) {
	e := New(testConfig(), 0)
	got := run(t, e, []sub{{0, req(1, 250, 2)}, {0, req(2, 30, 2)}})
	check(t, got, []string{
		"6.2ms first-token 1(0)",
		"6.2ms first-token 2(0)",
		"7.4ms finished 1(0)",
		"7.4ms finished 2(0)",
	})
}

// The cache holds 10 blocks of 4 tokens. Each request has 4 full blocks and needs 5 while it
// runs (16 prompt + 1 output tokens). After P1 and P2, 8 blocks are cached; P3 needs 5 with 2
// free, so the 3 least recently released blocks go: P1's tail (its blocks are released last
// to first). P1 then hits only its first block, P2 its first three (never the last token).
func TestEviction(t *testing.T) {
	cfg := testConfig()
	cfg.CapacityBlocks = 10
	e := New(cfg, 0)
	p1 := req(1, 16, 1, 11, 12, 13, 14)
	p2 := req(2, 16, 1, 21, 22, 23, 24)
	p3 := req(3, 16, 1, 31, 32, 33, 34)
	run(t, e, []sub{{0, p1}, {10 * ms, p2}})
	if r := e.Reading(); r.Evictions != 0 || e.cache.size() != 8 {
		t.Fatalf("after P1 and P2: %d cached, %d evictions; want 8 and 0", e.cache.size(), r.Evictions)
	}
	run(t, e, []sub{{20 * ms, p3}})
	if r := e.Reading(); r.Evictions != 3 {
		t.Errorf("evictions %d, want 3", r.Evictions)
	}
	if got := e.Lookup(p1); got != 4 {
		t.Errorf("P1 cached tokens %d, want 4 (its first block)", got)
	}
	if got := e.Lookup(p2); got != 12 {
		t.Errorf("P2 cached tokens %d, want 12", got)
	}
	// P2 again: 12 tokens hit, 4 computed: 1 + 0.04 + 0.1 = 1.14 ms.
	got := run(t, e, []sub{{30 * ms, req(4, 16, 1, 21, 22, 23, 24)}})
	check(t, got, []string{"31.14ms first-token 4(12)", "31.14ms finished 4(12)"})
	if r := e.Reading(); r.PrefixQueries != 64 || r.PrefixHits != 12 {
		t.Errorf("prefix queries %d hits %d, want 64 and 12", r.PrefixQueries, r.PrefixHits)
	}
}

// A request that does not fit waits until a running one frees its blocks.
func TestAdmissionWaitsForBlocks(t *testing.T) {
	cfg := testConfig()
	cfg.CapacityBlocks = 6
	e := New(cfg, 0)
	// Each needs 5 blocks: the second waits for the first to finish (1.1 + 0.16 = 1.26 ms).
	got := run(t, e, []sub{{0, req(1, 16, 1, 11, 12, 13, 14)}, {0, req(2, 16, 1, 21, 22, 23, 24)}})
	check(t, got, []string{
		"1.26ms first-token 1(0)",
		"1.26ms finished 1(0)",
		"2.52ms first-token 2(0)",
		"2.52ms finished 2(0)",
	})
	// Larger than the whole cache: dropped.
	got = run(t, e, []sub{{10 * ms, req(3, 40, 1)}})
	check(t, got, []string{"10ms aborted 3(0)"})
}

// A restart drops what the engine holds and resets its cache and counters.
func TestRestart(t *testing.T) {
	e := New(testConfig(), 0)
	run(t, e, []sub{{0, req(1, 16, 1, 11, 12, 13, 14)}})
	if e.Lookup(req(9, 16, 1, 11, 12, 13, 14)) != 12 {
		t.Fatal("P1 not cached before the restart")
	}
	e.Submit(req(2, 20, 5), 5*ms)
	e.Submit(req(3, 20, 5), 5*ms)
	e.Submit(req(4, 20, 5), 5*ms)
	e.Advance(5 * ms)
	evs := e.Restart(6 * ms)
	var got []string
	for _, ev := range evs {
		got = append(got, fmt.Sprintf("%v %d", ev.Kind, ev.Req.ID))
	}
	check(t, got, []string{"aborted 2", "aborted 3", "aborted 4"})
	r := e.Reading()
	if r.Running != 0 || r.Waiting != 0 || r.PromptTokens != 0 || r.Finished != 0 || r.Started != 6*ms || r.KVUsage != 0 {
		t.Errorf("after the restart: %+v", r)
	}
	if e.Busy() || e.Lookup(req(9, 16, 1, 11, 12, 13, 14)) != 0 {
		t.Error("the restart kept a step or the cache")
	}
	got = run(t, e, []sub{{7 * ms, req(5, 16, 1, 11, 12, 13, 14)}})
	check(t, got, []string{"8.26ms first-token 5(0)", "8.26ms finished 5(0)"})
}

// A batch holds at most MaxLoras adapters; a request of a third adapter is passed over, and the
// one behind it runs.
func TestMaxLoras(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs = 3
	cfg.MaxLoras = 1
	e := New(cfg, 0)
	a := &Request{ID: 1, Tokens: 10, Output: 2, Adapter: "x"}
	b := &Request{ID: 2, Tokens: 10, Output: 2, Adapter: "y"}
	c := &Request{ID: 3, Tokens: 10, Output: 2, Adapter: "x"}
	got := run(t, e, []sub{{0, a}, {0, b}, {0, c}})
	// A and C: 1 + 0.2 + 0.2 = 1.4 ms, decode 1.2 ms; then B: 1 + 0.1 + 0.1 = 1.2, 1.1.
	check(t, got, []string{
		"1.4ms first-token 1(0)",
		"1.4ms first-token 3(0)",
		"2.6ms finished 1(0)",
		"2.6ms finished 3(0)",
		"3.8ms first-token 2(0)",
		"4.9ms finished 2(0)",
	})
}

// PredictTTFT matches the timeline when the cache plays no part.
func TestPredictTTFT(t *testing.T) {
	lora := func(id uint64, adapter string) *Request {
		return &Request{ID: id, Tokens: 20, Output: 5, Adapter: adapter}
	}
	cases := []struct {
		name   string
		subs   []*Request
		target *Request
		cfg    func(*Config)
	}{
		{"idle", nil, nil, nil},
		{"batch full", []*Request{req(1, 20, 3), req(2, 20, 3)}, nil, nil},
		{"queue", []*Request{req(1, 20, 30), req(2, 300, 3), req(3, 50, 8), req(4, 20, 1)}, nil, nil},
		{"long prefill ahead", []*Request{req(1, 1000, 4)}, nil, nil},
		// 40 blocks: the first two requests take 32 of them (16 each), the third waits for
		// room, and so does the target (8 blocks) behind it.
		{"KV room", []*Request{req(1, 60, 4), req(2, 60, 4), req(3, 60, 4)}, req(99, 28, 4),
			func(c *Config) { c.CapacityBlocks = 40; c.MaxNumSeqs = 4 }},
		// One adapter at a time: the target's adapter waits until x's requests are done.
		{"LoRA", []*Request{lora(1, "x"), lora(2, "x")}, lora(99, "y"),
			func(c *Config) { c.MaxLoras = 1; c.MaxNumSeqs = 4 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			e := New(cfg, 0)
			for _, r := range tc.subs {
				e.Submit(r, 0)
			}
			e.Advance(0)
			target := req(99, 120, 2)
			if tc.target != nil {
				target = tc.target
			}
			pred := e.PredictTTFT(target, 0)
			var got time.Duration
			for _, line := range run(t, e, []sub{{0, target}}) {
				var at time.Duration
				var rest string
				f := strings.Fields(line)
				at, _ = time.ParseDuration(f[0])
				rest = f[1] + " " + f[2]
				if rest == "first-token 99(0)" {
					got = at
				}
			}
			if pred != got {
				t.Errorf("predicted %v, ran %v", pred, got)
			}
		})
	}
}

// Abort: a waiting request leaves the queue; a running one leaves the batch, its computed
// blocks cached, and the request behind it is admitted at the next step.
//
//	0.0 ms  A and B admitted (2 seqs), C waits; A aborted mid-step
//	1.6 ms  B's first token (the step keeps its end); C admitted: 1 + 0.2 + 0.2 = 1.4 ms
//	3.0 ms  C's first token, B finishes (2 tokens)
func TestAbort(t *testing.T) {
	e := New(testConfig(), 0)
	a, b, c, d := req(1, 20, 3, 1, 2, 3, 4, 5), req(2, 20, 2), req(3, 20, 2), req(4, 20, 2)
	for _, r := range []*Request{a, b, c, d} {
		e.Submit(r, 0)
	}
	e.Advance(0)
	if !e.Abort(d) || !e.Abort(a) || e.Abort(a) {
		t.Fatal("Abort: want true for a waiting and a running request, false for one gone")
	}
	if r := e.Reading(); r.Running != 1 || r.Waiting != 1 || r.KVUsage != 6.0/1000 {
		t.Errorf("after the aborts: running %d waiting %d usage %v, want 1, 1 and B's 6 blocks", r.Running, r.Waiting, r.KVUsage)
	}
	check(t, run(t, e, nil), []string{
		"1.6ms first-token 2(0)",
		"3ms finished 2(0)",
		"3ms first-token 3(0)",
		"4.1ms finished 3(0)",
	})
	// A computed nothing before it left: none of its blocks is cached.
	if got := e.Lookup(req(5, 21, 1, 1, 2, 3, 4, 5)); got != 0 {
		t.Errorf("A's prompt hits %d tokens after A was aborted before its step ended, want 0", got)
	}
}

// A remote request (its KV transferred from a prefill engine) computes only its last prompt
// token, and its blocks are cached as if computed here; Generated follows the decode.
//
//	0.0 ms  R admitted: 1 prefill token, 1 seq: 1 + 0.01 + 0.1 = 1.11 ms
//	1.11 ms R's first token; decode steps of 1.1 ms
//	3.31 ms R finishes (3 tokens)
func TestRemote(t *testing.T) {
	e := New(testConfig(), 0)
	r := req(1, 20, 3, 1, 2, 3, 4, 5)
	r.Remote = true
	e.Submit(r, 0)
	e.Advance(0)
	var seen []int
	for e.Busy() {
		evs, _ := e.Advance(e.StepEnd())
		for _, ev := range evs {
			seen = append(seen, -int(ev.Kind))
		}
		e.Generated(func(q *Request, n int) {
			if q == r {
				seen = append(seen, n)
			}
		})
		if !e.Busy() && e.Reading().Finished == 1 && e.StepEnd() != 3310*us {
			t.Errorf("finished at %v, want 3.31ms", e.StepEnd())
		}
	}
	if want := []int{-int(FirstToken), 1, 2, -int(Finished)}; !slices.Equal(seen, want) {
		t.Errorf("events and generated counts %v, want %v", seen, want)
	}
	if got := e.Lookup(req(2, 21, 1, 1, 2, 3, 4, 5)); got != 20 {
		t.Errorf("the transferred prompt hits %d tokens, want 20 (its 5 blocks)", got)
	}
	if rd := e.Reading(); rd.PrefixQueries != 20 || rd.PrefixHits != 0 || rd.CachedBlocks != 5 {
		t.Errorf("reading %+v: want 20 queried, 0 hit, 5 blocks cached", rd)
	}
}

// Negative step coefficients mean none: a step that takes no time.
func TestNoTime(t *testing.T) {
	e := New(Config{StepFixed: -1, PerPrefillToken: -1, PerSeq: -1}, 0)
	check(t, run(t, e, []sub{{0, req(1, 100, 3)}}), []string{"0s first-token 1(0)", "0s finished 1(0)"})
}
