package kvroute

// Reliability through the in-process Caddy (caddytest, on free ports: ports_test.go): body
// integrity (gzip, slow clients, clients that leave mid-body, retries after a refused
// connection), SSE flushing, upstream faults (killed mid-stream, hanging, answering 500,
// removed and re-added), 64 concurrent clients, and goroutine-leak checks.

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// leakSlack is how many goroutines more than at its start a test may leave behind, leakWait
// how long they have to go.
const leakSlack, leakWait = 3, 20 * time.Second

// idleConfig is the in-process Caddy with no site: what leakCheck loads around a test.
var idleConfig = fmt.Sprintf("{\n\tadmin %s\n\thttp_port %d\n\thttps_port %s\n\tgrace_period 1s\n}\n", adminAddr, httpPort, httpsPort)

// leakCheck loads a config without sites into the in-process Caddy (starting it if no test
// did yet) and records the number of goroutines once it is steady. When the test ends (after
// the cleanups registered later: backends closed, clients' idle connections closed) it loads
// that config again, so that the test's servers, health checkers and connections go, and
// waits up to 20 s for the count to come back to at most the start plus leakSlack; otherwise
// the test fails with a dump of the goroutines. Call it first in a test. (The old servers go
// within the 1 s grace period, later on a loaded machine; a leak stays however long one waits,
// so only a failing test waits the 20 s.)
func leakCheck(t *testing.T) {
	t.Helper()
	captureCaddyLog(t)
	if _, dup := leakChecked.LoadOrStore(t, true); dup {
		return
	}
	t.Cleanup(func() { leakChecked.Delete(t) })
	caddytest.NewTester(t).InitServer(idleConfig, "caddyfile")
	start := steadyGoroutines()
	t.Cleanup(func() {
		load(t, idleConfig)
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		deadline := time.Now().Add(leakWait)
		n := runtime.NumGoroutine()
		for n > start+leakSlack && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			n = runtime.NumGoroutine()
		}
		if n > start+leakSlack {
			buf := make([]byte, 256<<10)
			buf = buf[:runtime.Stack(buf, true)]
			t.Errorf("goroutine leak: %d at the start, %d %v after the end\n%s", start, n, leakWait, buf)
			return
		}
		t.Logf("goroutines: %d at the start, %d at the end", start, n)
	})
}

// leakChecked holds the tests that have a leak check already (startCaddy adds one to every
// integration test).
var leakChecked sync.Map

// steadyGoroutines returns the number of goroutines once it has not changed for 200 ms (or
// after 3 s): the previous config's servers may still be shutting down.
func steadyGoroutines() int {
	n, since := runtime.NumGoroutine(), time.Now()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		if m := runtime.NumGoroutine(); m != n {
			n, since = m, time.Now()
		} else if time.Since(since) >= 200*time.Millisecond {
			break
		}
	}
	return n
}

// newClient returns an HTTP client with connections of its own, closed when the test ends.
func newClient(t *testing.T, timeout time.Duration) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 128
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Timeout: timeout, Transport: tr}
}

// probe is a loopback upstream. It hashes the body it receives and answers with its name, the
// body's SHA-256 and length, and the Content-Encoding it saw; or fails as told.
type probe struct {
	name string
	srv  *httptest.Server

	hits     atomic.Int64 // requests (health checks aside)
	late     atomic.Int64 // of them, those the test marked X-Test-Late (sent after a point it chose)
	active   atomic.Int64 // being handled now
	complete atomic.Int64 // bodies received whole
	broken   atomic.Int64 // bodies that failed while being read
	stalls   atomic.Int64 // stream events whose previous one the client did not read (?ack=)

	mu      sync.Mutex
	mode    string        // "" (answer), "500", "hang"
	release chan struct{} // closed to release hanging requests
}

type probeReply struct {
	Upstream        string `json:"upstream"`
	SHA256          string `json:"sha256"`
	Len             int64  `json:"len"`
	ContentEncoding string `json:"content_encoding"`
}

func newProbe(t testing.TB, name string) *probe { return newProbeAt(t, name, "127.0.0.1:0") }

// newProbeAt starts a probe listening on addr (to bring an upstream back on its address).
func newProbeAt(t testing.TB, name, addr string) *probe {
	t.Helper()
	p := &probe{name: name, release: make(chan struct{})}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(p.serve))
	var l net.Listener
	var err error
	for i := 0; i < 50; i++ { // the address may linger a moment after its last owner closed it
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	p.srv.Listener = l
	p.srv.Start()
	t.Cleanup(p.kill)
	return p
}

func (p *probe) addr() string { return p.srv.Listener.Addr().String() }

// kill closes the listener and every connection at once, mid-response if need be.
func (p *probe) kill() {
	p.setMode("")
	p.srv.CloseClientConnections()
	p.srv.Close()
}

func (p *probe) setMode(mode string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == "hang" && mode != "hang" {
		close(p.release)
		p.release = make(chan struct{})
	}
	p.mode = mode
}

