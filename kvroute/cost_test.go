package kvroute

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/kvroute/caddy-kvroute/energy"
)

// decisionUnderTest is the rule the decision cost tests run: decision cost. (Set to
// decisionThresholds, they show what today's rule does on the same workloads.)
var decisionUnderTest = decisionCost

// costPolicy provisions a policy with decision cost, the given upstream blocks and, when
// feedback, llm_feedback's first-token reports assumed for every upstream of pool: requests
// then count in the queued prefill until they end, whatever time the test takes.
func costPolicy(t *testing.T, pool reverseproxy.UpstreamPool, ups map[string]energy.Profile, feedback bool, opts ...func(*KVCacheAware)) *KVCacheAware {
	t.Helper()
	p := &KVCacheAware{Decision: decisionUnderTest, Upstreams: ups}
	for _, o := range opts {
		o(p)
	}
	p = newPolicy(t, p)
	for _, u := range pool {
		p.state.upstream(u.Dial).firstTokens.Store(feedback)
	}
	return p
}

// hold runs Select for a request that stays in flight until the test ends, and returns the
// chosen dial address.
func hold(t *testing.T, p *KVCacheAware, pool reverseproxy.UpstreamPool, prompt string, headers ...string) string {
	t.Helper()
	r, cancel := chatRequest("m", prompt, headers...)
	t.Cleanup(cancel)
	up := p.Select(pool, r, nil)
	if up == nil {
		t.Fatal("no upstream")
	}
	return up.Dial
}

// bigCold is a cold prompt of about tokens tokens (4 chars each) that shares no prefix with
// another i.
func bigCold(i, tokens int) string {
	s := coldPrompt(i) + " "
	return s + strings.Repeat("lorem ipsum ", (tokens*4-len(s))/12+1)
}

// A slow engine gets proportionally less: two of four upstreams prefill 4× slower (their
// prior), and 10 cold requests in flight go 1 to each slow one and 4 to each fast one (within
// the balance band, which bounds the counts).
func TestCostSlowEngineGetsLess(t *testing.T) {
	pool := newPool("slow1:1", "slow2:1", "fast1:1", "fast2:1")
	ups := map[string]energy.Profile{
		"slow1:1": {PrefillTokensPerSecond: 1000}, "slow2:1": {PrefillTokensPerSecond: 1000},
		"fast1:1": {PrefillTokensPerSecond: 4000}, "fast2:1": {PrefillTokensPerSecond: 4000},
	}
	p := costPolicy(t, pool, ups, true)
	got := map[string]int{}
	for i := range 10 {
		got[hold(t, p, pool, bigCold(i, 1000))]++
	}
	if got["slow1:1"] > 1 || got["slow2:1"] > 1 || got["fast1:1"] < 4 || got["fast2:1"] < 4 {
		t.Errorf("10 cold requests, two upstreams 4× slower: %v; want 1 on each slow one and 4 on each fast one", got)
	}
}

// A warm upstream keeps its requests until its queue costs more than a re-prefill elsewhere
// (by ttft_slack, 0.25 here), the re-prefill priced at what it forfeits: with a 2,000-token
// prefix cached on a and 100 new tokens per request, a takes 51 requests in flight (its
// predicted TTFT, 100 × 52 tokens, then passes 1.25 × the 2,100 tokens b would prefill plus
// the 2,000 of a's prefix that would take b's cache). The balance band, which bounds counts
// (and is tested apart), is set wide here: with it, a would keep 5.
func TestCostWarmUpstreamKeepsRequestsUntilItsQueueCostsMore(t *testing.T) {
	pool := newPool("a:1", "b:1")
	slack, wide := 0.25, 1000
	p := costPolicy(t, pool, nil, true, func(p *KVCacheAware) { p.TTFTSlack, p.BalanceAbsThreshold = &slack, &wide })
	prefix := strings.Repeat("You are a careful assistant. ", 276) // 8,004 chars: about 2,000 tokens
	if got := pick(t, p, newPool("a:1"), "m", prefix+"warm up"); got != "a:1" {
		t.Fatalf("warming a: went to %s", got)
	}
	first := -1
	for i := range 60 {
		suffix := fmt.Sprintf("%03d %s", i, strings.Repeat("question ", 44)) // about 100 tokens
		if got := hold(t, p, pool, prefix+suffix); got != "a:1" && first < 0 {
			first = i
			queued := p.state.upstream("a:1").prefillTokens.Load()
			t.Logf("request %d left a, whose queued prefill was %d tokens", i, queued)
		}
	}
	if first < 50 || first > 52 {
		t.Errorf("the first request to leave the warm upstream was number %d; want about 51 (its queue then costs 1.25 × a re-prefill of 2,100 tokens and the 2,000 it forfeits)", first)
	}
}

