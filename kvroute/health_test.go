package kvroute

// The policy's own health through the in-process Caddy (caddytest, on free ports: ports_test.go): only
// the upstream's own faults count, each attempt once; a client whose body breaks or that goes
// away counts for nothing; a session leaves an upstream whose attempt failed; an upstream
// dialled with a network prefix comes back; dead dynamic upstreams are forgotten, probes and
// all. Caddy's logs are discarded (healthConfig).

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// healthConfig serves every path through kv_cache_aware alone (telemetry off: only requests
// and probes move health) over ups, with Caddy's logs discarded. site goes into the site block
// before the proxy, policy into lb_policy, extra into reverse_proxy.
func healthConfig(ups []string, policy, site, extra string) string {
	return fmt.Sprintf(`{
	admin `+adminAddr+`
	http_port %[1]d
	https_port `+httpsPort+`
	grace_period 1s
	log {
		output discard
	}
}
localhost:%[1]d {
	%[3]s
	reverse_proxy %[2]s {
		lb_policy kv_cache_aware {
			telemetry off
			%[4]s
		}
		%[5]s
	}
}
`, httpPort, strings.Join(ups, " "), site, policy, extra)
}

// rawPost sends a chat POST through the proxy over a raw TCP connection: the header lines in
// head (each ending in \r\n), then body exactly as given. It returns the status line; with
// hangUp it closes the connection right after writing and returns "".
func rawPost(t *testing.T, head, body string, hangUp bool) string {
	t.Helper()
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", httpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:%d\r\nContent-Type: application/json\r\n%s\r\n%s", httpPort, head, body); err != nil {
		t.Fatal(err)
	}
	if hangUp {
		return ""
	}
	line, _ := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line)
}

// endedAfter runs send and waits until the outcome of the request it sends to one of us is
// taken in.
func endedAfter(t *testing.T, us []*upstreamState, send func()) {
	t.Helper()
	ended := func() (n uint64) {
		for _, u := range us {
			n += u.health.ended.Load()
		}
		return n
	}
	before := ended()
	send()
	waitUntil(t, 10*time.Second, func() bool { return ended() > before }, "the request's outcome to be taken in")
}

// A client whose body breaks (a malformed chunk, a body over request_body's max_size) or that
// hangs up mid-body makes its attempt fail with no response, but the upstream is not at fault:
// after more such requests than make an upstream down, it is up with no failure counted and
// keeps its session.
func TestHealthClientBodyFailuresNotCounted(t *testing.T) {
	start := `{"model":"m","messages":[{"role":"user","content":"a body that breaks"`
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 4000) + `"}]}`
	for _, tc := range []struct {
		name, head, body string
		hangUp           bool
	}{
		{"malformed chunk", "Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%s\r\nzz\r\n", len(start), start), false},
		{"over max_size", "Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(big), big), false},
		{"client gone mid-body", "Content-Length: 900\r\n", start, true}, // within max_size
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, 2)
			startCaddy(t, healthConfig([]string{f[0].addr(), f[1].addr()}, "", "request_body {\n\t\tmax_size 1KB\n\t}", ""))
			c := newClient(t, 10*time.Second)
			url := baseURL + "/v1/chat/completions"
			rep, resp := send(t, c, url, chatBody("m", "bind this session"), "X-Session-ID", "victim")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("first request: status %d", resp.StatusCode)
			}
			victim := f.byName(rep.Upstream)
			us := []*upstreamState{currentState().upstream(f[0].addr()), currentState().upstream(f[1].addr())}
			for range downAfter + 2 {
				endedAfter(t, us, func() {
					if status := rawPost(t, "X-Session-ID: victim\r\n"+tc.head, tc.body, tc.hangUp); strings.Contains(status, " 200 ") {
						t.Fatalf("a broken body was answered %q", status)
					}
				})
			}
			if hs := upstreamStatus(t, victim.addr()).Health; hs.State != "up" || hs.Failures != 0 || hs.TimesDown != 0 {
				t.Fatalf("health of the upstream the broken bodies went to: %+v, want up with no failure", hs)
			}
			hits := victim.hits.Load()
			rep, resp = send(t, c, url, chatBody("m", "still here?"), "X-Session-ID", "victim")
			if resp.StatusCode != http.StatusOK || rep.Upstream != victim.name || victim.hits.Load() != hits+1 {
				t.Fatalf("the session's next turn: status %d from %q, want 200 from %s", resp.StatusCode, rep.Upstream, victim.name)
			}
		})
	}
}

