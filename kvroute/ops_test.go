package kvroute

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// load posts a Caddyfile to the in-process Caddy's admin API.
func load(t testing.TB, cfg string) {
	t.Helper()
	checkPorts(t, cfg)
	captureCaddyLog(t)
	resp, err := http.Post(adminURL+"/load", "text/caddyfile", strings.NewReader(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST /load: %d %s", resp.StatusCode, body)
	}
}

func adminCall(t testing.TB, method, path string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, adminURL+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

func getStatus(t testing.TB) Status {
	t.Helper()
	code, body := adminCall(t, http.MethodGet, "/kvroute/")
	if code != http.StatusOK {
		t.Fatalf("GET /kvroute/: %d %s", code, body)
	}
	var st Status
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("GET /kvroute/: %v: %s", err, body)
	}
	return st
}

// metricValue reads one sample of the admin /metrics endpoint, 0 when absent.
func metricValue(t testing.TB, series string) float64 {
	t.Helper()
	_, body := adminCall(t, http.MethodGet, "/metrics")
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, series+" ") {
			v, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, series)), 64)
			return v
		}
	}
	return 0
}

func TestReloadKeepsLearnedPrefixes(t *testing.T) {
	f := newFleet(t, 4)
	cfg := proxyConfig(f, "", "", "")
	startCaddy(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	sys := strings.Repeat("A long system prompt for the reload test. ", 40)
	msgs := []string{sys, "hello"}
	rep, _ := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", msgs...))
	home := rep.Upstream
	for i := 0; i < 3; i++ {
		load(t, cfg)
		msgs = append(msgs, "answer", fmt.Sprintf("question after reload %d", i))
		rep, _ := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", msgs...))
		if rep.Upstream != home {
			t.Fatalf("after reload %d the conversation moved from %s to %s", i, home, rep.Upstream)
		}
	}
	if metricValue(t, `caddy_kvroute_decisions_total{path="prefix_hit"}`) < 3 {
		t.Errorf("prefix_hit decisions not counted across reloads")
	}
}

func TestReloadDropsDepartedUpstream(t *testing.T) {
	f := newFleet(t, 3)
	startCaddy(t, proxyConfig(f, "", "", ""))
	client := &http.Client{Timeout: 10 * time.Second}
	for i := 0; i < 12; i++ {
		send(t, client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(i)), "X-Session-ID", fmt.Sprint("s", i))
	}
	st := getStatus(t)
	gone := f[0].addr()
	if st.Upstreams[gone].TreeChars == 0 || st.Upstreams[gone].Sessions == 0 {
		t.Fatalf("setup: %s holds nothing: %+v", gone, st.Upstreams[gone])
	}
	load(t, proxyConfig(f[1:], "", "", ""))
	st = getStatus(t)
	if u := st.Upstreams[gone]; u.TreeChars != 0 || u.Sessions != 0 {
		t.Errorf("after %s left the config it still holds %d tree chars and %d sessions", gone, u.TreeChars, u.Sessions)
	}
	if st.Upstreams[f[1].addr()].TreeChars == 0 {
		t.Errorf("the upstreams that stayed lost their prefixes")
	}
}

// A decision of the old config that runs after a reload took its upstream out does not bring
// that upstream back. Caddy cleans up the old config's modules (kv_cache_aware's Cleanup forgets
// the departed upstream's prefixes and sessions) once the new config is in, without waiting for
// the old config's requests: within the grace period they go on, and may still be deciding.
// Here one is held in its decision across the reload; it goes to the departed upstream (the
// old config's only one), as the old config says, and afterwards GET /kvroute/ shows no
// prefixes or sessions for that upstream and the router keeps no state for it (which would make
// it a dynamic upstream, read and shown for 10 minutes).
func TestReloadLateDecisionKeepsDepartedUpstreamOut(t *testing.T) {
	f := newFleet(t, 2)
	gone := f[0]
	startCaddy(t, proxyConfig(f[:1], "", "", "")) // the old config's only upstream: the held decision goes there
	client := &http.Client{Timeout: 20 * time.Second}
	send(t, client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(1)), "X-Session-ID", "late")
	if u := getStatus(t).Upstreams[gone.addr()]; u.TreeChars == 0 || u.Sessions == 0 {
		t.Fatalf("setup: %s holds nothing: %+v", gone.name, u)
	}

	h := newHeld()
	var first atomic.Bool
	hook := func() {
		if first.CompareAndSwap(false, true) {
			h.wait()
		}
	}
	testHookDecide.Store(&hook)
	t.Cleanup(func() { testHookDecide.Store(nil) })
	type result struct {
		rep  backendReply
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader(chatBody("m", coldPrompt(2))))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Session-ID", "late")
		resp, err := client.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		var rep backendReply
		err = json.NewDecoder(resp.Body).Decode(&rep)
		done <- result{rep, resp.StatusCode, err}
	}()
	select {
	case <-h.entered:
	case <-time.After(20 * time.Second):
		close(h.release)
		t.Fatal("setup: the request made no decision in 20 s")
	}
	load(t, proxyConfig(f[1:], "", "", "")) // returns once the old config is cleaned up
	close(h.release)
	res := <-done
	if res.err != nil || res.code != http.StatusOK || res.rep.Upstream != gone.name {
		t.Fatalf("setup: the old config's held request: status %d, %v, upstream %q (want %s)", res.code, res.err, res.rep.Upstream, gone.name)
	}
	u := getStatus(t).Upstreams[gone.addr()]
	s := currentState()
	_, kept := s.upstreams.Load(gone.addr())
	_, read := s.tel.dynamic.Load(gone.addr())
	if u.TreeChars != 0 || u.Sessions != 0 || kept || read {
		t.Errorf("after a decision of the old config that went to %s, which the new config left out: %d tree chars, %d sessions, state kept %v, its metrics read %v; want none",
			gone.name, u.TreeChars, u.Sessions, kept, read)
	}
}