// Moving a request away from the upstream that holds its prefix is priced at what the move
// forfeits: the prefix prefilled where it goes, now and once more for the cache it takes
// there. ttft_slack 2, a 2,000-token prefix on a, 100 new tokens: with 7,500 tokens queued on
// a (1.52 s against 0.42 s on an empty b) a keeps the request, since b's 0.42 s plus the
// 0.40 s of the prefix it would take from b's cache is 0.82 s, and 1.52 s is within 3× of it;
// with 15,000 queued (3.02 s) the request goes to b.
func TestCostWarmUpstreamKeepsWhatAMoveWouldForfeit(t *testing.T) {
	pool := newPool("a:1", "b:1")
	slack, wide := 2.0, 1000
	p := costPolicy(t, pool, nil, true, func(p *KVCacheAware) { p.TTFTSlack, p.BalanceAbsThreshold = &slack, &wide })
	prefix := strings.Repeat("You are a careful assistant. ", 276) // 8,004 chars: about 2,000 tokens
	if got := pick(t, p, newPool("a:1"), "m", prefix+"warm up"); got != "a:1" {
		t.Fatalf("warming a: went to %s", got)
	}
	queue := func(from, to int) {
		for i := from; i < to; i++ {
			if got := hold(t, p, newPool("a:1"), bigCold(200+i, 2500)); got != "a:1" {
				t.Fatalf("queueing on a: went to %s", got)
			}
		}
	}
	ask := func(n int) string {
		return hold(t, p, pool, prefix+fmt.Sprintf("%03d %s", n, strings.Repeat("question ", 44))) // about 100 new tokens
	}
	queue(0, 3)
	if got, q := ask(0), p.state.upstream("a:1").prefillTokens.Load(); got != "a:1" {
		t.Errorf("with %d tokens queued on a, the request holding a's prefix went to %s; want a (a move would forfeit the prefix)", q, got)
	}
	queue(3, 6)
	if got, q := ask(1), p.state.upstream("a:1").prefillTokens.Load(); got != "b:1" {
		t.Errorf("with %d tokens queued on a, the request went to %s; want b (a's queue costs more than the move)", q, got)
	}
}

// A session stays on its upstream while leaving would cost more than the queue there: the
// conversation (about 2,000 tokens) would be prefilled elsewhere and evict as much there.
// ttft_slack 2, 7,500 tokens queued on the session's upstream: it stays.
func TestCostSessionStaysWhileAMoveWouldForfeitMore(t *testing.T) {
	pool := newPool("a:1", "b:1")
	slack, wide := 2.0, 1000
	p := costPolicy(t, pool, nil, true, func(p *KVCacheAware) { p.TTFTSlack, p.BalanceAbsThreshold = &slack, &wide })
	conv := "session turn: " + strings.Repeat("tell me about the sea ", 364) // about 2,000 tokens
	if got := pick(t, p, newPool("a:1"), "m", conv, "X-Session-ID", "s1"); got != "a:1" {
		t.Fatalf("starting the session on a: went to %s", got)
	}
	for i := range 3 {
		if got := hold(t, p, newPool("a:1"), bigCold(300+i, 2500)); got != "a:1" {
			t.Fatalf("queueing on a: went to %s", got)
		}
	}
	if got := pick(t, p, pool, "m", conv+" and the next turn, "+strings.Repeat("with a question ", 25), "X-Session-ID", "s1"); got != "a:1" {
		t.Errorf("with %d tokens queued on its upstream a, the session went to %s; want a", p.state.upstream("a:1").prefillTokens.Load(), got)
	}
}