// An upstream that refuses connections is the upstream's fault: downAfter requests make it
// down, and cold requests then go elsewhere.
func TestHealthRefusedUpstreamGoesDown(t *testing.T) {
	f := newFleet(t, 1)
	dead := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	// The refusing upstream is the cheaper one: every cold request goes to it first.
	policy := fmt.Sprintf("upstream %s {\n\t\t\t\tenergy_per_token 10uJ\n\t\t\t}\n\t\t\tupstream %s {\n\t\t\t\tenergy_per_token 500uJ\n\t\t\t}", dead, f[0].addr())
	startCaddy(t, healthConfig([]string{dead, f[0].addr()}, policy, "", ""))
	c := newClient(t, 10*time.Second)
	url := baseURL + "/v1/chat/completions"
	u := currentState().upstream(dead)
	for i := range downAfter {
		endedAfter(t, []*upstreamState{u}, func() {
			if _, resp := send(t, c, url, chatBody("m", coldPrompt(i))); resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("request %d to the refusing upstream: status %d, want 502", i, resp.StatusCode)
			}
		})
	}
	if hs := upstreamStatus(t, dead).Health; hs.State != "down" || hs.TimesDown != 1 {
		t.Fatalf("health of the refusing upstream after %d refused attempts: %+v, want down", downAfter, hs)
	}
	for i := range 5 {
		if rep, resp := send(t, c, url, chatBody("m", coldPrompt(100+i))); resp.StatusCode != http.StatusOK || rep.Upstream != f[0].name {
			t.Fatalf("cold request %d once the refusing upstream is down: status %d from %q", i, resp.StatusCode, rep.Upstream)
		}
	}
}

// retry500 retries a 5xx answer on another upstream (README's lb_retry_match) without health
// checks.
const retry500 = "lb_retries 2\n\t\tlb_retry_match {\n\t\t\texpression {rp.status_code} >= 500\n\t\t}"

// A session whose upstream answers 500 moves to the upstream its retry succeeded on: the
// failing upstream sees the first of ten turns only.
func TestHealthRetryMovesSession(t *testing.T) {
	leakCheck(t)
	a, b := newProbe(t, "a"), newProbe(t, "b")
	policy := fmt.Sprintf("upstream %s {\n\t\t\t\tenergy_per_token 10uJ\n\t\t\t}\n\t\t\tupstream %s {\n\t\t\t\tenergy_per_token 500uJ\n\t\t\t}", a.addr(), b.addr())
	startCaddy(t, healthConfig([]string{a.addr(), b.addr()}, policy, "", retry500))
	c := newClient(t, 10*time.Second)
	if rep := postIntact(t, c, "/v1/chat/completions", bigChat(1, 1000), "X-Session-ID", "s500"); rep.Upstream != a.name {
		t.Fatalf("the first turn went to %q, want the cheaper %s: the test proves nothing", rep.Upstream, a.name)
	}
	a.setMode("500")
	before := a.hits.Load()
	for turn := 1; turn <= 10; turn++ {
		if rep := postIntact(t, c, "/v1/chat/completions", bigChat(1, 1000+200*turn), "X-Session-ID", "s500"); rep.Upstream != b.name {
			t.Fatalf("turn %d answered by %q, want %s", turn, rep.Upstream, b.name)
		}
	}
	if n := a.hits.Load() - before; n != 1 {
		t.Errorf("the upstream answering 500 received %d of 10 turns first, want 1 (the session moves on its first failure)", n)
	}
	waitIdle(t)
}