func (p *probe) serve(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	mode, release := p.mode, p.release
	p.mu.Unlock()
	if r.URL.Path == "/metrics" || r.URL.Path == "/v1/models" {
		http.NotFound(w, r) // no telemetry; the policy's scrapes are not requests
		return
	}
	if r.URL.Path == "/health" {
		if mode == "500" {
			http.Error(w, "broken", http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
		return
	}
	p.hits.Add(1)
	if r.Header.Get("X-Test-Late") != "" {
		p.late.Add(1)
	}
	p.active.Add(1)
	defer p.active.Add(-1)
	h := sha256.New()
	n, err := io.Copy(h, r.Body)
	if err != nil {
		p.broken.Add(1)
		return
	}
	p.complete.Add(1)
	switch mode {
	case "500":
		http.Error(w, "upstream failure", http.StatusInternalServerError)
		return
	case "hang":
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
	}
	if q := r.URL.Query(); q.Get("events") != "" {
		p.stream(w, r, q)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(probeReply{Upstream: p.name, SHA256: hex.EncodeToString(h.Sum(nil)), Len: n, ContentEncoding: r.Header.Get("Content-Encoding")})
}

// streamAcks holds, per ?ack= id, how many events the test's client has read: a stream with an
// id writes an event only once the client read the one before (or gave up after streamStall).
var streamAcks sync.Map // id → *atomic.Int64

// streamStall is how long a stream with ?ack= waits for the client to read an event before it
// counts a stall and goes on: only a proxy that holds events back makes it wait that long.
const streamStall = 10 * time.Second

// stream writes ?events= events, ?gap= ms apart, each stamped with the time it is written, as
// SSE (or NDJSON with ?ct=ndjson), flushing after each.
func (p *probe) stream(w http.ResponseWriter, r *http.Request, q map[string][]string) {
	events, _ := strconv.Atoi(q["events"][0])
	gap := 5 * time.Millisecond
	if g := q["gap"]; len(g) > 0 {
		ms, _ := strconv.Atoi(g[0])
		gap = time.Duration(ms) * time.Millisecond
	}
	ndjson := len(q["ct"]) > 0 && q["ct"][0] == "ndjson"
	if ndjson {
		w.Header().Set("Content-Type", "application/x-ndjson")
	} else {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
	}
	var acked *atomic.Int64
	if id := q["ack"]; len(id) > 0 {
		if v, ok := streamAcks.Load(id[0]); ok {
			acked = v.(*atomic.Int64)
		}
	}
	fl := w.(http.Flusher)
	for i := 0; i < events; i++ {
		if i > 0 {
			select {
			case <-time.After(gap):
			case <-r.Context().Done():
				return
			}
		}
		for stall := time.Now().Add(streamStall); acked != nil && acked.Load() < int64(i); time.Sleep(time.Millisecond) {
			if time.Now().After(stall) {
				p.stalls.Add(1)
				acked = nil // one stall tells; waiting on every event would take minutes
				break
			}
			if r.Context().Err() != nil {
				return
			}
		}
		ev := fmt.Sprintf(`{"i":%d,"t":%d,"upstream":%q}`, i, time.Now().UnixNano(), p.name)
		var err error
		if ndjson {
			_, err = fmt.Fprintf(w, "%s\n", ev)
		} else {
			_, err = fmt.Fprintf(w, "data: %s\n\n", ev)
		}
		if err != nil {
			return
		}
		fl.Flush()
	}
	if !ndjson {
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

type probes []*probe

func newProbes(t testing.TB, n int) probes {
	ps := make(probes, n)
	for i := range ps {
		ps[i] = newProbe(t, fmt.Sprintf("p%d", i+1))
	}
	return ps
}

func (ps probes) addrs() []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.addr()
	}
	return out
}

func (ps probes) byName(name string) *probe {
	for _, p := range ps {
		if p.name == name {
			return p
		}
	}
	return nil
}

// relConfig is a Caddyfile serving /plain/* with kv_cache_aware alone (the policy extracts
// the request itself) and everything else with the llm_prompt matcher in front of it (requests
// that do not match go to a plain reverse_proxy). policy is the lb_policy block's body, extra
// goes into both kv_cache_aware reverse_proxy blocks.
func relConfig(addrs []string, matcher, policy, extra string) string {
	ups := strings.Join(addrs, " ")
	return fmt.Sprintf(`{
	admin `+adminAddr+`
	http_port %[1]d
	https_port `+httpsPort+`
	grace_period 1s
}
localhost:%[1]d {
	handle /plain/* {
		reverse_proxy %[2]s {
			lb_policy kv_cache_aware {
				%[4]s
			}
			%[5]s
		}
	}
	handle {
		@llm llm_prompt {
			%[3]s
		}
		reverse_proxy @llm %[2]s {
			lb_policy kv_cache_aware {
				%[4]s
			}
			%[5]s
		}
		reverse_proxy %[2]s
	}
}
`, httpPort, ups, matcher, policy, extra)
}

// post sends body to path with the headers (name, value pairs) and returns the probe's reply.
func post(t testing.TB, c *http.Client, path string, body io.Reader, headers ...string) (probeReply, int, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, baseURL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return probeReply{}, 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return probeReply{}, resp.StatusCode, err
	}
	var rep probeReply
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &rep); err != nil {
			return rep, resp.StatusCode, fmt.Errorf("bad reply %.200q: %v", raw, err)
		}
	}
	return rep, resp.StatusCode, nil
}

// postIntact posts body and fails the test unless a probe answered 200 with body's hash.
func postIntact(t testing.TB, c *http.Client, path string, body []byte, headers ...string) probeReply {
	t.Helper()
	rep, code, err := post(t, c, path, bytes.NewReader(body), headers...)
	if err != nil || code != http.StatusOK {
		t.Fatalf("POST %s (%d bytes): status %d, %v", path, len(body), code, err)
	}
	checkIntact(t, rep, body)
	return rep
}

func checkIntact(t testing.TB, rep probeReply, body []byte) {
	t.Helper()
	sum := sha256.Sum256(body)
	if rep.SHA256 != hex.EncodeToString(sum[:]) || rep.Len != int64(len(body)) {
		t.Errorf("%s received %d bytes with sha256 %.12s…, not the %d bytes sent (%.12x…)", rep.Upstream, rep.Len, rep.SHA256, len(body), sum)
	}
}

// bigChat returns a chat request of about n bytes whose prompt is unique to seed.
func bigChat(seed, n int) []byte {
	head := fmt.Sprintf("%s. ", coldPrompt(seed))
	return []byte(chatBody("m", head+strings.Repeat("lorem ipsum dolor sit amet ", max(0, n-100)/27)))
}

// waitIdle waits until the router counts no request in flight on any upstream.
func waitIdle(t testing.TB) {
	t.Helper()
	waitUntil(t, 5*time.Second, func() bool {
		s := currentState()
		if s == nil {
			return true // no policy loaded: nothing is counted
		}
		idle := true
		s.upstreams.Range(func(_, v any) bool {
			u := v.(*upstreamState)
			if u.inFlight.Load() != 0 || u.queuedTokens.Load() != 0 {
				idle = false
			}
			return idle
		})
		return idle
	}, "no request in flight in the router's counts")
}