func TestReloadSmallerTreeBoundEvictsAtOnce(t *testing.T) {
	f := newFleet(t, 2)
	startCaddy(t, proxyConfig(f, "", "", ""))
	client := &http.Client{Timeout: 10 * time.Second}
	for i := 0; i < 40; i++ {
		send(t, client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(i)+strings.Repeat(" filler", 200)))
	}
	if c := getStatus(t).StoredChars; c < 40*1400 {
		t.Fatalf("setup: only %d chars stored", c)
	}
	load(t, proxyConfig(f, "", "max_tree_size 10000", ""))
	// The pass runs in the background once the new config starts, never on a request.
	waitUntil(t, 10*time.Second, func() bool { return getStatus(t).StoredChars <= 11000 },
		"the trees within 10% of the reloaded max_tree_size 10000")
}

func TestAdminAPI(t *testing.T) {
	f := newFleet(t, 2)
	startCaddy(t, proxyConfig(f, "", "", ""))
	client := &http.Client{Timeout: 10 * time.Second}
	rep, _ := send(t, client, baseURL+"/v1/chat/completions", chatBody("llama", "hello admin"), "X-Session-ID", "sess-1")
	addr := f.byName(rep.Upstream).addr()
	// The request stops counting in flight when its context ends, after the answer was
	// written: the client may have read it all by then. Wait for the count, not the answer.
	waitUntil(t, time.Second, func() bool { return getStatus(t).Upstreams[addr].InFlight == 0 }, "the answered request out of "+addr+"'s in-flight count")

	st := getStatus(t)
	if !st.Loaded || st.Sessions != 1 || st.Models["llama"].TreeChars[addr] == 0 {
		t.Fatalf("GET /kvroute/ = %+v", st)
	}
	u := st.Upstreams[addr]
	if u.Sessions != 1 || u.Decisions["fallback"] != 1 || u.InFlight != 0 {
		t.Errorf("upstream %s status %+v", addr, u)
	}

	if code, body := adminCall(t, http.MethodDelete, "/kvroute/sessions/no-such-session"); code != http.StatusNotFound || !json.Valid(body) {
		t.Errorf("DELETE unknown session: %d %s, want 404 with a JSON error", code, body)
	}
	if code, body := adminCall(t, http.MethodDelete, "/kvroute/sessions/sess-1"); code != http.StatusOK {
		t.Errorf("DELETE session: %d %s", code, body)
	}
	if st := getStatus(t); st.Sessions != 0 {
		t.Errorf("session still bound after DELETE: %d", st.Sessions)
	}
	if code, body := adminCall(t, http.MethodGet, "/kvroute/reset"); code != http.StatusMethodNotAllowed || !json.Valid(body) {
		t.Errorf("GET /kvroute/reset: %d %s, want 405 with a JSON error", code, body)
	}
	if code, _ := adminCall(t, http.MethodGet, "/kvroute/nothing"); code != http.StatusNotFound {
		t.Errorf("unknown endpoint: %d, want 404", code)
	}
	send(t, client, baseURL+"/v1/chat/completions", chatBody("llama", "hello again"), "X-Session-ID", "sess-2")
	if code, body := adminCall(t, http.MethodPost, "/kvroute/reset"); code != http.StatusOK {
		t.Fatalf("POST /kvroute/reset: %d %s", code, body)
	}
	if st := getStatus(t); st.StoredChars != 0 || st.Sessions != 0 || len(st.Models) != 0 {
		t.Errorf("after reset: %d chars, %d sessions, models %v", st.StoredChars, st.Sessions, st.Models)
	}
}

// GET /kvroute (no slash) answers the status itself, as curl without -L shows it, not a
// redirect.
func TestAdminStatusWithoutSlash(t *testing.T) {
	f := newFleet(t, 2)
	startCaddy(t, proxyConfig(f, "", "", ""))
	client := &http.Client{
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Get(adminURL + "/kvroute")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var st Status
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &st) != nil || !st.Loaded {
		t.Errorf("GET /kvroute: %d %s, want 200 with the status JSON", resp.StatusCode, body)
	}
}

