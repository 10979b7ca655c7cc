package kvroute

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"go.uber.org/zap"

	"github.com/kvroute/caddy-kvroute/energy"
)

// newPolicy provisions p (defaults applied) against a fresh process state and cleans it up
// when the test ends.
func newPolicy(t testing.TB, p *KVCacheAware) *KVCacheAware {
	t.Helper()
	captureCaddyLog(t)
	if p == nil {
		p = new(KVCacheAware)
	}
	if p.Telemetry == nil {
		// The unit tests' upstreams ("a:1") do not exist: reading their metrics would only
		// make them down a few seconds in. Telemetry has tests of its own.
		p.Telemetry = &Telemetry{Off: true}
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := p.Provision(ctx); err != nil {
		t.Fatalf("provision: %v", err)
	}
	t.Cleanup(func() { _ = p.Cleanup() })
	p.state.reset()
	p.state.upstreams.Clear() // in-flight counts left by earlier tests
	p.logger = zap.NewNop()   // one debug line per decision would drown the test output
	setStateLogger(p, zap.NewNop())
	return p
}

// setStateLogger gives the shared state logger l, now and once p's config is put in force (the
// state takes the newest config's logger then).
func setStateLogger(p *KVCacheAware, l *zap.Logger) {
	p.state.mu.Lock()
	p.state.logger = l
	p.reg.logger = l
	p.state.mu.Unlock()
}

func newPool(addrs ...string) reverseproxy.UpstreamPool {
	pool := make(reverseproxy.UpstreamPool, len(addrs))
	for i, a := range addrs {
		pool[i] = &reverseproxy.Upstream{Dial: a, Host: new(reverseproxy.Host)}
	}
	return pool
}

// llmRequestFor builds a chat completion request as Caddy would hand it to Select (with the
// vars map in its context). The returned cancel ends the request.
func chatRequest(model, prompt string, headers ...string) (*http.Request, context.CancelFunc) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, prompt)
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
	return r.WithContext(ctx), cancel
}

// withVars gives r the vars map Caddy puts in every request's context.
func withVars(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
}

type tlsState = tls.ConnectionState

// pick runs Select for one request that ends at once, and returns the chosen dial address.
func pick(t testing.TB, p *KVCacheAware, pool reverseproxy.UpstreamPool, model, prompt string, headers ...string) string {
	t.Helper()
	r, cancel := chatRequest(model, prompt, headers...)
	before := make(map[string]int64, len(pool))
	for _, u := range pool {
		before[u.Dial] = p.state.upstream(u.Dial).inFlight.Load()
	}
	up := p.Select(pool, r, httptest.NewRecorder())
	cancel()
	if up == nil {
		return ""
	}
	// The in-flight count is released by a context.AfterFunc: wait for it, so that the next
	// decision sees the fleet as it was.
	for p.state.upstream(up.Dial).inFlight.Load() != before[up.Dial] {
		runtime.Gosched()
	}
	return up.Dial
}

func decisions(p *KVCacheAware, addr string, path int) uint64 {
	return p.state.upstream(addr).decisions[path].Load()
}

func TestSelectPrefixAffinityAcrossTurns(t *testing.T) {
	p := newPolicy(t, nil)
	pool := newPool("a:1", "b:1", "c:1", "d:1")
	sys := strings.Repeat("You are a helpful assistant who answers tersely. ", 40)
	convs := []string{"tell me about Paris", "how do vaccines work", "write a haiku", "sum 2+2"}
	first := map[int]string{}
	for turn := 0; turn < 4; turn++ {
		for i, c := range convs {
			prompt := sys + c + strings.Repeat(" and then more", turn*10)
			got := pick(t, p, pool, "m", prompt)
			if got == "" {
				t.Fatalf("conversation %d turn %d: no upstream", i, turn)
			}
			if turn == 0 {
				first[i] = got
				continue
			}
			if got != first[i] {
				t.Errorf("conversation %d turn %d went to %s, first turn to %s", i, turn, got, first[i])
			}
		}
	}
}

func TestSelectColdTiesSpreadWithoutBias(t *testing.T) {
	p := newPolicy(t, nil)
	pool := newPool("a:1", "b:1", "c:1", "d:1")
	counts := map[string]int{}
	const n = 800
	for i := 0; i < n; i++ {
		counts[pick(t, p, pool, "m", coldPrompt(i))]++
	}
	for _, up := range pool {
		share := float64(counts[up.Dial]) / n
		if share < 0.15 || share > 0.35 {
			t.Errorf("%s got %.2f of cold requests, want about 0.25 (counts %v)", up.Dial, share, counts)
		}
	}
}