// A gzip'd body with Content-Encoding: gzip is not an LLM request to the matcher (it does not
// decompress): it goes to the plain reverse_proxy; the policy alone routes it without text.
// Either way the upstream receives the compressed bytes as sent, with the header.
func TestReliabilityGzipBodyPassesThrough(t *testing.T) {
	leakCheck(t)
	ps := newProbes(t, 2)
	startCaddy(t, relConfig(ps.addrs(), "max_body 64KiB", "", ""))
	c := newClient(t, 20*time.Second)
	for _, size := range []int{1 << 10, 256 << 10} {
		var zb bytes.Buffer
		zw := gzip.NewWriter(&zb)
		_, _ = zw.Write(bigChat(size, size))
		_ = zw.Close()
		for _, path := range []string{"/v1/chat/completions", "/plain/v1/chat/completions"} {
			rep := postIntact(t, c, path, zb.Bytes(), "Content-Encoding", "gzip")
			if rep.ContentEncoding != "gzip" {
				t.Errorf("%s: upstream saw Content-Encoding %q, want gzip", path, rep.ContentEncoding)
			}
		}
	}
	waitIdle(t)
}

// trickle is a request body that arrives in pieces over about d.
type trickle struct {
	rest  []byte
	piece int
	gap   time.Duration
	reads int
}

func (tr *trickle) Read(p []byte) (int, error) {
	if len(tr.rest) == 0 {
		return 0, io.EOF
	}
	if tr.reads > 0 {
		time.Sleep(tr.gap)
	}
	tr.reads++
	n := copy(p, tr.rest[:min(len(tr.rest), tr.piece)])
	tr.rest = tr.rest[n:]
	return n, nil
}

func newTrickle(body []byte, d time.Duration) *trickle {
	const pieces = 20
	return &trickle{rest: body, piece: (len(body) + pieces - 1) / pieces, gap: d / pieces}
}

// A body trickling in over ~2 s, below and above max_body, through the matcher and through
// the policy alone, known length and chunked, reaches the upstream whole.
func TestReliabilitySlowClientBody(t *testing.T) {
	leakCheck(t)
	ps := newProbes(t, 2)
	startCaddy(t, relConfig(ps.addrs(), "max_body 64KiB", "", ""))
	c := newClient(t, 30*time.Second)
	var wg sync.WaitGroup
	for i, size := range []int{16 << 10, 200 << 10} {
		for j, path := range []string{"/v1/chat/completions", "/plain/v1/chat/completions"} {
			for _, chunked := range []bool{false, true} {
				body := bigChat(100+4*i+2*j, size)
				wg.Add(1)
				go func() {
					defer wg.Done()
					var rd io.Reader = newTrickle(body, 2*time.Second)
					req, _ := http.NewRequest(http.MethodPost, baseURL+path, rd)
					if !chunked {
						req.ContentLength = int64(len(body))
					}
					start := time.Now()
					resp, err := c.Do(req)
					if err != nil {
						t.Errorf("%s %d bytes: %v", path, len(body), err)
						return
					}
					defer resp.Body.Close()
					var rep probeReply
					if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != http.StatusOK {
						t.Errorf("%s %d bytes: status %d, %v", path, len(body), resp.StatusCode, err)
						return
					}
					checkIntact(t, rep, body)
					if d := time.Since(start); d < 1500*time.Millisecond {
						t.Errorf("the body was meant to trickle over 2 s, took %v", d)
					}
				}()
			}
		}
	}
	wg.Wait()
	waitIdle(t)
}

// A client that disconnects mid-body (while the matcher is still reading, or after the
// upstream got the first max_body bytes, or with the policy alone) leaves nothing behind: no
// goroutine, no in-flight count, no upstream handler waiting, and no upstream ever receives
// the truncated body as a whole one.
func TestReliabilityClientDisconnectMidBody(t *testing.T) {
	leakCheck(t)
	ps := newProbes(t, 2)
	startCaddy(t, relConfig(ps.addrs(), "max_body 64KiB", "", ""))
	c := newClient(t, 10*time.Second)
	postIntact(t, c, "/v1/chat/completions", bigChat(1, 1000)) // warm up connections
	for _, tc := range []struct {
		name    string
		path    string
		sent    int
		chunked bool // without a length, only the missing last chunk tells the body is cut
	}{
		{"matcher still reading", "/v1/chat/completions", 20 << 10, false},
		{"beyond max_body", "/v1/chat/completions", 300 << 10, false},
		{"policy alone", "/plain/v1/chat/completions", 300 << 10, false},
		{"chunked, matcher still reading", "/v1/chat/completions", 20 << 10, true},
		{"chunked, beyond max_body", "/v1/chat/completions", 300 << 10, true},
		{"chunked, policy alone still reading", "/plain/v1/chat/completions", 20 << 10, true},
		// A body that fails while the client is still there (a malformed chunk): the server
		// does not cancel the request as it does when the client leaves, so only kvroute's
		// body stands between the cut body and the upstream.
		{"chunked, malformed chunk, matcher still reading", "/v1/chat/completions", 20 << 10, true},
		{"chunked, malformed chunk, policy alone", "/plain/v1/chat/completions", 20 << 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			completeBefore := ps[0].complete.Load() + ps[1].complete.Load()
			body := bigChat(7, 1<<20)
			conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", httpPort))
			if err != nil {
				t.Fatal(err)
			}
			framing := fmt.Sprintf("Content-Length: %d", len(body))
			if tc.chunked {
				framing = "Transfer-Encoding: chunked"
			}
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: localhost:%d\r\nContent-Type: application/json\r\n%s\r\n\r\n", tc.path, httpPort, framing)
			if tc.chunked {
				fmt.Fprintf(conn, "%x\r\n", tc.sent)
			}
			if _, err := conn.Write(body[:tc.sent]); err != nil {
				t.Fatal(err)
			}
			if tc.chunked {
				fmt.Fprint(conn, "\r\n") // a whole chunk, but never the last one
			}
			if strings.Contains(tc.name, "malformed") {
				fmt.Fprint(conn, "not a chunk size\r\n")
			}
			time.Sleep(200 * time.Millisecond) // let it reach the matcher, the policy and the upstream
			conn.Close()
			waitIdle(t)
			waitUntil(t, 5*time.Second, func() bool { return ps[0].active.Load()+ps[1].active.Load() == 0 }, "upstream handlers to end")
			if n := ps[0].complete.Load() + ps[1].complete.Load(); n != completeBefore {
				t.Errorf("an upstream received a cut body as a complete one")
			}
			postIntact(t, c, tc.path, bigChat(8, 100<<10)) // and the next request is fine
		})
	}
}

