package kvroute

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/energy"
)

func TestSessionStoreTTL(t *testing.T) {
	s := newSessionStore(100, time.Minute)
	now := time.Now()
	s.bind("", "a", "u1", now)
	if up, ok := s.get("", "a", now.Add(30*time.Second)); !ok || up != "u1" {
		t.Fatalf("get before TTL: %q %v", up, ok)
	}
	// The get refreshed the binding: 30s + 59s is within the TTL of the last use.
	if _, ok := s.get("", "a", now.Add(89*time.Second)); !ok {
		t.Fatalf("binding expired although used 59s ago with a 1m TTL")
	}
	if _, ok := s.get("", "a", now.Add(89*time.Second+time.Minute)); ok {
		t.Fatalf("binding alive after its TTL")
	}
	if s.len() != 0 {
		t.Fatalf("len %d after expiry, want 0", s.len())
	}
	s.bind("", "b", "u1", now)
	s.bind("", "c", "u2", now.Add(2*time.Minute))
	if n := s.expire(now.Add(90 * time.Second)); n != 1 {
		t.Fatalf("expire removed %d, want 1", n)
	}
}

func TestSessionStoreCap(t *testing.T) {
	const max = 1000
	s := newSessionStore(max, time.Hour)
	now := time.Now()
	for i := 0; i < 100*max; i++ {
		s.bind("", fmt.Sprintf("session-%d", i), "u1", now)
	}
	if s.len() > max {
		t.Fatalf("%d bindings held, cap %d", s.len(), max)
	}
	if s.len() < max/2 {
		t.Fatalf("only %d bindings held, cap %d: the cap evicts too eagerly", s.len(), max)
	}
	// The most recent bindings survive; the oldest went.
	if _, ok := s.get("", fmt.Sprintf("session-%d", 100*max-1), now); !ok {
		t.Errorf("the newest binding was evicted")
	}
	if _, ok := s.get("", "session-0", now); ok {
		t.Errorf("the oldest binding survived a flood of 100× the cap")
	}
}

func TestSessionStoreForgetAndDropUpstream(t *testing.T) {
	s := newSessionStore(100, time.Hour)
	now := time.Now()
	s.bind("", "a", "u1", now)
	s.bind("", "b", "u1", now)
	s.bind("", "c", "u2", now)
	if s.forget("a") != 1 || s.forget("a") != 0 {
		t.Fatalf("forget should succeed once")
	}
	if n := s.dropUpstream("u1"); n != 1 {
		t.Fatalf("dropUpstream removed %d, want 1", n)
	}
	if up, ok := s.get("", "c", now); !ok || up != "u2" {
		t.Fatalf("unrelated binding lost")
	}
	if got := s.perUpstream(); got["u2"] != 1 || len(got) != 1 {
		t.Fatalf("perUpstream = %v", got)
	}
}

func TestSessionStoreConcurrent(t *testing.T) {
	s := newSessionStore(500, time.Hour)
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			now := time.Now()
			for i := 0; i < 5000; i++ {
				k := fmt.Sprintf("s%d", (g*7919+i)%2000)
				switch i % 5 {
				case 0:
					s.forget(k)
				case 1:
					s.get("", k, now)
				default:
					s.bind("", k, fmt.Sprintf("u%d", i%4), now)
				}
			}
			s.dropUpstream("u1")
		}(g)
	}
	wg.Wait()
	n := 0
	for _, c := range s.perUpstream() {
		n += c
	}
	if n != s.len() || n > 500 {
		t.Fatalf("live count %d, bindings %d, cap 500", s.len(), n)
	}
}

// The seed's test: a session stays on its first upstream even after a cheaper one appears.
func TestSessionStickyAfterCheaperUpstreamAppears(t *testing.T) {
	mk := func(uj float64) energy.Profile { return energy.Profile{EnergyPerToken: energy.Joules(uj * 1e-6)} }
	p := newPolicy(t, &KVCacheAware{Upstreams: map[string]energy.Profile{"a:1": mk(200), "b:1": mk(50), "c:1": mk(1)}})
	first := pick(t, p, newPool("a:1", "b:1"), "m", "turn one", "X-Session-ID", "s1")
	if first != "b:1" {
		t.Fatalf("cold session placed on %s, want the cheapest b:1", first)
	}
	second := pick(t, p, newPool("a:1", "b:1", "c:1"), "m", "an unrelated second turn", "X-Session-ID", "s1")
	if second != first {
		t.Fatalf("second turn went to %s, want the session's %s", second, first)
	}
	if decisions(p, first, pathSession) != 1 {
		t.Errorf("second turn not counted as a session decision")
	}
}

func TestSessionStaleBindingDropped(t *testing.T) {
	p := newPolicy(t, nil)
	first := pick(t, p, newPool("a:1", "b:1"), "m", "hello", "X-Session-ID", "s1")
	rest := otherThan(newPool("a:1", "b:1"), first)
	got := pick(t, p, newPool(rest, "c:1"), "m", coldPrompt(1), "X-Session-ID", "s1")
	if got == first || got == "" {
		t.Fatalf("binding to a departed upstream was used: %s", got)
	}
	if up, _ := p.state.sessions.get("m", "s1", time.Now()); up != got {
		t.Fatalf("session rebound to %q, want %q", up, got)
	}
}

