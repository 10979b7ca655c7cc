package kvroute

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/caddy-kvroute/energy"
)

// failingBody yields some bytes of a body, then an error, as a client that goes away would.
type failingBody struct{ rest string }

func (b *failingBody) Read(p []byte) (int, error) {
	if b.rest == "" {
		return 0, io.ErrUnexpectedEOF
	}
	n := copy(p, b.rest)
	b.rest = b.rest[n:]
	return n, nil
}

func (b *failingBody) Close() error { return nil }

// No prompt text and no session id (header, cookie, prompt_cache_key) appears in the policy's,
// the matcher's or the state's logs at debug level, in the metrics' label values, or in the
// admin API's JSON, whatever the request: well formed, truncated, failing mid-body, garbage.
func TestSecurityNoPromptOrSessionInLogsOrMetrics(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	logger := zap.New(core)
	p := newPolicy(t, &KVCacheAware{
		MaxTreeSize:   3000,
		SessionCookie: &SessionCookie{Secret: testSecret},
		Upstreams:     map[string]energy.Profile{"a:1": {Models: []string{"m*"}}},
	})
	p.logger = logger
	setStateLogger(p, logger)
	m := &LLMPrompt{MaxBody: 256, logger: logger}
	pool := newPool("a:1", "b:1", "c:1")

	const (
		prompt  = "PROMPTSECRET"
		system  = "SYSTEMSECRET"
		header  = "HEADERSESSIONSECRET"
		pck     = "CACHEKEYSECRET"
		longSID = "LONGSESSIONSECRET"
	)
	secrets := []string{prompt, system, header, pck, longSID}
	bodies := []string{
		fmt.Sprintf(`{"model":"m1","messages":[{"role":"system","content":"%s"},{"role":"user","content":"%s %s"}]}`, system, prompt, strings.Repeat("x", 500)),
		fmt.Sprintf(`{"model":"m1","prompt":"%s","prompt_cache_key":"%s"}`, prompt, pck),
		fmt.Sprintf(`{"model":"claude","system":"%s","messages":[{"role":"user","content":"%s"}]}`, system, prompt),
		fmt.Sprintf(`{"text":"%s"}`, prompt),
		fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"%s`, prompt), // truncated
		fmt.Sprintf("\x00\xff%s\x01", prompt),                                         // garbage
	}
	var cookies []*http.Cookie
	do := func(body io.Reader, sid string, withMatcher bool) {
		r := withVars(httptest.NewRequest(http.MethodPost, "/v1/chat/completions", body))
		if sid != "" {
			r.Header.Set("X-Session-ID", sid)
		}
		for _, c := range cookies {
			r.AddCookie(c)
		}
		if withMatcher {
			_, _ = m.MatchWithError(r)
		}
		w := httptest.NewRecorder()
		p.Select(pool, r, w)
		if cs := (&http.Response{Header: w.Header()}).Cookies(); len(cs) > 0 && cookies == nil {
			cookies = cs
		}
	}
	for i, b := range bodies {
		for _, sid := range []string{"", header, longSID + strings.Repeat("z", 300)} {
			do(strings.NewReader(b), sid, i%2 == 0)
		}
		do(&failingBody{rest: b[:len(b)/2]}, "", true)
	}
	do(strings.NewReader(bodies[0]), "", false) // with the cookie set above
	if len(cookies) == 0 {
		t.Fatal("no session cookie was set")
	}
	cookieID, ok := p.cookie.decode(cookies[0].Value)
	if !ok {
		t.Fatal("the cookie set does not decode")
	}
	secrets = append(secrets, cookieID)
	p.state.evict()

	if logs.FilterMessage("decision").Len() == 0 {
		t.Fatal("no decision was logged at debug level: the test observes nothing")
	}
	for _, e := range logs.All() {
		line := e.Message + " " + fmt.Sprint(e.ContextMap())
		for _, s := range secrets {
			if strings.Contains(line, s) {
				t.Errorf("log entry reveals %q: %s", s, line)
			}
		}
	}
	t.Logf("%d log entries checked (%d decisions)", logs.Len(), logs.FilterMessage("decision").Len())

	reg := prometheus.NewRegistry()
	registerMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := 0
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				labels++
				for _, s := range secrets {
					if strings.Contains(lp.GetValue(), s) {
						t.Errorf("metric %s label %s=%q reveals a secret", mf.GetName(), lp.GetName(), lp.GetValue())
					}
				}
			}
		}
	}
	if labels == 0 {
		t.Errorf("no metric labels gathered: the test observes nothing")
	}

	raw, _ := json.Marshal(p.state.status())
	for _, s := range secrets {
		if strings.Contains(string(raw), s) {
			t.Errorf("GET /kvroute/ reveals %q", s)
		}
	}
}

// The cookie is opaque: its value carries a random id and its MAC, never an upstream address
// or anything a client could read routing from; two sessions on the same upstream get
// unrelated values.
func TestSecurityCookieOpaque(t *testing.T) {
	p := newPolicy(t, &KVCacheAware{SessionCookie: &SessionCookie{Secret: testSecret}})
	pool := newPool("10.0.0.1:8000")
	seen := map[string]bool{}
	for i := 0; i < 50; i++ {
		r, cancel := chatRequest("m", coldPrompt(i))
		w := httptest.NewRecorder()
		p.Select(pool, r, w)
		cancel()
		cs := (&http.Response{Header: w.Header()}).Cookies()
		if len(cs) != 1 {
			t.Fatalf("want one cookie, got %v", w.Header()["Set-Cookie"])
		}
		v := cs[0].Value
		if strings.Contains(v, "10.0.0.1") || strings.Contains(v, "8000") || len(v) != cookieIDLen+1+cookieMACLen {
			t.Errorf("cookie value %q is not an opaque signed id", v)
		}
		id, _, _ := strings.Cut(v, ".")
		if seen[id] {
			t.Errorf("session id %q issued twice", id)
		}
		seen[id] = true
	}
	if _, ok := p.cookie.decode(strings.Repeat("A", cookieIDLen) + "." + strings.Repeat("A", cookieMACLen)); ok {
		t.Error("a forged cookie was accepted")
	}
}