// A session leaves its upstream while that upstream's queue makes it slower than ttft_slack
// beyond the best, keeps its binding, and comes back once the queue is gone (the turn it sent
// elsewhere adds less than a KV block: TestCostSessionFollowsItsCache has one that adds more).
// Three long prefills there are within the balance band (3 requests), not within the TTFT
// bound.
func TestCostSessionLeavesSaturatedUpstreamAndComesBack(t *testing.T) {
	pool := newPool("a:1", "b:1")
	p := costPolicy(t, pool, nil, true)
	conv := "session turn: " + strings.Repeat("tell me about the sea ", 20)
	home := pick(t, p, pool, "m", conv, "X-Session-ID", "s1")
	other := otherThan(pool, home)
	// Three 10,000-token prefills queue on home.
	var ends []context.CancelFunc
	for i := range 3 {
		r, cancel := chatRequest("m", bigCold(100+i, 10000))
		ends = append(ends, cancel)
		t.Cleanup(cancel)
		if up := p.Select(newPool(home), r, nil); up == nil || up.Dial != home {
			t.Fatalf("saturating %s: went to %v", home, up)
		}
	}
	if got := pick(t, p, pool, "m", conv+" and the next turn", "X-Session-ID", "s1"); got != other {
		t.Errorf("with 30,000 tokens queued on its upstream %s, the session went to %s; want %s", home, got, other)
	}
	if addr, ok := p.state.sessions.get("m", "s1", time.Now()); !ok || addr != home {
		t.Errorf("the session's binding is %q (%v), want %s kept", addr, ok, home)
	}
	for _, end := range ends {
		end()
	}
	waitFor(t, func() bool { return p.state.upstream(home).prefillTokens.Load() == 0 }, "the queue on the session's upstream gone")
	if got := pick(t, p, pool, "m", conv+" and the next turn", "X-Session-ID", "s1"); got != home {
		t.Errorf("with its queue gone, the session went to %s; want its upstream %s back", got, home)
	}
}

// A session whose turn went elsewhere follows its cache: once the queue that moved it is gone,
// the next turn goes where the tree holds the conversation's latest turn (a KV block or more
// beyond what its upstream holds), not back to re-prefill it, and the binding moves there.
func TestCostSessionFollowsItsCache(t *testing.T) {
	pool := newPool("a:1", "b:1")
	p := costPolicy(t, pool, nil, true)
	conv := "session turn: " + strings.Repeat("tell me about the sea ", 20)
	if got := pick(t, p, newPool("a:1"), "m", conv, "X-Session-ID", "s1"); got != "a:1" {
		t.Fatalf("starting the session on a: went to %s", got)
	}
	var ends []context.CancelFunc
	for i := range 3 {
		r, cancel := chatRequest("m", bigCold(400+i, 10000))
		ends = append(ends, cancel)
		t.Cleanup(cancel)
		if up := p.Select(newPool("a:1"), r, nil); up == nil || up.Dial != "a:1" {
			t.Fatalf("saturating a: went to %v", up)
		}
	}
	turn2 := conv + " and the next turn, " + strings.Repeat("about the waves ", 10) // 180 chars more
	if got := pick(t, p, pool, "m", turn2, "X-Session-ID", "s1"); got != "b:1" {
		t.Fatalf("with 30,000 tokens queued on a, the session went to %s; want b", got)
	}
	for _, end := range ends {
		end()
	}
	waitFor(t, func() bool { return p.state.upstream("a:1").prefillTokens.Load() == 0 }, "the queue on a gone")
	if got := pick(t, p, pool, "m", turn2+" and a third turn", "X-Session-ID", "s1"); got != "b:1" {
		t.Errorf("with its second turn held on b, the session's third turn went to %s; want b", got)
	}
	if addr, ok := p.state.sessions.get("m", "s1", time.Now()); !ok || addr != "b:1" {
		t.Errorf("the session's binding is %q (%v), want b:1", addr, ok)
	}
}