func TestSessionForget(t *testing.T) {
	p := newPolicy(t, nil)
	pick(t, p, newPool("a:1", "b:1"), "m", "hello", "X-Session-ID", "s1")
	if p.state.sessions.forget("s1") == 0 {
		t.Fatalf("no binding to forget")
	}
	if _, ok := p.state.sessions.get("m", "s1", time.Now()); ok {
		t.Fatalf("binding survived forget")
	}
}

func TestSessionSaturatedSkippedButKept(t *testing.T) {
	p := newPolicy(t, &KVCacheAware{Upstreams: map[string]energy.Profile{"a:1": {MaxConcurrency: 1}, "b:1": {MaxConcurrency: 1}}})
	pool := newPool("a:1", "b:1")
	home := pick(t, p, pool, "m", "hello", "X-Session-ID", "s1")
	p.state.upstream(home).inFlight.Store(1)
	if got := pick(t, p, pool, "m", coldPrompt(2), "X-Session-ID", "s1"); got == home {
		t.Fatalf("saturated session upstream %s was used", home)
	}
	p.state.upstream(home).inFlight.Store(0)
	if got := pick(t, p, pool, "m", coldPrompt(3), "X-Session-ID", "s1"); got != home {
		t.Fatalf("binding lost after a saturated moment: went to %s, want %s", got, home)
	}
}

func TestSessionPrecedenceHeaderCookieBody(t *testing.T) {
	p := newPolicy(t, &KVCacheAware{SessionCookie: &SessionCookie{Secret: testSecret}})
	pool := newPool("a:1", "b:1", "c:1", "d:1")
	_, cookieVal := p.cookie.newID()
	cookieID, _ := p.cookie.decode(cookieVal)
	p.state.sessions.bind("m", "hdr", "a:1", time.Now())
	p.state.sessions.bind("m", cookieID, "b:1", time.Now())
	p.state.sessions.bind("m", "body", "c:1", time.Now())
	body := func() string {
		return fmt.Sprintf(`{"model":"m","prompt_cache_key":"body","messages":[{"role":"user","content":%q}]}`, coldPrompt(9))
	}
	do := func(withHeader, withCookie bool) string {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body()))
		r = withVars(r)
		if withHeader {
			r.Header.Set("X-Session-ID", "hdr")
		}
		if withCookie {
			r.AddCookie(&http.Cookie{Name: DefaultCookieName, Value: cookieVal})
		}
		return p.Select(pool, r, nil).Dial
	}
	if got := do(true, true); got != "a:1" {
		t.Errorf("header+cookie+body: %s, want the header's a:1", got)
	}
	if got := do(false, true); got != "b:1" {
		t.Errorf("cookie+body: %s, want the cookie's b:1", got)
	}
	if got := do(false, false); got != "c:1" {
		t.Errorf("body only: %s, want prompt_cache_key's c:1", got)
	}
}

func TestSessionCookieSetAndTampered(t *testing.T) {
	p := newPolicy(t, &KVCacheAware{SessionCookie: &SessionCookie{Name: "sid", Secret: testSecret}})
	pool := newPool("a:1", "b:1", "c:1")
	r, cancel := chatRequest("m", "hello there")
	defer cancel()
	w := httptest.NewRecorder()
	home := p.Select(pool, r, w).Dial
	cookies := (&http.Response{Header: w.Header()}).Cookies()
	if len(cookies) != 1 || cookies[0].Name != "sid" {
		t.Fatalf("want one sid cookie, got %v", w.Header()["Set-Cookie"])
	}
	c := cookies[0]
	if !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Secure {
		t.Errorf("cookie flags: HttpOnly %v SameSite %v Secure %v (plain HTTP)", c.HttpOnly, c.SameSite, c.Secure)
	}
	if strings.Contains(c.Value, home) || strings.Contains(c.Value, "a:1") {
		t.Errorf("cookie value %q reveals an upstream", c.Value)
	}
	for i := 0; i < 5; i++ {
		r, cancel := chatRequest("m", coldPrompt(100+i))
		r.AddCookie(c)
		w := httptest.NewRecorder()
		if got := p.Select(pool, r, w).Dial; got != home {
			t.Fatalf("request with the session cookie went to %s, want %s", got, home)
		}
		if len(w.Header()["Set-Cookie"]) != 0 {
			t.Errorf("a valid cookie was set again")
		}
		cancel()
		waitReleased(t, p, pool, map[string]int64{home: 1}) // the first request is still in flight
	}
	// Tampering: change one char of the id or of the signature; drop the signature.
	id, sig, _ := strings.Cut(c.Value, ".")
	flip := func(s string) string {
		b := []byte(s)
		if b[0] == 'A' {
			b[0] = 'B'
		} else {
			b[0] = 'A'
		}
		return string(b)
	}
	for _, bad := range []string{flip(id) + "." + sig, id + "." + flip(sig), id, "127.0.0.1:8001", strings.Repeat("x", 1<<20)} {
		if _, ok := p.cookie.decode(bad); ok {
			t.Errorf("tampered cookie %.40q accepted", bad)
		}
	}
	// A tampered cookie is ignored: the request gets a new session and a new cookie.
	r2, cancel2 := chatRequest("m", coldPrompt(200))
	defer cancel2()
	r2.AddCookie(&http.Cookie{Name: "sid", Value: flip(id) + "." + sig})
	w2 := httptest.NewRecorder()
	p.Select(pool, r2, w2)
	if len(w2.Header()["Set-Cookie"]) != 1 {
		t.Errorf("a tampered cookie should be replaced by a new one")
	}
}

