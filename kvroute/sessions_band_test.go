package kvroute

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/kvroute/caddy-kvroute/energy"
)

// One session id (an app-wide prompt_cache_key, or one shared header) on many concurrent
// requests must not pile them all on its upstream: a bound upstream out of the balance band is
// skipped for the request, and the binding stays.
func TestSessionOutOfBandIsSkippedAndKept(t *testing.T) {
	for _, how := range []string{"prompt_cache_key", "header"} {
		t.Run(how, func(t *testing.T) {
			p := newPolicy(t, nil)
			pool := newPool("a:1", "b:1", "c:1", "d:1")
			request := func(i int) (*http.Request, context.CancelFunc) {
				if how == "header" {
					return chatRequest("m", coldPrompt(i), "X-Session-ID", "app")
				}
				body := fmt.Sprintf(`{"model":"m","prompt_cache_key":"app","messages":[{"role":"user","content":%q}]}`, coldPrompt(i))
				r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
				ctx, cancel := context.WithCancel(r.Context())
				return withVars(r.WithContext(ctx)), cancel
			}
			home := pick(t, p, pool, "m", coldPrompt(1000), "X-Session-ID", "app")
			if how != "header" {
				r, cancel := request(1000)
				home = p.Select(pool, r, nil).Dial
				cancel()
				waitFor(t, func() bool { return p.state.upstream(home).inFlight.Load() == 0 }, "in flight released")
			}
			counts := map[string]int{}
			var cancels []context.CancelFunc
			for i := range 40 {
				r, cancel := request(i)
				cancels = append(cancels, cancel)
				counts[p.Select(pool, r, nil).Dial]++
			}
			most := 0
			for _, n := range counts {
				most = max(most, n)
			}
			// 40 in flight on 4 upstreams: balanced is 10 each; the band (abs 4, rel 1.5) lets
			// the session's upstream run at most a few ahead of the least loaded.
			if most > 10+DefaultBalanceAbsThreshold {
				t.Errorf("40 concurrent requests of one session: %v in flight, %d on one upstream", counts, most)
			}
			for _, c := range cancels {
				c()
			}
			waitReleased(t, p, pool, nil)
			r, cancel := request(5000)
			got := p.Select(pool, r, nil).Dial
			cancel()
			if got != home {
				t.Errorf("after the burst the session went to %s, want its binding %s kept", got, home)
			}
		})
	}
}

// The same session id used for two models keeps one binding for each.
func TestSessionBoundPerModel(t *testing.T) {
	p := newPolicy(t, &KVCacheAware{Upstreams: map[string]energy.Profile{
		"a:1": {Models: []string{"llama"}}, "b:1": {Models: []string{"llama"}},
		"c:1": {Models: []string{"qwen"}}, "d:1": {Models: []string{"qwen"}},
	}})
	pool := newPool("a:1", "b:1", "c:1", "d:1")
	home := map[string]string{}
	sessions := 0
	for i := range 20 {
		model := []string{"llama", "qwen"}[i%2]
		got := pick(t, p, pool, model, coldPrompt(i), "X-Session-ID", "user-1")
		if h, ok := home[model]; ok {
			if got == h {
				sessions++
			}
		} else {
			home[model] = got
		}
	}
	var decided uint64
	for _, up := range pool {
		decided += decisions(p, up.Dial, pathSession)
	}
	if sessions != 18 || decided != 18 {
		t.Errorf("20 requests alternating two models with one session id: %d stayed, %d session decisions; want 18", sessions, decided)
	}
	if !p.state.forgetSession("user-1") {
		t.Fatal("forgetSession found no binding")
	}
	if p.state.sessions.len() != 0 {
		t.Errorf("%d bindings left after forgetting the session for every model", p.state.sessions.len())
	}
}

// A binding to an upstream that is merely not in this request's pool (another site's) is
// skipped and kept; one to an upstream in no live pool is dropped.
func TestSessionOtherPoolKept(t *testing.T) {
	p := newPolicy(t, nil)
	p.state.mu.Lock()
	p.reg.static = []string{"a:1", "b:1", "c:1"}
	p.state.publishStaticLocked()
	p.state.mu.Unlock()
	home := pick(t, p, newPool("a:1"), "m", coldPrompt(1), "X-Session-ID", "s")
	if home != "a:1" {
		t.Fatalf("placed on %s", home)
	}
	if got := pick(t, p, newPool("b:1", "c:1"), "m", coldPrompt(2), "X-Session-ID", "s"); got == "a:1" || got == "" {
		t.Fatalf("other site's pool: went to %q", got)
	}
	if got := pick(t, p, newPool("a:1", "b:1"), "m", coldPrompt(3), "X-Session-ID", "s"); got != "a:1" {
		t.Errorf("binding to a:1 not kept across another pool's request: went to %s", got)
	}
}