// objective energy picks the fewest joules, but only among the candidates whose predicted
// TTFT is within ttft_slack of the best: the cheap upstream takes more, never all.
func TestCostEnergyWithinSlack(t *testing.T) {
	pool := newPool("dear:1", "cheap:1")
	ups := map[string]energy.Profile{
		"dear:1":  {EnergyPerToken: 100e-6, PrefillEnergyPerToken: 50e-6},
		"cheap:1": {EnergyPerToken: 10e-6, PrefillEnergyPerToken: 5e-6},
	}
	slack := 0.25
	p := costPolicy(t, pool, ups, true, func(p *KVCacheAware) { p.Objective = objectiveEnergy; p.TTFTSlack = &slack })
	got := map[string]int{}
	for i := range 20 {
		got[hold(t, p, pool, bigCold(i, 1000))]++
		recs := p.state.recent.snapshot()
		if len(recs) == 0 {
			t.Fatal("no decision of decision cost recorded")
		}
		rec := recs[0]
		var best, chosen float64 = 1e18, 0
		for _, c := range rec.Candidates {
			best = min(best, c.PredictedTTFT)
			if c.Upstream == rec.Chosen {
				chosen = c.PredictedTTFT
			}
		}
		if bound := ttftBound(best/1e3, slack) * 1e3; chosen > bound+1e-9 {
			t.Errorf("request %d went to %s, predicted TTFT %.1f ms beyond the bound %.1f ms", i, rec.Chosen, chosen, bound)
		}
	}
	if got["cheap:1"] <= got["dear:1"] || got["dear:1"] < 5 {
		t.Errorf("20 requests: %v; want the cheap upstream to take more, the dear one at least 5", got)
	}
}

// Before anything is learned the upstream block's prefill_tokens_per_second is the speed (the
// default without one); a learned speed then replaces it.
func TestCostPriorsBeforeLearned(t *testing.T) {
	pool := newPool("a:1", "b:1")
	ups := map[string]energy.Profile{"a:1": {PrefillTokensPerSecond: 2000}}
	p := costPolicy(t, pool, ups, true, func(p *KVCacheAware) { p.ExplainHeader = "X-Why" })
	explain := func(prompt string) (string, map[string]string) {
		r, cancel := chatRequest("m", prompt)
		t.Cleanup(cancel)
		w := httptest.NewRecorder()
		up := p.Select(pool, r, w)
		fields := map[string]string{}
		for _, kv := range strings.Split(w.Header().Get("X-Why"), "; ") {
			k, v, _ := strings.Cut(kv, "=")
			fields[k] = v
		}
		return up.Dial, fields
	}
	// A cold request goes to b, at the default 5,000 tokens per second.
	up, f := explain(bigCold(1, 1000))
	uncached, _ := strconv.ParseFloat(f["uncached_tokens"], 64)
	ttft, _ := strconv.ParseFloat(f["predicted_ttft_ms"], 64)
	if up != "b:1" || f["decision"] != "cost" || uncached < 900 || abs(ttft-uncached/DefaultPrefillTokensPerSecond*1e3) > 0.1 {
		t.Errorf("cold request on a prior of 2,000 and the default %v: went to %s, explained %v", DefaultPrefillTokensPerSecond, up, f)
	}
	// b learns it is slower than a's prior: the next cold request goes to a, at its prior.
	p.state.upstream("b:1").learn.figures.Store(&learnedFigures{PrefillTokensPerSecond: 500, PrefillLearned: true})
	up, f = explain(bigCold(2, 1000))
	uncached, _ = strconv.ParseFloat(f["uncached_tokens"], 64)
	ttft, _ = strconv.ParseFloat(f["predicted_ttft_ms"], 64)
	if up != "a:1" || abs(ttft-uncached/2000*1e3) > 0.1 {
		t.Errorf("b learned 500 tokens/s: went to %s, explained %v; want a at its prior of 2,000", up, f)
	}
	if h := fmt.Sprint(f); strings.Contains(h, "b:1") || strings.Contains(h, "lorem") {
		t.Errorf("the explain header names another upstream or prompt text: %v", f)
	}
}

func abs(v float64) float64 { return max(v, -v) }

// Without llm_feedback a request counts in its upstream's queued prefill until its predicted
// TTFT has passed; with it, until prefillDone (idempotent) or its end.
func TestCostPrefillDeadlineWithoutFeedback(t *testing.T) {
	pool := newPool("a:1")
	p := costPolicy(t, pool, nil, false)
	u := p.state.upstream("a:1")
	hold(t, p, pool, bigCold(1, 100)) // 100 tokens at 5,000 per second: 20 ms
	if got := u.prefillTokens.Load(); got < 90 {
		t.Fatalf("queued prefill after the decision: %d tokens, want about 100", got)
	}
	waitFor(t, func() bool { u.expirePrefill(time.Now().UnixNano()); return u.prefillTokens.Load() == 0 },
		"the request counted as prefilled once its predicted TTFT passed")

	u.firstTokens.Store(true)
	r, cancel := chatRequest("m", bigCold(2, 100))
	defer cancel()
	p.Select(pool, r, nil)
	lr := requestFor(r, DefaultMaxBody)
	time.Sleep(40 * time.Millisecond) // past its predicted TTFT: with feedback, that means nothing
	u.expirePrefill(time.Now().UnixNano())
	if got := u.prefillTokens.Load(); got < 90 {
		t.Errorf("with llm_feedback, past its predicted TTFT: %d tokens queued, want the request's ~100", got)
	}
	lr.prefillDone()
	lr.prefillDone()
	if got := u.prefillTokens.Load(); got != 0 {
		t.Errorf("after prefillDone (twice): %d tokens queued, want 0", got)
	}
}