// retryConfig puts a refusing address first in joule order (cheapest), so the first pick of
// every cold request is the upstream that refuses the connection.
func retryConfig(dead, live, extra string) string {
	policy := fmt.Sprintf(`upstream %s {
					energy_per_token 10uJ
				}
				upstream %s {
					energy_per_token 500uJ
				}`, dead, live)
	return relConfig([]string{dead, live}, "max_body 64KiB", policy, extra)
}

// After the first upstream refuses the connection, the retry reaches the second with the whole
// body: below and above max_body, with the matcher and with the policy alone (4 MiB default).
func TestReliabilityRetryAfterRefusedConnection(t *testing.T) {
	leakCheck(t)
	live := newProbe(t, "live")
	c := newClient(t, 30*time.Second)
	for _, tc := range []struct {
		name string
		path string
		size int
	}{
		{"matcher below max_body", "/v1/chat/completions", 8 << 10},
		{"matcher above max_body", "/v1/chat/completions", 300 << 10},
		{"policy alone below max_body", "/plain/v1/chat/completions", 8 << 10},
		{"policy alone above max_body", "/plain/v1/chat/completions", 5 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A fresh refusing address per case: Caddy remembers a host's failures across configs.
			dead := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			startCaddy(t, retryConfig(dead, live.addr(), `lb_try_duration 5s
			lb_try_interval 10ms
			lb_retries 3
			lb_retry_match {
				method POST
			}
			fail_duration 1s`))
			body := bigChat(tc.size, tc.size)
			rep := postIntact(t, c, tc.path, body)
			if rep.Upstream != "live" {
				t.Fatalf("served by %q", rep.Upstream)
			}
			st := currentState()
			if d := st.upstream(dead).decisions[pathFallback].Load(); d != 1 {
				t.Errorf("the refusing upstream was picked %d times, want 1 (the first try)", d)
			}
			waitIdle(t)
		})
	}
}

// earlyFailer is an upstream that reads the first KiB of a request body, answers 500 and
// closes the connection, as a server that gives up on a request part-way does.
func earlyFailer(t *testing.T) (addr string, hits *atomic.Int64) {
	hits = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.ReadFull(r.Body, make([]byte, 1024))
		w.Header().Set("Connection", "close")
		http.Error(w, "gave up", http.StatusInternalServerError)
	}))
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return srv.Listener.Addr().String(), hits
}

// A 5xx after the first upstream read part of the body, without request_buffers: the retry
// sends the whole body when the plugin holds all of it (at most max_body), and otherwise
// fails cleanly (502, the second upstream sees a broken body), as Caddy's own unbuffered
// bodies do; never a body with its start cut off presented as complete. Chunked and sized,
// with the matcher and with the policy alone.
func TestReliabilityRetry5xxWithoutRequestBuffers(t *testing.T) {
	leakCheck(t)
	c := newClient(t, 60*time.Second)
	live := newProbe(t, "live")
	for _, tc := range []struct {
		name    string
		path    string
		size    int
		chunked bool
	}{
		{"matcher below max_body sized", "/v1/chat/completions", 3 << 20, false},
		{"matcher below max_body chunked", "/v1/chat/completions", 3 << 20, true},
		{"matcher above max_body sized", "/v1/chat/completions", 5 << 20, false},
		{"matcher above max_body chunked", "/v1/chat/completions", 5 << 20, true},
		{"policy alone below max_body sized", "/plain/v1/chat/completions", 3 << 20, false},
		{"policy alone below max_body chunked", "/plain/v1/chat/completions", 3 << 20, true},
		{"policy alone above max_body sized", "/plain/v1/chat/completions", 5 << 20, false},
		{"policy alone above max_body chunked", "/plain/v1/chat/completions", 5 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			early, hits := earlyFailer(t)
			// The failing upstream is the cheaper one: a cold prompt goes to it first.
			policy := fmt.Sprintf(`upstream %s {
					energy_per_token 10uJ
				}
				upstream %s {
					energy_per_token 500uJ
				}`, early, live.addr())
			startCaddy(t, relConfig([]string{early, live.addr()}, "max_body 4MiB", policy, `lb_retries 2
			lb_retry_match {
				expression {rp.status_code} >= 500
			}
			lb_retry_match {
				method POST
			}`))
			body := bigChat(int(time.Now().UnixNano()), tc.size)
			var rd io.Reader = bytes.NewReader(body)
			if tc.chunked {
				rd = io.MultiReader(rd) // no length: the client sends it chunked
			}
			complete, reached := live.complete.Load(), live.hits.Load()
			rep, code, err := post(t, c, tc.path, rd)
			if err != nil {
				t.Fatalf("POST: %v", err)
			}
			if hits.Load() == 0 {
				t.Fatal("the failing upstream was not tried first: the test proved nothing")
			}
			if len(body) <= 4<<20 {
				if code != http.StatusOK {
					t.Fatalf("status %d; the retry of a body held whole must succeed", code)
				}
				checkIntact(t, rep, body)
				return
			}
			// Above max_body: the retry cannot resend what went to the first upstream.
			if code != http.StatusBadGateway {
				t.Errorf("status %d (%s, %d bytes), want 502", code, rep.Upstream, rep.Len)
			}
			if n := live.complete.Load() - complete; n != 0 {
				t.Errorf("the second upstream received %d bodies as complete (%d bytes), want 0", n, rep.Len)
			}
			if live.hits.Load() == reached {
				t.Logf("the retry failed before reaching the second upstream")
			}
			waitIdle(t)
		})
	}
}