func TestSessionCookieSecureOverTLS(t *testing.T) {
	p := newPolicy(t, &KVCacheAware{SessionCookie: &SessionCookie{}})
	r, cancel := chatRequest("m", "hi")
	defer cancel()
	r.TLS = new(tlsState)
	w := httptest.NewRecorder()
	p.Select(newPool("a:1"), r, w)
	if !strings.Contains(w.Header().Get("Set-Cookie"), "Secure") {
		t.Errorf("cookie over TLS lacks Secure: %q", w.Header().Get("Set-Cookie"))
	}
}

// A retry (Select again on the same request) keeps the new cookie session of the first attempt:
// one Set-Cookie, one binding.
func TestSessionCookieRetryKeepsSession(t *testing.T) {
	p := newPolicy(t, &KVCacheAware{SessionCookie: &SessionCookie{Secret: testSecret}})
	pool := newPool("a:1", "b:1")
	r, cancel := chatRequest("m", coldPrompt(7))
	defer cancel()
	w := httptest.NewRecorder()
	first := p.Select(pool, r, w).Dial
	second := p.Select(pool, r, w).Dial
	if first == second {
		t.Fatalf("the retry went back to %s", first)
	}
	if n := len(w.Header()["Set-Cookie"]); n != 1 {
		t.Fatalf("%d Set-Cookie headers after a retry, want 1: %v", n, w.Header()["Set-Cookie"])
	}
	// The id was issued by this request: its binding waits in the pending space until the
	// client presents the cookie back.
	if p.state.pending.len() != 1 || p.state.sessions.len() != 0 {
		t.Fatalf("%d+%d bindings after a retry, want 1 pending", p.state.sessions.len(), p.state.pending.len())
	}
	for id := range p.state.pending.perUpstream() {
		if id != second {
			t.Fatalf("the session stayed bound to %s, whose attempt failed; want %s", id, second)
		}
	}
}

// TestSessionStoreNewestBinding: a peer's bindings of one session applied in any order leave
// the newest, and a local binding after a peer's dated ahead (clock skew) is dated after it.
func TestSessionStoreNewestBinding(t *testing.T) {
	now := time.Now()
	t1, t2, t3 := now.Add(-3*time.Second), now.Add(-2*time.Second), now.Add(-time.Second)
	bs := []struct {
		up string
		at time.Time
	}{{"u1", t1}, {"u2", t2}, {"u3", t3}}
	for _, order := range [][]int{{0, 1, 2}, {2, 1, 0}, {1, 2, 0}, {2, 0, 1}} {
		s := newSessionStore(100, time.Hour)
		for _, i := range order {
			s.bindPeer("m", "k", bs[i].up, bs[i].at, now)
		}
		if got, _ := s.get("m", "k", now); got != "u3" {
			t.Errorf("order %v: bound to %s, want u3", order, got)
		}
	}
	// Unknown time (an old peer's catch-up reply): applied where nothing is held, else not.
	s := newSessionStore(100, time.Hour)
	if !s.bindPeer("m", "k", "u1", time.Time{}, now) || s.bindPeer("m", "k", "u2", time.Time{}, now) {
		t.Error("a binding of unknown time: applied over a held one, or not where none was")
	}
	// An expired binding is no binding: an older peer binding replaces it.
	s = newSessionStore(100, time.Millisecond)
	s.bindPeer("m", "k", "u3", t3, now)
	if !s.bindPeer("m", "k", "u1", t1, now.Add(time.Second)) {
		t.Error("an expired binding kept a peer's older one out")
	}
	// A peer's clock a minute ahead: the local rebinding is dated just after it, so peers take it.
	s = newSessionStore(100, time.Hour)
	ahead := now.Add(time.Minute)
	s.bindPeer("m", "k", "u1", ahead, now)
	if at := s.bind("m", "k", "u2", now); !at.After(ahead) {
		t.Errorf("local binding dated %v, not after the held %v", at, ahead)
	}
	if at := s.bind("m", "k2", "u2", now); !at.Equal(now) {
		t.Errorf("a fresh local binding dated %v, want now %v", at, now)
	}
}