func TestSelectCountsOwnDecisionsAsLoad(t *testing.T) {
	// Concurrent decisions see each other's load at once, before Caddy counts the requests.
	p := newPolicy(t, nil)
	pool := newPool("a:1", "b:1", "c:1", "d:1")
	counts := map[string]int{}
	var cancels []context.CancelFunc
	for i := 0; i < 8; i++ {
		r, cancel := chatRequest("m", coldPrompt(i))
		cancels = append(cancels, cancel)
		counts[p.Select(pool, r, nil).Dial]++
	}
	for _, up := range pool {
		if counts[up.Dial] != 2 {
			t.Errorf("8 requests in flight on 4 idle upstreams: %s got %d, want 2 (%v)", up.Dial, counts[up.Dial], counts)
		}
	}
	for _, c := range cancels {
		c()
	}
	waitFor(t, func() bool {
		for _, up := range pool {
			if p.state.upstream(up.Dial).inFlight.Load() != 0 {
				return false
			}
		}
		return true
	}, "in-flight counts back to 0 after the requests ended")
}

func TestSelectRetryMovesInFlight(t *testing.T) {
	p := newPolicy(t, nil)
	pool := newPool("a:1", "b:1")
	r, cancel := chatRequest("m", "some prompt")
	first := p.Select(pool, r, nil)
	second := p.Select(newPool(otherThan(pool, first.Dial)), r, nil)
	if got := p.state.upstream(first.Dial).inFlight.Load(); got != 0 {
		t.Errorf("after the retry, %s still counts %d in flight", first.Dial, got)
	}
	if got := p.state.upstream(second.Dial).inFlight.Load(); got != 1 {
		t.Errorf("retry target %s counts %d in flight, want 1", second.Dial, got)
	}
	cancel()
	waitFor(t, func() bool { return p.state.upstream(second.Dial).inFlight.Load() == 0 }, "in flight released")
}

func otherThan(pool reverseproxy.UpstreamPool, addr string) string {
	for _, u := range pool {
		if u.Dial != addr {
			return u.Dial
		}
	}
	return ""
}

func TestSelectImbalanceGoesLeastBusy(t *testing.T) {
	abs, rel := 4, 1.5
	p := newPolicy(t, &KVCacheAware{BalanceAbsThreshold: &abs, BalanceRelThreshold: &rel})
	pool := newPool("a:1", "b:1", "c:1")
	prompt := strings.Repeat("a long shared prefix ", 50)
	home := pick(t, p, pool, "m", prompt)
	if again := pick(t, p, pool, "m", prompt+"more"); again != home {
		t.Fatalf("balanced: want the prefix holder %s, got %s", home, again)
	}
	p.state.upstream(home).inFlight.Store(20)
	p.state.upstream(otherThan(pool, home)).inFlight.Store(3)
	got := pick(t, p, pool, "m", prompt+"more again")
	if got == home {
		t.Fatalf("imbalanced (20 vs 3 vs 0 in flight): went to the busy prefix holder %s", home)
	}
	if p.state.upstream(got).inFlight.Load() != 0 {
		t.Errorf("imbalanced: want the idle upstream, got %s with %d in flight", got, p.state.upstream(got).inFlight.Load())
	}
	if decisions(p, got, pathImbalance) == 0 {
		t.Errorf("decision not counted as imbalance")
	}
	// The prompt was still recorded under the chosen upstream.
	if m := p.state.forest.Get("m").MatchTenant(routingText("m", prompt+"more again"), got); m == 0 {
		t.Errorf("imbalanced decision did not record the prompt under %s", got)
	}
}

func TestSelectModelTreesKeptApart(t *testing.T) {
	p := newPolicy(t, nil)
	pool := newPool("a:1", "b:1", "c:1", "d:1")
	prompt := strings.Repeat("shared words across models ", 40)
	home := pick(t, p, pool, "m1", prompt)
	pick(t, p, pool, "m2", prompt)
	if n := decisions(p, home, pathPrefixHit); n != 0 {
		t.Errorf("a different model's request was a prefix hit on %s", home)
	}
	if p.state.forest.Get("m1") == nil || p.state.forest.Get("m2") == nil {
		t.Fatalf("want one tree per model, have %v", p.state.forest.Names())
	}
}