// The queued prefill stays exact whatever the order of decisions, retries, first tokens and
// ends, run at once.
func TestCostPrefillAccountingExactUnderConcurrency(t *testing.T) {
	pool := newPool("a:1", "b:1", "c:1")
	for _, feedback := range []bool{true, false} {
		p := costPolicy(t, pool, nil, feedback)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(g), 1))
				for i := range 150 {
					r, cancel := chatRequest("m", bigCold(g*1000+i, 50+rng.IntN(500)))
					up := p.Select(pool, r, nil)
					lr := requestFor(r, DefaultMaxBody)
					var wg2 sync.WaitGroup
					if rng.IntN(2) == 0 {
						wg2.Add(1)
						go func() { defer wg2.Done(); lr.prefillDone() }()
					}
					if rng.IntN(3) == 0 && up != nil {
						p.Select(newPool(otherThan(pool, up.Dial)), r, nil) // a retry
					}
					if rng.IntN(2) == 0 {
						lr.prefillDone()
					}
					p.state.upstream(pool[rng.IntN(3)].Dial).expirePrefill(time.Now().UnixNano())
					cancel()
					wg2.Wait()
				}
			}()
		}
		wg.Wait()
		waitFor(t, func() bool {
			for _, u := range pool {
				st := p.state.upstream(u.Dial)
				if st.prefillTokens.Load() != 0 || st.inFlight.Load() != 0 || st.queuedTokens.Load() != 0 {
					return false
				}
			}
			return true
		}, fmt.Sprintf("queued prefill, in-flight and queued tokens back to 0 (feedback %v)", feedback))
	}
}

// GET /kvroute/ shows each candidate's prediction for recent decisions; the ring is bounded.
func TestCostRecentDecisionsBounded(t *testing.T) {
	pool := newPool("a:1", "b:1")
	p := costPolicy(t, pool, nil, false)
	for i := range recentDecisions + 5 {
		pick(t, p, pool, "m", bigCold(i, 100))
	}
	st := p.state.status()
	if len(st.RecentDecisions) != recentDecisions {
		t.Fatalf("%d recent decisions, want %d", len(st.RecentDecisions), recentDecisions)
	}
	d := st.RecentDecisions[0]
	if len(d.Candidates) != 2 || d.Chosen == "" || d.Candidates[0].PredictedTTFT <= 0 || d.Candidates[0].UncachedTokens < 90 {
		b, _ := json.Marshal(d)
		t.Errorf("newest decision: %s", b)
	}
}

// The decode pool's cost is the KV to transfer plus the decode load: no prefill term.
func TestDecodePoolCost(t *testing.T) {
	for _, tt := range []struct {
		prompt, held, decode int64
		transfer, speed      float64
		want                 float64
	}{
		{prompt: 10000, held: 0, transfer: 100000, decode: 0, speed: 1000, want: 0.1},
		{prompt: 10000, held: 10000, transfer: 100000, decode: 500, speed: 1000, want: 0.5},
		{prompt: 10000, held: 4000, transfer: 100000, decode: 2000, speed: 1000, want: 2.06},
		{prompt: 100, held: 400, transfer: 100000, decode: -3, speed: 1000, want: 0}, // held beyond the prompt, nonsense load
		{prompt: 10000, held: 0, transfer: 0, decode: 1000, speed: 0, want: 0},       // unknown speeds: free
	} {
		if got := DecodePoolCost(tt.prompt, tt.held, tt.transfer, tt.decode, tt.speed); abs(got-tt.want) > 1e-9 {
			t.Errorf("DecodePoolCost(%d, %d, %v, %d, %v) = %v, want %v", tt.prompt, tt.held, tt.transfer, tt.decode, tt.speed, got, tt.want)
		}
	}
}

