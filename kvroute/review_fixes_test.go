package kvroute

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// A smaller max_sessions (a reload) bounds the store at once.
func TestSessionStoreShrinksWithCap(t *testing.T) {
	s := newSessionStore(1000, time.Hour)
	now := time.Now()
	for i := range 1000 {
		s.bind("m", fmt.Sprint("s-", i), "u", now)
	}
	s.configure(10, time.Hour)
	for i := range 5 {
		s.bind("m", fmt.Sprint("new-", i), "u", now)
	}
	if s.len() > 10 {
		t.Errorf("max_sessions 10 after reload: %d bindings held", s.len())
	}
}

// A secret whose placeholder does not resolve (a typo, an unset variable) is refused, never
// used as the config's literal text.
func TestSessionCookieSecretPlaceholderMustResolve(t *testing.T) {
	for _, sec := range []string{"{nope}", "{env_TYPO}", "a{b"} {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		p := &KVCacheAware{SessionCookie: &SessionCookie{Secret: sec}}
		err := p.Provision(ctx)
		if err == nil {
			t.Errorf("secret %q accepted; codec secret %q (%d bytes)", sec, p.cookie.secret, len(p.cookie.secret))
			_ = p.Cleanup()
		}
		cancel()
	}
}

// A config refused for disagreeing process-wide options leaves the running state as it was.
func TestRefusedConfigLeavesStateAlone(t *testing.T) {
	old := newPolicy(t, nil)
	pool := newPool("a:1", "b:1")
	for i := range 20 {
		pick(t, old, pool, "m", coldPrompt(i))
	}
	chars := old.state.forest.Chars()
	ctx2, cancel2 := caddy.NewContext(caddy.Context{Context: context.Background()})
	x := &KVCacheAware{MaxTreeSize: 100, MaxSessions: 3}
	if err := x.Provision(ctx2); err != nil {
		t.Fatal(err)
	}
	// The running config keeps routing while the new one is being provisioned.
	pick(t, old, pool, "m", coldPrompt(100))
	chars = old.state.forest.Chars()
	y := &KVCacheAware{MaxTreeSize: 200}
	err := y.Provision(ctx2)
	if err == nil {
		t.Fatal("not refused")
	}
	pick(t, old, pool, "m", coldPrompt(101)) // and after the new config failed
	chars = max(chars, old.state.forest.Chars())
	_ = x.Cleanup() // Caddy cleans up the refused config's provisioned modules
	cancel2()
	if got := old.state.forest.Chars(); got != chars {
		t.Errorf("refused config (%v) evicted the running config's trees: %d -> %d chars", err, chars, got)
	}
	if got := old.state.sessions.max.Load(); got != DefaultMaxSessions {
		t.Errorf("max_sessions in force %d", got)
	}
}

// A returning cookie client whose pending binding is out of band: skipped, and kept.
func TestSessionPendingOutOfBandKept(t *testing.T) {
	p := newPolicy(t, &KVCacheAware{SessionCookie: &SessionCookie{Secret: testSecret}})
	pool := newPool("a:1", "b:1")
	w := httptest.NewRecorder()
	r, cancel := chatRequest("m", coldPrompt(1))
	home := p.Select(pool, r, w).Dial
	cancel()
	waitReleased(t, p, pool, nil)
	ck := w.Result().Cookies()[0]
	p.state.upstream(home).inFlight.Add(10)
	r, c := chatRequest("m", coldPrompt(2))
	r.AddCookie(ck)
	first := p.Select(pool, r, nil).Dial
	c()
	p.state.upstream(home).inFlight.Add(-10)
	waitReleased(t, p, pool, nil)
	r, c = chatRequest("m", coldPrompt(3))
	r.AddCookie(ck)
	got := p.Select(pool, r, nil).Dial
	c()
	if got != home {
		t.Errorf("cookie session issued on %s, skipped once (%s), then went to %s: binding not kept", home, first, got)
	}
}