func TestSelectServesModelAndSaturation(t *testing.T) {
	p := newPolicy(t, &KVCacheAware{Upstreams: map[string]energy.Profile{
		"a:1": {Models: []string{"llama-*"}, MaxConcurrency: 2},
		"b:1": {Models: []string{"qwen*"}},
		"c:1": {Models: []string{"llama-*"}},
	}})
	pool := newPool("a:1", "b:1", "c:1")
	for i := 0; i < 50; i++ {
		if got := pick(t, p, pool, "qwen2.5-7b", fmt.Sprintf("q %d", i)); got != "b:1" {
			t.Fatalf("qwen request went to %s; only b:1 serves qwen", got)
		}
	}
	if got := pick(t, p, pool, "mistral", "x"); got != "" {
		t.Fatalf("a model nobody serves got %s, want no upstream", got)
	}
	p.state.upstream("a:1").inFlight.Store(2)
	for i := 0; i < 20; i++ {
		if got := pick(t, p, pool, "llama-3.1-8b", fmt.Sprintf("l %d", i)); got != "c:1" {
			t.Fatalf("a:1 is at max_concurrency; request went to %s", got)
		}
	}
	p.state.upstream("c:1").inFlight.Store(100) // no max_concurrency: never saturated
	p.state.upstream("a:1").inFlight.Store(0)
	if got := pick(t, p, pool, "", "no model at all"); got == "" {
		t.Fatalf("a request without a model must go somewhere")
	}
}

func TestSelectEmptyPool(t *testing.T) {
	p := newPolicy(t, nil)
	if got := pick(t, p, nil, "m", "x"); got != "" {
		t.Fatalf("empty pool gave %s", got)
	}
}

func TestSelectJouleFallback(t *testing.T) {
	mk := func(uj float64) energy.Profile { return energy.Profile{EnergyPerToken: energy.Joules(uj * 1e-6)} }
	p := newPolicy(t, &KVCacheAware{Upstreams: map[string]energy.Profile{
		"a:1": mk(200), "b:1": mk(50), "c:1": mk(150),
	}})
	pool := newPool("a:1", "b:1", "c:1")
	for i := 0; i < 10; i++ {
		if got := pick(t, p, pool, "m", coldPrompt(i)); got != "b:1" {
			t.Fatalf("joule fallback chose %s, want the 50µJ upstream b:1", got)
		}
	}
}

func TestSelectNoBodyAndGarbage(t *testing.T) {
	p := newPolicy(t, nil)
	pool := newPool("a:1", "b:1")
	for _, body := range []string{"", "not json", "\x00\x01\xff", `{"messages": 5}`, strings.Repeat("[", 100000)} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
		if up := p.Select(pool, r, nil); up == nil {
			t.Errorf("body %.20q: no upstream", body)
		}
	}
}

// routingText is the routing text of chatRequest(model, prompt).
func routingText(model, prompt string) string {
	r, cancel := chatRequest(model, prompt)
	defer cancel()
	return requestFor(r, DefaultMaxBody).Text
}

// coldPrompt returns prompts that share no prefix with each other beyond a char or two.
func coldPrompt(i int) string {
	x := uint64(i)*0x9E3779B97F4A7C15 + 1
	x ^= x >> 29
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 32
	return fmt.Sprintf("%016x is a cold prompt", x)
}

// waitFor polls cond until it holds, for up to 10 s: a state that comes in milliseconds may take
// seconds under -race on a loaded machine, and only a failing test waits that long.
func waitFor(t testing.TB, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
	}
}

// New prefix groups spread over the fleet: a cold request tied on cost and busyness goes to the
// upstream holding the least, so four system prompts arriving one after the other on an idle
// fleet of four land on four different upstreams (SGLang's router, breaking ties by index or
// by a coin, stacks groups; DEVELOPERS.md measured imbalance 2.0 from it).
func TestSelectColdGroupsSpread(t *testing.T) {
	for run := 0; run < 20; run++ {
		p := newPolicy(t, nil)
		pool := newPool("a:1", "b:1", "c:1", "d:1")
		homes := map[string]int{}
		for g := 0; g < 4; g++ {
			sys := fmt.Sprintf("System prompt of group %d. ", g) + strings.Repeat(fmt.Sprintf("Rule %d. ", g), 200)
			homes[pick(t, p, pool, "m", sys+"first question")]++
		}
		if len(homes) != 4 {
			t.Fatalf("run %d: 4 groups on an idle fleet of 4 landed on %v", run, homes)
		}
	}
}