// Without passive health checks (no fail_duration) Caddy does not mark the refusing upstream
// down, so each retry asks the policy again with the same pool: the retry must still reach the
// upstream that did not refuse.
func TestReliabilityRetryWithoutPassiveHealth(t *testing.T) {
	leakCheck(t)
	live := newProbe(t, "live")
	dead := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startCaddy(t, retryConfig(dead, live.addr(), "lb_retries 3\n\t\t\tlb_try_interval 10ms"))
	c := newClient(t, 30*time.Second)
	// Cold requests land on either upstream at first; send enough that some start on the dead one.
	for i := 0; i < 8; i++ {
		body := bigChat(3+i, 4<<10)
		rep, code, err := post(t, c, "/v1/chat/completions", bytes.NewReader(body))
		if err != nil || code != http.StatusOK {
			u := currentState().upstream(dead)
			t.Fatalf("request %d: status %d, %v: the refusing upstream got %d fallback + %d prefix_hit decisions; a retry must avoid the upstream the request just failed on",
				i, code, err, u.decisions[pathFallback].Load(), u.decisions[pathPrefixHit].Load())
		}
		checkIntact(t, rep, body)
	}
	if n := currentState().upstream(dead).decisions[pathFallback].Load(); n == 0 {
		t.Errorf("no request tried the refusing upstream first: the test proved nothing")
	}
}