// With Caddy's passive health taking the only upstream out after its first refusal, each
// lb_try_interval of lb_try_duration asks the policy again and finds no candidate: the one
// failed attempt still counts once.
func TestHealthFailedAttemptCountsOnce(t *testing.T) {
	leakCheck(t)
	dead := fmt.Sprintf("127.0.0.1:%d", freePort(t)) // fresh: Caddy remembers a host's failures
	startCaddy(t, healthConfig([]string{dead}, "", "", "fail_duration 10s\n\t\tlb_try_duration 300ms\n\t\tlb_try_interval 20ms"))
	c := newClient(t, 10*time.Second)
	u := currentState().upstream(dead)
	endedAfter(t, []*upstreamState{u}, func() {
		if _, resp := send(t, c, baseURL+"/v1/chat/completions", chatBody("m", "once")); resp.StatusCode == http.StatusOK {
			t.Fatal("a request to a refusing upstream succeeded")
		}
	})
	if d := u.decisions[pathFallback].Load(); d != 1 {
		t.Fatalf("%d attempts, want 1: the test proves nothing", d)
	}
	if hs := upstreamStatus(t, dead).Health; hs.Failures != 1 || hs.State != "up" {
		t.Fatalf("health after one failed attempt: %+v, want 1 failure and up", hs)
	}
}

// An upstream dialled as tcp4/host:port that goes down is probed on that network: it comes
// back once it listens again, and gets requests.
func TestHealthNetworkDialComesBack(t *testing.T) {
	leakCheck(t)
	victim, other := newProbe(t, "victim"), newProbe(t, "other")
	dial := "tcp4/" + victim.addr()
	startCaddy(t, healthConfig([]string{dial, other.addr()}, "", "", ""))
	c := newClient(t, 10*time.Second)
	u := currentState().upstream(dial)
	victim.kill()
	for i := 0; !u.health.down.Load(); i++ {
		if i == 200 {
			t.Fatalf("the killed upstream is not down after %d requests: %+v", i, upstreamStatus(t, dial).Health)
		}
		_, _, _ = post(t, c, "/v1/chat/completions", strings.NewReader(chatBody("m", coldPrompt(i))))
	}
	back := newProbeAt(t, "victim", victim.addr())
	waitUntil(t, 10*time.Second, func() bool { return upstreamStatus(t, dial).Health.State == "up" }, "the upstream listening again to be up")
	for i := 0; back.hits.Load() == 0; i++ {
		if i == 100 {
			t.Fatalf("the upstream back got none of %d cold requests", i)
		}
		postIntact(t, c, "/v1/chat/completions", bigChat(1000+i, 500))
	}
}

// An upstream whose dial only a request fills (a request placeholder) cannot be probed: once
// down, it is back when its cool-down ends, not held down for good.
func TestHealthUnprobeableUpstreamBackAfterCoolDown(t *testing.T) {
	leakCheck(t)
	const dial = "{http.request.header.X-Upstream}"
	startCaddy(t, healthConfig([]string{dial}, "", "", ""))
	c := newClient(t, 10*time.Second)
	dead := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	u := currentState().upstream(dial)
	for i := range downAfter {
		endedAfter(t, []*upstreamState{u}, func() {
			if _, resp := send(t, c, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(i)), "X-Upstream", dead); resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("request %d to a refusing address: status %d, want 502", i, resp.StatusCode)
			}
		})
	}
	if hs := upstreamStatus(t, dial).Health; hs.State != "down" {
		t.Fatalf("health after %d refused attempts: %+v, want down", downAfter, hs)
	}
	waitUntil(t, 10*coolDownBase, func() bool { return upstreamStatus(t, dial).Health.State == "up" }, "the unprobeable upstream to be back after its cool-down")
}

// probeGoroutines counts the health probes running.
func probeGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "(*state).startProbe.func")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// shortDynamicTTL makes dynamic upstreams expire after d for the rest of the test.
func shortDynamicTTL(t *testing.T, d time.Duration) {
	dynamicTTLOverride.Store(int64(d))
	t.Cleanup(func() { dynamicTTLOverride.Store(0) })
}

// known reports whether the state holds anything of addr.
func known(s *state, addr string) bool {
	_, ok := s.upstreams.Load(addr)
	return ok
}