// On imbalance, prefix_in_band keeps cache affinity where load allows: the candidate holding the
// prefix wins over an idler one when both are within the band of the least loaded, and loses
// when it is the busy one.
func TestSelectImbalancePrefixInBand(t *testing.T) {
	for _, mode := range []string{"prefix_in_band", "least_busy"} {
		abs, rel := 4, 1.5
		p := newPolicy(t, &KVCacheAware{BalanceAbsThreshold: &abs, BalanceRelThreshold: &rel, OnImbalance: mode})
		pool := newPool("a:1", "b:1", "c:1")
		prompt := strings.Repeat("a long shared prefix ", 50)
		home := pick(t, p, pool, "m", prompt)
		others := []string{}
		for _, u := range pool {
			if u.Dial != home {
				others = append(others, u.Dial)
			}
		}
		// home: 2 in flight (in band: 2-0 <= 4); another upstream: 20 (out of band); the last: idle.
		p.state.upstream(home).inFlight.Store(2)
		p.state.upstream(others[0]).inFlight.Store(20)
		got := pick(t, p, pool, "m", prompt+" next turn")
		want := home
		if mode == "least_busy" {
			want = others[1]
		}
		if got != want {
			t.Errorf("%s: imbalanced fleet (home 2, %s 20, %s 0): went to %s, want %s", mode, others[0], others[1], got, want)
		}
		if decisions(p, got, pathImbalance) != 1 {
			t.Errorf("%s: not counted as an imbalance decision", mode)
		}
	}
}

// kv_capacity bounds what the tree believes an upstream holds: once newer prompts have pushed an
// old one past the upstream's capacity, the old prompt stops attracting requests there (the
// worker evicted it too). Without the annotation the same sequence is still a prefix hit.
func TestSelectKVCapacityForgetsEvictedPrefixes(t *testing.T) {
	old := strings.Repeat("An old conversation about sailing boats. ", 10) // ~400 chars
	for _, bounded := range []bool{true, false} {
		t.Run(fmt.Sprintf("kv_capacity=%v", bounded), func(t *testing.T) { // one policy alive at a time: the state is shared
			cfg := &KVCacheAware{}
			if bounded {
				cfg.Upstreams = map[string]energy.Profile{"a:1": {KVCapacity: 200}} // remembers 1.5 × 200 × 4 = 1,200 chars
			}
			p := newPolicy(t, cfg)
			onlyA, pool := newPool("a:1"), newPool("a:1", "b:1")
			if got := pick(t, p, onlyA, "m", old); got != "a:1" {
				t.Fatalf("bounded=%v: the old prompt went to %q", bounded, got)
			}
			for i := 0; i < 8; i++ { // ~3,200 newer chars on a:1
				pick(t, p, onlyA, "m", coldPrompt(i)+strings.Repeat(" newer text", 36))
			}
			if bounded {
				p.state.forest.Evict() // what the pass the inserts started does, waited for
				if n := p.state.forest.TenantChars("a:1"); n > 1200 {
					t.Fatalf("a:1 holds %d chars after eviction, over its kv_capacity (1,200 chars)", n)
				}
			}
			hits := decisions(p, "a:1", pathPrefixHit)
			pick(t, p, pool, "m", old+"And a follow-up question.")
			hit := decisions(p, "a:1", pathPrefixHit) > hits
			if bounded && hit {
				t.Errorf("kv_capacity 200: a prompt evicted from a:1 long ago was still a prefix hit there")
			}
			if !bounded && !hit {
				t.Errorf("no kv_capacity: the old prompt was not a prefix hit on a:1 (the control)")
			}
		})
	}
}

// A shared prefix shorter than one KV block (64 chars) is not a match: it caches nothing on the
// upstream, however large a share of a short prompt it is.
func TestSelectShortSharedPrefixIsNoMatch(t *testing.T) {
	p := newPolicy(t, nil)
	pool := newPool("a:1", "b:1")
	pick(t, p, pool, "m", "What is the capital of France?")
	pick(t, p, pool, "m", "What is the capital of Spain?") // 28 of 35 routing-text chars shared
	if n := decisions(p, "a:1", pathPrefixHit) + decisions(p, "b:1", pathPrefixHit); n != 0 {
		t.Errorf("a 28-char shared prefix made %d prefix hits", n)
	}
	long := strings.Repeat("A shared instruction of some length. ", 3) // 111 chars
	home := pick(t, p, pool, "m", long+"First question?")
	if got := pick(t, p, pool, "m", long+"Second question?"); got != home || decisions(p, home, pathPrefixHit) != 1 {
		t.Errorf("a 111-char shared prefix: went to %s (holder %s), %d prefix hits", got, home, decisions(p, home, pathPrefixHit))
	}
}

func TestTenantBound(t *testing.T) {
	for _, c := range []struct {
		tokens int64
		cpt    float64
		want   int64
	}{
		{1, 4, 6}, {200, 4, 1200}, {4096, 4, 24576}, {4096, 7, 43008}, {1000, 2.5, 3750},
		{1 << 61, 4, math.MaxInt64}, {math.MaxInt64, 4, math.MaxInt64}, {math.MaxInt64, 16, math.MaxInt64},
	} {
		if got := tenantBound(c.tokens, c.cpt); got != c.want {
			t.Errorf("tenantBound(%d, %v) = %d, want %d", c.tokens, c.cpt, got, c.want)
		}
	}
}