// Cookie mode binds a new id only once the client presents it back: cookieless clients (SDKs
// keep no cookies) cannot churn the store and evict real sessions.
func TestSessionCookielessFloodEvictsNobody(t *testing.T) {
	p := newPolicy(t, &KVCacheAware{MaxSessions: 1000, SessionCookie: &SessionCookie{Secret: testSecret}})
	pool := newPool("a:1", "b:1", "c:1", "d:1")
	home := pick(t, p, pool, "m", coldPrompt(1), "X-Session-ID", "live")
	most, pending := 0, 0
	for i := range 2000 {
		pick(t, p, pool, "m", coldPrompt(i))
		most = max(most, p.state.sessions.len())
		pending = max(pending, p.state.pending.len())
	}
	t.Logf("2,000 cookieless requests: at most %d bindings in the store, %d issued ids pending (max_sessions 1000)", most, pending)
	if pending > 1000/10 {
		t.Errorf("%d issued ids pending, over a tenth of max_sessions", pending)
	}
	if got := pick(t, p, pool, "m", coldPrompt(99999), "X-Session-ID", "live"); got != home {
		t.Errorf("the live header session went to %s after a cookieless flood, want %s", got, home)
	}
	if most > 1 {
		t.Errorf("cookieless requests made %d bindings", most-1)
	}
	// A client that sends its cookie back is bound.
	w := httptest.NewRecorder()
	r, cancel := chatRequest("m", coldPrompt(7))
	up := p.Select(pool, r, w).Dial
	cancel()
	cookies := w.Result().Cookies()
	if len(cookies) != 1 {
		t.Fatalf("%d cookies set on a cookieless request", len(cookies))
	}
	for i := range 5 {
		r, cancel := chatRequest("m", coldPrompt(100+i))
		r.AddCookie(cookies[0])
		if got := p.Select(pool, r, nil).Dial; got != up {
			t.Errorf("turn %d with the cookie went to %s, want %s", i, got, up)
		}
		cancel()
		waitReleased(t, p, pool, nil)
	}
}

// max_sessions is an exact bound, also below the store's shard count.
func TestSessionStoreExactBound(t *testing.T) {
	for _, max := range []int{1, 10, 31, 100} {
		s := newSessionStore(max, time.Hour)
		now := time.Now()
		for i := range 50 * max {
			s.bind("m", fmt.Sprint("s-", i), "u", now)
			if s.len() > max {
				t.Fatalf("max_sessions %d: %d bindings held", max, s.len())
			}
		}
		if s.len() != max {
			t.Errorf("max_sessions %d: %d bindings held after %d binds", max, s.len(), 50*max)
		}
		if _, ok := s.get("m", fmt.Sprint("s-", 50*max-1), now); !ok {
			t.Errorf("max_sessions %d: the newest binding is gone", max)
		}
	}
}

// A cookie secret that resolves to nothing or to fewer than 16 bytes is refused, and so is a
// cookie name that is not an HTTP token.
func TestSessionCookieSecretAndNameChecked(t *testing.T) {
	provision := func(c *SessionCookie) error {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
		p := &KVCacheAware{SessionCookie: c}
		err := p.Provision(ctx)
		if err == nil {
			_ = p.Cleanup()
		}
		return err
	}
	for _, c := range []*SessionCookie{
		{Secret: "{env.KVROUTE_TEST_SECRET_NOT_SET}"},
		{Secret: "short"},
		{Name: "kv:session"}, {Name: "kv/session"}, {Name: "kvrouté"}, {Name: "kv session"},
	} {
		err := provision(c)
		if err == nil {
			t.Errorf("session_cookie %+v accepted", *c)
			continue
		}
		if !strings.HasPrefix(err.Error(), "session_cookie: ") {
			t.Errorf("session_cookie %+v: error %q does not name the option", *c, err)
		}
	}
	t.Setenv("KVROUTE_TEST_SECRET", "0123456789abcdef")
	if err := provision(&SessionCookie{Name: "kv_session-1.x", Secret: "{env.KVROUTE_TEST_SECRET}"}); err != nil {
		t.Errorf("a valid cookie name and 16-byte secret refused: %v", err)
	}
	for _, line := range []string{
		"session_cookie kv:session", "session_cookie kvrouté", "session_cookie kv_session short",
	} {
		d := caddyfile.NewTestDispenser("kv_cache_aware {\n" + line + "\n}")
		if err := new(KVCacheAware).UnmarshalCaddyfile(d); err == nil || !strings.Contains(err.Error(), "Testfile:2") {
			t.Errorf("%q: got %v, want an error at Testfile:2", line, err)
		}
	}
}

// waitReleased waits until the in-flight counts of pool are back to want (0 where absent):
// a request's count is released by a context.AfterFunc once it ends.
func waitReleased(t testing.TB, p *KVCacheAware, pool reverseproxy.UpstreamPool, want map[string]int64) {
	t.Helper()
	waitFor(t, func() bool {
		for _, up := range pool {
			if p.state.upstream(up.Dial).inFlight.Load() != want[up.Dial] {
				return false
			}
		}
		return true
	}, "in-flight counts released")
}