// An upstream block naming an address in no static pool is likely a typo: one warn line names
// it (and says dynamic upstreams are fine); an address in the pool logs nothing.
func TestUpstreamBlockNotInPoolWarns(t *testing.T) {
	f := newFleet(t, 2)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	cfg := proxyConfig(f, "", fmt.Sprintf("upstream 127.0.0.1:1 {\n\t\t\tmax_concurrency 4\n\t\t}\n\t\tupstream %s {\n\t\t\tmax_concurrency 4\n\t\t}", f[0].addr()), "")
	cfg = strings.Replace(cfg, "grace_period 1s", "grace_period 1s\n\tlog {\n\t\toutput file "+logFile+"\n\t\tformat json\n\t}", 1)
	startCaddy(t, cfg)
	data, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	var warns []map[string]any
	for _, line := range bytes.Split(data, []byte("\n")) {
		var e map[string]any
		if json.Unmarshal(line, &e) == nil && strings.HasPrefix(fmt.Sprint(e["msg"]), "upstream block names") {
			if e["level"] != "warn" {
				t.Errorf("logged at %v, want warn: %s", e["level"], line)
			}
			warns = append(warns, e)
		}
	}
	if len(warns) != 1 || warns[0]["upstream"] != "127.0.0.1:1" || !strings.Contains(fmt.Sprint(warns[0]["msg"]), "dynamic upstreams") {
		t.Errorf("want one warn naming 127.0.0.1:1 and dynamic upstreams, got %v", warns)
	}
}

func TestMetricsAfterReloads(t *testing.T) {
	f := newFleet(t, 2)
	cfg := proxyConfig(f, "", "", "")
	startCaddy(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	series := `caddy_kvroute_decisions_total{path="fallback"}`
	prev := metricValue(t, series)
	for i := 0; i < 3; i++ {
		send(t, client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(1000+i)))
		v := metricValue(t, series)
		if v <= prev {
			t.Fatalf("reload %d: %s did not increase (%v → %v)", i, series, prev, v)
		}
		prev = v
		load(t, cfg)
	}
	for _, name := range []string{"caddy_kvroute_match_ratio_count", "caddy_kvroute_stored_chars", "caddy_kvroute_sessions",
		`caddy_kvroute_tree_chars{upstream="` + f[0].addr() + `"}`} {
		if !strings.Contains(string(mustMetrics(t)), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func mustMetrics(t testing.TB) []byte {
	_, body := adminCall(t, http.MethodGet, "/metrics")
	return body
}

// 200 reloads in a row leave the goroutine count and the heap flat.
func TestReloadsDoNotLeak(t *testing.T) {
	f := newFleet(t, 2)
	cfg := proxyConfig(f, "", "", "")
	startCaddy(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	settle := func() (int, uint64) {
		var m runtime.MemStats
		for i := 0; i < 3; i++ {
			runtime.GC()
			time.Sleep(50 * time.Millisecond)
		}
		runtime.ReadMemStats(&m)
		return runtime.NumGoroutine(), m.HeapAlloc
	}
	for i := 0; i < 20; i++ { // warm up: pools, connections, lazily made state
		load(t, cfg)
		send(t, client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(i)))
	}
	g0, h0 := settle()
	for i := 0; i < 200; i++ {
		load(t, cfg)
		if i%20 == 0 {
			send(t, client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(100+i)))
		}
	}
	// The old configs' servers go within their grace period (1 s), later on a loaded machine:
	// wait for the goroutines to come back, for up to 20 s, rather than for the grace period.
	g1, h1 := settle()
	for deadline := time.Now().Add(20 * time.Second); g1 > g0+10 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		g1, h1 = settle()
	}
	t.Logf("200 reloads: goroutines %d → %d, heap %d KiB → %d KiB", g0, g1, h0>>10, h1>>10)
	if g1 > g0+10 {
		t.Errorf("goroutines grew from %d to %d over 200 reloads", g0, g1)
	}
	if h1 > h0+8<<20 {
		t.Errorf("heap grew from %d KiB to %d KiB over 200 reloads", h0>>10, h1>>10)
	}
}

// DELETE /kvroute/sessions/{id} finds the id however the path is escaped: the admin API routes
// by the unescaped path, so the id is cut from it too.
func TestAdminForgetSessionEscapedPath(t *testing.T) {
	f := newFleet(t, 2)
	startCaddy(t, proxyConfig(f, "", "", ""))
	client := &http.Client{Timeout: 10 * time.Second}
	for _, tc := range []struct{ id, path string }{
		{"abc", "/kvroute/%73essions/abc"},
		{"abc", "/kvroute/sessions/%61bc"},
		{"a/b c%", "/kvroute/sessions/a%2Fb%20c%25"},
	} {
		send(t, client, baseURL+"/v1/chat/completions", chatBody("m", "hello "+tc.path), "X-Session-ID", tc.id)
		if st := getStatus(t); st.Sessions != 1 {
			t.Fatalf("%q: %d sessions bound, want 1", tc.id, st.Sessions)
		}
		if code, body := adminCall(t, http.MethodDelete, tc.path); code != http.StatusOK {
			t.Errorf("DELETE %s: %d %s, want 200", tc.path, code, body)
		}
		if st := getStatus(t); st.Sessions != 0 {
			t.Errorf("DELETE %s: session %q still bound", tc.path, tc.id)
			currentState().forgetSession(tc.id)
		}
	}
}