// Through real Caddy: the explain header carries the decision and the chosen upstream's
// predicted match and cost (never another upstream, never prompt text), and GET /kvroute/
// shows every candidate's prediction for the recent decisions.
func TestIntegrationCostExplainAndRecent(t *testing.T) {
	f := newFleet(t, 3)
	startCaddy(t, proxyConfig(f, "", "decision cost\n\t\t\texplain_header X-Kvroute-Decision", ""))
	client := &http.Client{Timeout: 10 * time.Second}
	sys := strings.Repeat("You are a terse travel agent. ", 60)
	var homes []string
	for turn := range 2 {
		rep, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", sys, "secret question "+strconv.Itoa(turn)))
		h := resp.Header.Get("X-Kvroute-Decision")
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(h, "decision=cost; path=") || !strings.Contains(h, "predicted_ttft_ms=") {
			t.Fatalf("turn %d: status %d, explain header %q", turn, resp.StatusCode, h)
		}
		for _, b := range f {
			if strings.Contains(h, b.addr()) {
				t.Errorf("the explain header names an upstream: %q", h)
			}
		}
		if strings.Contains(h, "secret") || strings.Contains(h, "travel") {
			t.Errorf("the explain header carries prompt text: %q", h)
		}
		if turn == 1 && !strings.Contains(h, "path=prefix_hit") {
			t.Errorf("the second turn: %q, want path=prefix_hit and its match", h)
		}
		homes = append(homes, rep.Upstream)
	}
	resp, err := http.Get("http://localhost:2999/kvroute/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if len(st.RecentDecisions) != 2 || len(st.RecentDecisions[0].Candidates) != 3 || st.RecentDecisions[0].Candidates[0].PredictedTTFT <= 0 {
		t.Fatalf("recent decisions: %+v", st.RecentDecisions)
	}
	if d := st.RecentDecisions[0]; d.Path != "prefix_hit" || d.Chosen == "" {
		t.Errorf("the newest decision: %+v (turns served by %v)", d, homes)
	}
}

// objective energy prices a move away from the upstream holding the prompt's prefix at what it
// forfeits, in joules, as objective latency does in seconds: the held tokens prefilled where
// the request goes, now and once more for the cache they take there. A 500-token prefix on
// the dear upstream and 100 new tokens, 256 output tokens expected: the cheap one would spend
// 600 × 25 + 256 × 150 = 53,400 µJ against the dear one's 100 × 40 + 256 × 210 = 57,760,
// but with the 500 × 25 it forfeits, 65,900: the request stays where its prefix is.
func TestCostEnergyPricesWhatAMoveForfeits(t *testing.T) {
	pool := newPool("dear:1", "cheap:1")
	ups := map[string]energy.Profile{
		"dear:1":  {PrefillEnergyPerToken: 40e-6, EnergyPerToken: 210e-6},
		"cheap:1": {PrefillEnergyPerToken: 25e-6, EnergyPerToken: 150e-6},
	}
	slack := 10.0 // the TTFT bound out of the way: 600 tokens cold against 100 warm
	p := costPolicy(t, pool, ups, true, func(p *KVCacheAware) { p.Objective = objectiveEnergy; p.TTFTSlack = &slack })
	prefix := strings.Repeat("You are a careful assistant. ", 69) // 2,001 chars: about 500 tokens
	if got := pick(t, p, newPool("dear:1"), "m", prefix+"warm up"); got != "dear:1" {
		t.Fatalf("warming dear: went to %s", got)
	}
	for i := range 3 {
		suffix := fmt.Sprintf("%03d %s", i, strings.Repeat("question ", 44)) // about 100 tokens
		if got := pick(t, p, pool, "m", prefix+suffix); got != "dear:1" {
			t.Errorf("request %d with its 500-token prefix on dear went to %s; want dear (53,400 µJ on cheap and 12,500 forfeited, against 57,760)", i, got)
		}
	}
	// A cold request still goes to the cheap upstream.
	if got := pick(t, p, pool, "m", bigCold(1, 600)); got != "cheap:1" {
		t.Errorf("a cold request went to %s; want cheap", got)
	}
}
