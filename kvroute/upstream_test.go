package kvroute

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// backend is a real HTTP upstream on loopback. It answers every request with its name and the
// SHA-256 and length of the body it received, so tests can check routing and body integrity.
type backend struct {
	name   string
	srv    *httptest.Server
	hits   atomic.Int64
	active atomic.Int64 // requests being handled now

	mu        sync.Mutex
	hang      chan struct{} // when set, requests wait until it is closed
	unhealthy bool
	failed    int // health checks answered unhealthy
}

type backendReply struct {
	Upstream string `json:"upstream"`
	SHA256   string `json:"sha256"`
	Len      int64  `json:"len"`
}

func newBackend(t testing.TB, name string) *backend {
	t.Helper()
	b := &backend{name: name}
	b.srv = httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *backend) addr() string { return strings.TrimPrefix(b.srv.URL, "http://") }

func (b *backend) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" || r.URL.Path == "/v1/models" {
		http.NotFound(w, r) // no telemetry; the policy's scrapes are not requests
		return
	}
	if r.URL.Path == "/health" {
		b.mu.Lock()
		bad := b.unhealthy
		if bad {
			b.failed++
		}
		b.mu.Unlock()
		if bad {
			http.Error(w, "unhealthy", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
		return
	}
	b.hits.Add(1)
	b.active.Add(1)
	defer b.active.Add(-1)
	h := sha256.New()
	n, err := io.Copy(h, r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	b.mu.Lock()
	hang := b.hang
	b.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(backendReply{Upstream: b.name, SHA256: hex.EncodeToString(h.Sum(nil)), Len: n})
}

func (b *backend) setHang(on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if on && b.hang == nil {
		b.hang = make(chan struct{})
	}
	if !on && b.hang != nil {
		close(b.hang)
		b.hang = nil
	}
}

func (b *backend) setUnhealthy(bad bool) {
	b.mu.Lock()
	b.unhealthy = bad
	b.mu.Unlock()
}

// failedChecks is how many health checks b answered unhealthy.
func (b *backend) failedChecks() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failed
}

var idempotencyKeys atomic.Int64

// fleet is a set of backends with lookups by name and address.
type fleet []*backend

func newFleet(t testing.TB, n int) fleet {
	if tt, ok := t.(*testing.T); ok {
		leakCheck(tt) // first, so that its check runs after the backends have closed
	}
	f := make(fleet, n)
	for i := range f {
		f[i] = newBackend(t, fmt.Sprintf("u%d", i+1))
	}
	return f
}

func (f fleet) addrs() string {
	a := make([]string, len(f))
	for i, b := range f {
		a[i] = b.addr()
	}
	return strings.Join(a, " ")
}

func (f fleet) byName(name string) *backend {
	for _, b := range f {
		if b.name == name {
			return b
		}
	}
	return nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// send posts body to url and decodes the backend's reply.
func send(t testing.TB, client *http.Client, url, body string, headers ...string) (backendReply, *http.Response) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	// Lets Go's client resend the POST when a config reload closes a kept-alive connection.
	req.Header.Set("Idempotency-Key", fmt.Sprint(idempotencyKeys.Add(1)))
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var rep backendReply
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &rep); err != nil {
			t.Fatalf("POST %s: bad reply %q: %v", url, raw, err)
		}
	}
	return rep, resp
}

func chatBody(model string, msgs ...string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, `{"model":%q,"messages":[`, model)
	for i, m := range msgs {
		role := "user"
		if i == 0 {
			role = "system"
		} else if i%2 == 0 {
			role = "assistant"
		}
		if i > 0 {
			sb.WriteByte(',')
		}
		mb, _ := json.Marshal(m)
		fmt.Fprintf(&sb, `{"role":%q,"content":%s}`, role, mb)
	}
	sb.WriteString(`],"max_tokens":16}`)
	return sb.String()
}

// startCaddy loads config (Caddyfile) into the in-process Caddy of caddytest.
func startCaddy(t *testing.T, config string) *caddytest.Tester {
	t.Helper()
	checkPorts(t, config)
	captureCaddyLog(t)
	leakCheck(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(config, "caddyfile")
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() {
		if s := currentState(); s != nil {
			s.reset()
		}
	})
	s := currentState()
	if s == nil {
		t.Fatal("the config did not reach this process's Caddy: is another Caddy serving " + adminAddr + "?")
	}
	s.reset()
	return tester
}

// waitUntil polls cond every 10 ms until it holds. d is how long that may take on an idle
// machine; it waits at least 10 s (as waitFor does), since under -race on a loaded 2-core
// machine a request or a background pass can take seconds, and only a failing test waits that
// long. A bound that a test asserts is checked apart.
func waitUntil(t testing.TB, d time.Duration, cond func() bool, what string) {
	t.Helper()
	d = max(d, 10*time.Second)
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s", d, what)
}