// sseLatencies sends a streaming request and returns, per event, how long after the upstream
// wrote it the client read it. The upstream writes each event once the client has read the one
// before (path's ?ack=), so that an event held back by the proxy stalls the stream.
func sseLatencies(t *testing.T, c *http.Client, path string, events int) []time.Duration {
	t.Helper()
	acked := new(atomic.Int64)
	id := t.Name()
	streamAcks.Store(id, acked)
	defer streamAcks.Delete(id)
	path += "&ack=" + url.QueryEscape(id)
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"stream to me"}]}`
	req, _ := http.NewRequest(http.MethodPost, baseURL+path, strings.NewReader(body))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var lat []time.Duration
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		now := time.Now()
		line = strings.TrimPrefix(strings.TrimSpace(line), "data: ")
		if strings.HasPrefix(line, "{") {
			var ev struct{ T int64 }
			if json.Unmarshal([]byte(line), &ev) == nil {
				lat = append(lat, now.Sub(time.Unix(0, ev.T)))
				acked.Add(1)
			}
		}
		if err != nil {
			break
		}
	}
	if len(lat) != events {
		t.Fatalf("got %d events, want %d", len(lat), events)
	}
	return lat
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// SSE responses pass through event by event: over 100 events 5 ms apart, the upstream writes
// each only once the client has read the one before, and never waits (streamStall) for it.
// Caddy 2.11 flushes at once any text/event-stream response, and any response without
// Content-Length (NDJSON streams too), so `flush_interval -1` is not needed; the test runs with
// and without it. (It measured the median write-to-read latency against 5 ms before, which a
// loaded machine exceeds without any buffering.)
func TestReliabilitySSEFlushedPerEvent(t *testing.T) {
	leakCheck(t)
	ps := newProbes(t, 2)
	c := newClient(t, 30*time.Second)
	for _, tc := range []struct{ name, extra, path string }{
		{"sse auto", "", "/v1/chat/completions?events=100"},
		{"sse flush_interval -1", "flush_interval -1", "/v1/chat/completions?events=100"},
		{"sse policy alone", "", "/plain/v1/chat/completions?events=100"},
		{"ndjson auto", "", "/v1/chat/completions?events=100&ct=ndjson"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			startCaddy(t, relConfig(ps.addrs(), "", "", tc.extra))
			stalls := ps[0].stalls.Load() + ps[1].stalls.Load()
			lat := sseLatencies(t, c, tc.path, 100)
			med, p90 := percentile(lat, 0.5), percentile(lat, 0.9)
			t.Logf("%s: write→read latency median %v, p90 %v, max %v", tc.name, med, p90, percentile(lat, 1))
			if ps[0].stalls.Load()+ps[1].stalls.Load() > stalls {
				t.Errorf("the client had not read an event %v after it was written: events are buffered", streamStall)
			}
		})
	}
	waitIdle(t)
}

// withoutActiveHealth is extra (a reverse_proxy block's lines) without its active health
// checks' options.
func withoutActiveHealth(extra string) string {
	var kept []string
	for _, line := range strings.Split(extra, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "health_") {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "\n")
}

// faultConfig has active and passive health checks and retries that can resend a body
// (request_buffers: Caddy resends a POST body after the upstream has read it only if it
// buffered the body whole) and that retry 5xx answers.
const faultExtra = `health_uri /health
			health_interval 100ms
			health_fails 1
			health_passes 1
			fail_duration 1s
			max_fails 1
			unhealthy_status 5xx
			lb_try_duration 5s
			lb_try_interval 20ms
			lb_retries 5
			lb_retry_match {
				method POST
			}
			lb_retry_match {
				expression {rp.status_code} >= 500
			}
			request_buffers 1MiB
			transport http {
				response_header_timeout 1s
			}`

// An upstream killed mid-stream: the stream it was serving is cut (its bytes are gone), but
// nothing else is lost: the next requests, those of its session included, are retried or
// placed elsewhere and served whole; its session bindings are dropped as they are used; the
// router's in-flight counts return to zero; and when it comes back on its address it gets
// requests again.
func TestFaultUpstreamKilledMidStream(t *testing.T) {
	leakCheck(t)
	ps := newProbes(t, 3)
	startCaddy(t, relConfig(ps.addrs(), "", "", faultExtra))
	c := newClient(t, 30*time.Second)
	rep := postIntact(t, c, "/v1/chat/completions", bigChat(1, 2000), "X-Session-ID", "victim")
	victim := ps.byName(rep.Upstream)
	for i := 0; i < 6; i++ { // more sessions on the victim
		postIntact(t, c, "/v1/chat/completions", bigChat(10+i, 2000), "X-Session-ID", fmt.Sprint("s", i))
	}
	before := getStatus(t).Upstreams[victim.addr()]

	// A stream on the victim; kill it after a few events.
	req, _ := http.NewRequest(http.MethodPost, baseURL+"/v1/chat/completions?events=200&gap=10", bytes.NewReader(bigChat(2, 1000)))
	req.Header.Set("X-Session-ID", "victim")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for n := 0; n < 5; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended early: %v", err)
		}
		if strings.HasPrefix(line, "data: {") {
			n++
		}
	}
	victim.kill()
	rest, err := io.ReadAll(br)
	resp.Body.Close()
	if err == nil && strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("the stream completed although its upstream was killed")
	}

	// Nothing else is lost: every request is served whole, none by the dead upstream.
	for i := 0; i < 20; i++ {
		sid := []string{"victim", "s0", "s1", "s2", "s3", "s4", "s5"}[i%7]
		rep := postIntact(t, c, "/v1/chat/completions", bigChat(100+i, 3000), "X-Session-ID", sid)
		if rep.Upstream == victim.name {
			t.Fatalf("request %d served by the killed upstream", i)
		}
	}
	waitIdle(t)
	after := getStatus(t).Upstreams[victim.addr()]
	t.Logf("killed upstream in GET /kvroute/: before %d sessions, %d tree chars; after %d sessions, %d tree chars, %d in flight",
		before.Sessions, before.TreeChars, after.Sessions, after.TreeChars, after.InFlight)
	if after.Sessions != 0 || after.InFlight != 0 {
		t.Errorf("the killed upstream still has %d sessions bound and %d requests in flight", after.Sessions, after.InFlight)
	}

	// It comes back on the same address: health checks see it, it takes requests again.
	back := newProbeAt(t, victim.name, victim.addr())
	i := 0
	waitUntil(t, 10*time.Second, func() bool {
		i++
		rep := postIntact(t, c, "/v1/chat/completions", bigChat(1000+i, 500))
		return rep.Upstream == back.name
	}, "the upstream back on its address to take requests")
	waitIdle(t)
}

// An upstream that hangs (health endpoint fine, requests never answered): the request waits
// response_header_timeout, then is retried elsewhere with its whole body; passive health marks
// the upstream down, so the next requests do not wait. When it answers again, it takes
// requests again.
func TestFaultUpstreamHangs(t *testing.T) {
	leakCheck(t)
	ps := newProbes(t, 3)
	// Passive health holds the upstream out for fail_duration after the timeout: 5 s rather
	// than 1 s, so that the ten requests below fit in it on a loaded machine too.
	startCaddy(t, relConfig(ps.addrs(), "", "", strings.Replace(faultExtra, "fail_duration 1s", "fail_duration 5s", 1)))
	c := newClient(t, 30*time.Second)
	rep := postIntact(t, c, "/v1/chat/completions", bigChat(1, 2000), "X-Session-ID", "stuck")
	hung := ps.byName(rep.Upstream)
	hung.setMode("hang")

	start := time.Now()
	body := bigChat(2, 20<<10)
	rep = postIntact(t, c, "/v1/chat/completions", body, "X-Session-ID", "stuck")
	if rep.Upstream == hung.name {
		t.Fatalf("served by the hanging upstream")
	}
	t.Logf("first request to the hanging upstream retried on %s after %v", rep.Upstream, time.Since(start))
	start = time.Now()
	hits := hung.hits.Load()
	for i := 0; i < 10; i++ {
		if rep := postIntact(t, c, "/v1/chat/completions", bigChat(10+i, 2000), "X-Session-ID", "stuck"); rep.Upstream == hung.name {
			t.Fatalf("served by the hanging upstream")
		}
	}
	// A request sent to the hanging upstream would have waited on it (and been counted there)
	// before its retry; how long the ten took depends on the machine's load.
	if n := hung.hits.Load() - hits; n > 0 {
		t.Errorf("%d of 10 requests after the upstream was marked down went to it first (they took %v)", n, time.Since(start))
	}
	hung.setMode("")
	waitUntil(t, 20*time.Second, func() bool {
		return postIntact(t, c, "/v1/chat/completions", bigChat(int(time.Now().UnixNano()), 500)).Upstream == hung.name
	}, "the upstream to take requests again")
	waitIdle(t)
}

// An upstream answering 500 (its health endpoint too): each 500 is retried on another
// upstream with the whole body (lb_retry_match on {rp.status_code}), so no client sees it;
// passive and active health checks take it out; it comes back when it heals.
func TestFaultUpstreamAnswers500(t *testing.T) {
	leakCheck(t)
	ps := newProbes(t, 3)
	startCaddy(t, relConfig(ps.addrs(), "", "", faultExtra))
	c := newClient(t, 30*time.Second)
	rep := postIntact(t, c, "/v1/chat/completions", bigChat(1, 2000), "X-Session-ID", "s500")
	bad := ps.byName(rep.Upstream)
	bad.setMode("500")
	for i := 0; i < 30; i++ {
		for _, path := range []string{"/v1/chat/completions", "/plain/v1/chat/completions"} {
			body := bigChat(10+i, 4000)
			if rep := postIntact(t, c, path, body, "X-Session-ID", "s500"); rep.Upstream == bad.name {
				t.Fatalf("answered by the failing upstream")
			}
		}
	}
	t.Logf("the failing upstream received %d requests (all retried elsewhere)", bad.hits.Load())
	bad.setMode("")
	waitUntil(t, 10*time.Second, func() bool {
		return postIntact(t, c, "/v1/chat/completions", bigChat(int(time.Now().UnixNano()), 500)).Upstream == bad.name
	}, "the healed upstream to take requests again")
	waitIdle(t)
}

// An upstream removed by POST /load and re-added: traffic during the reloads loses nothing;
// while it is out, GET /kvroute/ shows no prefixes or sessions for it (the old config's last
// decisions, made after its cleanup forgot the upstream, went there and learned it again: 1
// run in 10 timed out waiting, and a CI run); back in, it takes requests again.
//
// Two things of Caddy's (v2.11.9, with any lb_policy) are kept out of the test. Its active
// health checker counts the check that its config's stop cancels as a failure ("stopping
// apps"): with health_fails 1 the old config's upstreams are down for its last requests, which
// got a 503 "no upstreams available" at once (its lb_try loop ends with the config); so this
// config has no active health checks, passive ones only. And a request that got no HTTP
// answer at all is sent again: Caddy listens with SO_REUSEPORT, one socket per config, and
// Linux resets the connections still queued on the old config's socket as it closes
// ("connect: connection reset by peer", or a reset or EOF before any answer; unless
// net.ipv4.tcp_migrate_req is 1). Go's client resends such a request by itself on a
// kept-alive connection (the Idempotency-Key below), not on a new one.
func TestFaultUpstreamRemovedAndReadded(t *testing.T) {
	leakCheck(t)
	ps := newProbes(t, 3)
	extra := withoutActiveHealth(faultExtra)
	full := relConfig(ps.addrs(), "", "", extra)
	startCaddy(t, full)
	c := newClient(t, 30*time.Second)
	for i := 0; i < 12; i++ {
		postIntact(t, c, "/v1/chat/completions", bigChat(i, 2000), "X-Session-ID", fmt.Sprint("s", i))
	}
	gone := ps[2]
	if st := getStatus(t).Upstreams[gone.addr()]; st.TreeChars == 0 || st.Sessions == 0 {
		t.Fatalf("setup: %s holds nothing: %+v", gone.name, st)
	}

	// Requests sent once the smaller config is in force are marked late: the old config may
	// still route the requests it was reading when the reload came (Caddy stops its servers
	// within the grace period, after POST /load returned), but no late request may reach the
	// removed upstream.
	var stop, late atomic.Bool
	var served, failed, lateServed, resent atomic.Int64
	var wg sync.WaitGroup
	// A failed wait below ends the test with the clients still sending: stop them before it
	// completes (their Errorf after it would panic and end the whole run).
	t.Cleanup(func() { stop.Store(true); wg.Wait() })
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				body := bigChat(10000*w+i, 3000)
				// Half with a session (bound before the reload), half cold. The Idempotency-Key
				// lets Go's client resend a request whose kept-alive connection the old config's
				// server closed at that very moment (a race of every HTTP/1.1 reload).
				hdr := []string{"Idempotency-Key", fmt.Sprint(w, "-", i)}
				if i%2 == 0 {
					hdr = append(hdr, "X-Session-ID", fmt.Sprint("s", i%12))
				}
				marked := late.Load()
				if marked {
					hdr = append(hdr, "X-Test-Late", "1")
				}
				rep, code, err := post(t, c, "/v1/chat/completions", bytes.NewReader(body), hdr...)
				for try := 0; err != nil && try < 3; try++ { // no HTTP answer: sent again (above)
					resent.Add(1)
					rep, code, err = post(t, c, "/v1/chat/completions", bytes.NewReader(body), hdr...)
				}
				sum := sha256.Sum256(body)
				if err != nil || code != http.StatusOK || rep.SHA256 != hex.EncodeToString(sum[:]) {
					failed.Add(1)
					t.Errorf("during reloads: status %d, %v, upstream %q", code, err, rep.Upstream)
					continue
				}
				served.Add(1)
				if marked {
					lateServed.Add(1)
				}
			}
		}(w)
	}
	less := relConfig(ps[:2].addrs(), "", "", extra)
	time.Sleep(200 * time.Millisecond)
	load(t, less)
	late.Store(true)
	// GET /kvroute/ shows no prefixes or sessions for it, and 40 late requests are served
	// (the four clients would have sent it some, were it routed to).
	waitUntil(t, 20*time.Second, func() bool {
		st := getStatus(t).Upstreams[gone.addr()]
		return st.TreeChars == 0 && st.Sessions == 0 && lateServed.Load() >= 40
	}, "GET /kvroute/ to show no prefixes or sessions for "+gone.name+", and 40 requests sent after the reload to be served")
	if n := gone.late.Load(); n != 0 {
		t.Errorf("the removed upstream received %d requests sent after the reload", n)
	}
	waitUntil(t, 20*time.Second, func() bool { return gone.active.Load() == 0 }, "the old config's requests on "+gone.name+" to end")
	hitsOut := gone.hits.Load()
	load(t, full)
	deadline := time.Now().Add(10 * time.Second)
	for gone.hits.Load() == hitsOut && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	if gone.hits.Load() == hitsOut {
		t.Errorf("the re-added upstream took no request in 10 s")
	}
	t.Logf("during two reloads: %d requests served whole, %d failed, %d sent again after no HTTP answer", served.Load(), failed.Load(), resent.Load())
	waitIdle(t)
}

// 64 concurrent clients through the in-process Caddy (run under -race in CI): multi-turn
// conversations, half keyed by header and half by the session cookie, bodies below and above
// max_body. Every body arrives whole, every conversation stays on one upstream, the router's
// counts return to zero and no goroutine is left behind.
func TestConcurrency64Clients(t *testing.T) {
	leakCheck(t)
	ps := newProbes(t, 4)
	// 64 closed-loop clients on 4 upstreams move loads by more than the default band (abs 4),
	// which would move a session for a request (by design: TestSessionOutOfBandIsSkippedAndKept);
	// this test is about integrity and stickiness under concurrency, so the band is wide.
	startCaddy(t, relConfig(ps.addrs(), "max_body 64KiB", "session_cookie kvroute_session "+testSecret+"\n\t\t\t\tbalance_abs_threshold 64", ""))
	const clients, turns = 64, 6
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = clients
	t.Cleanup(tr.CloseIdleConnections)
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			jar, _ := cookiejar.New(nil)
			c := &http.Client{Timeout: 60 * time.Second, Transport: tr, Jar: jar}
			var hdr []string
			if i%2 == 0 {
				hdr = []string{"X-Session-ID", fmt.Sprint("client-", i)}
			}
			msgs := []string{fmt.Sprintf("system prompt of client %d. %s", i, strings.Repeat("be helpful. ", 30))}
			home := ""
			for turn := 0; turn < turns; turn++ {
				msgs = append(msgs, fmt.Sprintf("turn %d of client %d", turn, i))
				if turn == 3 && i%8 == 1 {
					msgs = append(msgs, strings.Repeat("a long pasted document. ", 4000)) // > max_body
				}
				body := []byte(chatBody("m", msgs...))
				rep, code, err := post(t, c, "/v1/chat/completions", bytes.NewReader(body), hdr...)
				if err != nil || code != http.StatusOK {
					t.Errorf("client %d turn %d: status %d, %v", i, turn, code, err)
					return
				}
				checkIntact(t, rep, body)
				if home == "" {
					home = rep.Upstream
				} else if rep.Upstream != home {
					t.Errorf("client %d turn %d served by %s, its first turn by %s", i, turn, rep.Upstream, home)
				}
				msgs = append(msgs, "an answer "+strings.Repeat("yes. ", 20))
			}
		}(i)
	}
	wg.Wait()
	waitIdle(t)
	if st := getStatus(t); st.Sessions != clients {
		t.Errorf("%d sessions bound, want %d (one per client)", st.Sessions, clients)
	}
}

// The admin endpoints exist on Caddy's admin listener only: on the site listener /kvroute/ is
// an ordinary path (here proxied to an upstream), and POST /kvroute/reset or DELETE
// /kvroute/sessions/{id} there changes nothing.
func TestSecurityAdminNotOnSiteListener(t *testing.T) {
	leakCheck(t)
	ps := newProbes(t, 2)
	startCaddy(t, relConfig(ps.addrs(), "", "", ""))
	c := newClient(t, 10*time.Second)
	postIntact(t, c, "/v1/chat/completions", bigChat(1, 2000), "X-Session-ID", "keep-me")
	before := getStatus(t)
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
		for _, path := range []string{"/kvroute/", "/kvroute/reset", "/kvroute/sessions/keep-me"} {
			req, _ := http.NewRequest(m, baseURL+path, nil)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var rep probeReply
			if json.Unmarshal(raw, &rep) != nil || rep.Upstream == "" {
				t.Errorf("%s %s on the site listener: %d %.200s, want the upstream's answer", m, path, resp.StatusCode, raw)
			}
			if strings.Contains(string(raw), `"stored_chars"`) || strings.Contains(string(raw), `"reset"`) || strings.Contains(string(raw), `"forgotten"`) {
				t.Errorf("%s %s on the site listener reached the admin API: %.200s", m, path, raw)
			}
		}
	}
	after := getStatus(t)
	if after.Sessions != before.Sessions || after.StoredChars != before.StoredChars {
		t.Errorf("requests to /kvroute/ on the site listener changed the state: sessions %d → %d, chars %d → %d",
			before.Sessions, after.Sessions, before.StoredChars, after.StoredChars)
	}
	waitIdle(t)
}

// The routing text (up to 4 times max_body) is let go of once an attempt is placed, so that a
// long stream does not hold it; a retry derives it again from the held body and records it
// under the retry's upstream, and every attempt is handed the whole body. (Select alone, no
// Caddy: the request's vars are what Caddy would give.)
func TestSelectLetsGoOfRoutingTextUntilRetry(t *testing.T) {
	p := newPolicy(t, nil)
	pool := newPool("a:1", "b:1")
	prompt := strings.Repeat("a long prompt that takes memory ", 300)
	r, cancel := chatRequest("m", prompt)
	defer cancel()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, "m", prompt)
	want := routingText("m", prompt)
	for attempt := range 3 {
		up := p.Select(pool, r, nil)
		if up == nil {
			t.Fatalf("attempt %d: no upstream", attempt)
		}
		lr, _ := caddyhttp.GetVar(r.Context(), varRequest).(*llmRequest)
		if lr == nil || lr.Text != "" || lr.Runes != utf8.RuneCountInString(want) {
			t.Fatalf("attempt %d: after Select the request holds %d bytes of routing text (runes %d)", attempt, len(lr.Text), lr.Runes)
		}
		if n := p.state.forest.Get("m").MatchTenant(want, up.Dial); n != lr.Runes {
			t.Errorf("attempt %d: %s holds %d of the %d runes of the routing text", attempt, up.Dial, n, lr.Runes)
		}
		got, err := io.ReadAll(io.LimitReader(r.Body, int64(len(body)/2+attempt)))
		if err != nil || string(got) != body[:len(got)] {
			t.Fatalf("attempt %d: the body starts with %.40q, %v", attempt, got, err)
		}
		r.Body.Close() // the attempt's transport, after a partial read
		pool = newPool(otherThan(pool, up.Dial), up.Dial)
	}
	// And a last attempt reads the whole body.
	p.Select(pool, r, nil)
	if got, err := io.ReadAll(r.Body); err != nil || string(got) != body {
		t.Errorf("last attempt: %d bytes of %d, %v", len(got), len(body), err)
	}
}

// A request whose body is not an LLM request (NDJSON, gRPC, event streams) or asks to be
// forwarded as it arrives (Incremental: ?1) is never waited on: the upstream gets its first
// bytes while the client is still sending, through the matcher and through the policy alone.
func TestReliabilityStreamingBodyNotWaitedOn(t *testing.T) {
	leakCheck(t)
	got := make(chan string, 64) // first lines, as the upstream reads them
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		line, _ := bufio.NewReader(r.Body).ReadString('\n')
		select {
		case got <- line:
		default:
		}
		io.Copy(io.Discard, r.Body)
	}))
	t.Cleanup(up.Close)
	startCaddy(t, relConfig([]string{up.Listener.Addr().String()}, "max_body 64KiB", "", ""))
	c := newClient(t, 30*time.Second)
	for _, path := range []string{"/v1/chat/completions", "/plain/v1/chat/completions"} {
		for _, h := range [][2]string{
			{"Content-Type", "application/x-ndjson"},
			{"Content-Type", "application/grpc"},
			{"Content-Type", "text/event-stream"},
			{"Incremental", "?1"},
		} {
			t.Run(path+" "+h[0]+": "+h[1], func(t *testing.T) {
				pr, pw := io.Pipe()
				req, _ := http.NewRequest(http.MethodPost, baseURL+path, pr)
				req.Header.Set(h[0], h[1])
				done := make(chan error, 1)
				go func() {
					resp, err := c.Do(req)
					if err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
					done <- err
				}()
				// A marker of this case: a line that an earlier case's body delivered late
				// must not count.
				marker := fmt.Sprintf("first line of stream %s %s %s", path, h[0], h[1])
				fmt.Fprintf(pw, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":%q}]}\n", marker)
				deadline := time.After(5 * time.Second)
			wait:
				for {
					select {
					case line := <-got:
						if strings.Contains(line, marker) {
							break wait
						}
					case <-deadline:
						t.Errorf("the upstream got nothing in 5 s: the body was held back while the client was still sending")
						break wait
					}
				}
				pw.Close()
				if err := <-done; err != nil {
					t.Errorf("request: %v", err)
				}
			})
		}
	}
}