// Dead dynamic upstreams, down and probed, are forgotten once no decision picked them for the
// dynamic TTL: their probes stop and their states go. A static upstream that leaves the
// config stops being probed at once.
func TestHealthDeadUpstreamsForgotten(t *testing.T) {
	t.Run("dynamic", func(t *testing.T) {
		leakCheck(t)
		baseline := probeGoroutines()
		var sources, addrs []string
		for range 5 {
			p := freePort(t)
			sources = append(sources, fmt.Sprintf("a 127.0.0.1 %d", p))
			addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", p))
		}
		startCaddy(t, healthConfig(nil, "eviction_interval 1s", "",
			"dynamic multi {\n\t\t\t"+strings.Join(sources, "\n\t\t\t")+"\n\t\t}"))
		c := newClient(t, 10*time.Second)
		s := currentState()
		allDown := func() bool {
			for _, a := range addrs {
				if !s.isDown(a) {
					return false
				}
			}
			return true
		}
		for i := 0; !allDown(); i++ {
			if i == 300 {
				t.Fatalf("the dead dynamic upstreams are not all down after %d requests", i)
			}
			_, _, _ = post(t, c, "/v1/chat/completions", strings.NewReader(chatBody("m", coldPrompt(i))))
		}
		// An upstream is marked down, then its probe starts (after a log line): wait for the
		// probes rather than count them the moment the last one is down.
		n := probeGoroutines() - baseline
		for deadline := time.Now().Add(10 * time.Second); n != len(addrs) && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			n = probeGoroutines() - baseline
		}
		if n != len(addrs) {
			t.Fatalf("%d probes running for %d down upstreams", n, len(addrs))
		}
		shortDynamicTTL(t, 300*time.Millisecond)
		waitUntil(t, 10*time.Second, func() bool {
			for _, a := range addrs {
				if known(s, a) {
					return false
				}
			}
			return probeGoroutines() == baseline
		}, "the dead dynamic upstreams' probes and states to go")
	})
	t.Run("static removed", func(t *testing.T) {
		f := newFleet(t, 1)
		baseline := probeGoroutines()
		dead := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		policy := fmt.Sprintf("upstream %s {\n\t\t\t\tenergy_per_token 10uJ\n\t\t\t}", dead)
		startCaddy(t, healthConfig([]string{dead, f[0].addr()}, policy, "", ""))
		c := newClient(t, 10*time.Second)
		s := currentState()
		for i := 0; !s.isDown(dead); i++ {
			if i == 50 {
				t.Fatalf("the refusing upstream is not down after %d requests", i)
			}
			_, _, _ = post(t, c, "/v1/chat/completions", strings.NewReader(chatBody("m", coldPrompt(i))))
		}
		if n := probeGoroutines() - baseline; n != 1 {
			t.Fatalf("%d probes running for one down upstream", n)
		}
		load(t, healthConfig([]string{f[0].addr()}, "", "", ""))
		waitUntil(t, 10*time.Second, func() bool { return probeGoroutines() == baseline && !known(s, dead) },
			"the removed upstream's probe and state to go")
	})
}

// Dial addresses parse as Caddy's reverse_proxy parses them; those a probe cannot reach are
// told apart (they come back when their cool-down ends).
func TestHealthProbeTarget(t *testing.T) {
	t.Setenv("KVROUTE_TEST_UPSTREAM", "10.0.0.9")
	for _, tc := range []struct{ dial, network, address string }{
		{"10.0.0.1:8000", "tcp", "10.0.0.1:8000"},
		{"tcp4/127.0.0.1:9000", "tcp4", "127.0.0.1:9000"},
		{"tcp6/[::1]:9000", "tcp6", "[::1]:9000"},
		{"tcp/gpu-1.internal:30000", "tcp", "gpu-1.internal:30000"},
		{"unix//run/vllm.sock", "unix", "/run/vllm.sock"},
		{"{env.KVROUTE_TEST_UPSTREAM}:8000", "tcp", "10.0.0.9:8000"},
		{"{http.request.header.X-Upstream}:8000", "", ""},
		{"udp/10.0.0.1:53", "", ""},
		{"10.0.0.1:8000-8001", "", ""},
		{"fd/3", "", ""},
		{"tcp4/", "", ""},
	} {
		network, address, ok := probeTarget(tc.dial)
		if network != tc.network || address != tc.address || ok != (tc.network != "") {
			t.Errorf("probeTarget(%q) = %q, %q, %v; want %q, %q", tc.dial, network, address, ok, tc.network, tc.address)
		}
	}
}