// Decisions that run at once hold the band as decisions made one after another do: 40
// requests of one session, decided at once on 4 upstreams, put at most burstBound of them on
// the session's upstream. Every decision is held after its prefix match until all 40 are
// there, so that none has chosen when the others go on (what a burst on a loaded machine
// does by chance).
func TestSessionBandHeldUnderConcurrentDecisions(t *testing.T) {
	const n = 40
	p := newPolicy(t, nil)
	pool := newPool("a:1", "b:1", "c:1", "d:1")
	home := pick(t, p, pool, "m", coldPrompt(1000), "X-Session-ID", "app")

	var arrived sync.WaitGroup
	arrived.Add(n)
	hold := func() { arrived.Done(); arrived.Wait() }
	testHookDecide.Store(&hold)
	t.Cleanup(func() { testHookDecide.Store(nil) })
	picks := make([]string, n)
	cancels := make([]context.CancelFunc, n)
	var done sync.WaitGroup
	for i := range n {
		r, cancel := chatRequest("m", coldPrompt(i), "X-Session-ID", "app")
		cancels[i] = cancel
		done.Add(1)
		go func() {
			defer done.Done()
			if up := p.Select(pool, r, nil); up != nil {
				picks[i] = up.Dial
			}
		}()
	}
	done.Wait()
	testHookDecide.Store(nil)

	counts := map[string]int{}
	for _, d := range picks {
		counts[d]++
	}
	bound := burstBound(n, len(pool), DefaultBalanceAbsThreshold, DefaultBalanceRelThreshold)
	if counts[home] > bound || counts[""] > 0 {
		t.Errorf("40 decisions at once of one session: %v, %d on its upstream %s; the band allows %d", counts, counts[home], home, bound)
	}
	for _, up := range pool {
		if got := p.state.upstream(up.Dial).inFlight.Load(); got != int64(counts[up.Dial]) {
			t.Errorf("%s: %d in flight, %d decided", up.Dial, got, counts[up.Dial])
		}
	}
	for _, c := range cancels {
		c()
	}
	waitReleased(t, p, pool, nil)
	if got := pick(t, p, pool, "m", coldPrompt(5000), "X-Session-ID", "app"); got != home {
		t.Errorf("after the burst the session went to %s, want its binding %s kept", got, home)
	}
}

// burstBound is the most requests of one session that a burst of n (none ending meanwhile) on
// k upstreams puts on the session's upstream: its h-th request is placed there only while h-1
// is within the band of the least loaded upstream, which holds at most (n-h)/(k-1) of the
// others.
func burstBound(n, k int, abs int64, rel float64) int {
	for h := n; h > 1; h-- {
		least := int64((n - h) / (k - 1))
		if int64(h-1)-least <= abs || float64(h-1) <= float64(least)*rel {
			return h
		}
	}
	return 1
}

// The same through a real Caddy: 40 concurrent requests of one header session on 4 loopback
// upstreams, which hold every request until all 40 have arrived, so that the counts are the
// requests in flight at once. The decisions are held as above, so that they all run at once.
func TestSessionBandHeldUnderConcurrentRequests(t *testing.T) {
	const n = 40
	f := newFleet(t, 4)
	startCaddy(t, proxyConfig(f, "", "", ""))
	client := newClient(t, 30*time.Second)
	rep, _ := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(1000)), "X-Session-ID", "app")
	home := f.byName(rep.Upstream)
	if home == nil {
		t.Fatalf("the first turn got %+v", rep)
	}

	for _, b := range f {
		b.setHang(true)
	}
	var arrived sync.WaitGroup
	arrived.Add(n)
	hold := func() { arrived.Done(); arrived.Wait() }
	testHookDecide.Store(&hold)
	t.Cleanup(func() { testHookDecide.Store(nil) })
	var done sync.WaitGroup
	for i := range n {
		done.Add(1)
		go func() {
			defer done.Done()
			if _, code := trySend(client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(i)), "app"); code != http.StatusOK {
				t.Errorf("request %d: status %d", i, code)
			}
		}()
	}
	active := func() (total int64) {
		for _, b := range f {
			total += b.active.Load()
		}
		return total
	}
	waitUntil(t, 20*time.Second, func() bool { return active() == n }, "all 40 requests held by the upstreams")
	counts := map[string]int64{}
	for _, b := range f {
		counts[b.name] = b.active.Load()
		b.setHang(false)
	}
	done.Wait()
	bound := burstBound(n, len(f), DefaultBalanceAbsThreshold, DefaultBalanceRelThreshold)
	if counts[home.name] > int64(bound) {
		t.Errorf("40 concurrent requests of one session: in flight %v, %d on its upstream %s; the band allows %d", counts, counts[home.name], home.name, bound)
	}
}
