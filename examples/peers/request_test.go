package peers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// testPool returns n upstreams a:1, b:1, ...
func testPool(n int) reverseproxy.UpstreamPool {
	pool := make(reverseproxy.UpstreamPool, n)
	for i := range pool {
		pool[i] = &reverseproxy.Upstream{Dial: fmt.Sprintf("%c:1", 'a'+i), Host: new(reverseproxy.Host)}
	}
	return pool
}

// completion returns an OpenAI completions body.
func completion(model, prompt string) string {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 16})
	return string(b)
}

// newRequest returns a request as Caddy hands it to a policy (with the vars map) and the
// function that ends it.
func newRequest(body string) (*http.Request, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{})
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
	r.Body = &serverBody{r: strings.NewReader(body)}
	r.ContentLength = int64(len(body))
	return r.WithContext(ctx), cancel
}

// serverBody fails reads after Close, as the body of a server request does.
type serverBody struct {
	r      *strings.Reader
	closed bool
}

func (b *serverBody) Read(p []byte) (int, error) {
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.r.Read(p)
}

func (b *serverBody) Close() error {
	b.closed = true
	return nil
}

// route sends one request through s and ends it at once.
func route(t *testing.T, s reverseproxy.Selector, f *inflight, pool reverseproxy.UpstreamPool, body string) string {
	t.Helper()
	r, end := newRequest(body)
	u := s.Select(pool, r, nil)
	end()
	waitIdle(t, f)
	if u == nil {
		return ""
	}
	return u.Dial
}

// hold sends one request through s and keeps it in flight until the test ends.
func hold(t *testing.T, s reverseproxy.Selector, pool reverseproxy.UpstreamPool, body string) string {
	t.Helper()
	r, end := newRequest(body)
	t.Cleanup(end)
	u := s.Select(pool, r, nil)
	if u == nil {
		t.Fatal("no upstream")
	}
	return u.Dial
}

// waitIdle waits until every request counted by f has been released (the release runs in the
// goroutine of context.AfterFunc).
func waitIdle(t *testing.T, f *inflight) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.mu.Lock()
		n := len(f.n)
		f.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests still counted in flight: %v", f.n)
		}
		time.Sleep(time.Millisecond)
	}
}

func totalInflight(f *inflight) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, v := range f.n {
		n += v
	}
	return n
}

// policies returns each peer policy, provisioned with its defaults, and its in-flight counter.
func policies(t *testing.T) map[string]struct {
	s reverseproxy.Selector
	f *inflight
} {
	t.Helper()
	sg := new(SGLangCacheAware)
	ph := new(PrefixHash)
	if err := sg.setup(); err != nil {
		t.Fatal(err)
	}
	if err := ph.setup(); err != nil {
		t.Fatal(err)
	}
	return map[string]struct {
		s reverseproxy.Selector
		f *inflight
	}{
		"sglang_cache_aware": {sg, sg.load},
		"prefix_hash":        {ph, ph.load},
	}
}

// A retry calls Select again on the same request after Go's transport closed the body of the
// failed dial: the body is read and parsed once, the retry still sends every byte, and the
// request is counted once, on the upstream of the last attempt.
func TestRetryKeepsBodyAndCount(t *testing.T) {
	bodies := map[string]string{
		"small":    completion("m", "You are a helpful assistant. Hello!"),
		"large":    completion("m", strings.Repeat("0123456789abcdef", (maxBody+4096)/16)),
		"not json": "\x00\x01binary\xff" + strings.Repeat("z", 100),
		"empty":    "",
	}
	for pname, p := range policies(t) {
		for bname, body := range bodies {
			t.Run(pname+"/"+bname, func(t *testing.T) {
				pool := testPool(3)
				r, end := newRequest(body)
				first := p.s.Select(pool, r, nil)
				if first == nil {
					t.Fatal("no upstream")
				}
				restored := r.Body
				if err := r.Body.Close(); err != nil { // the transport, on a dial failure
					t.Fatal(err)
				}
				second := p.s.Select(pool, r, nil)
				if second == nil {
					t.Fatal("no upstream on retry")
				}
				if r.Body != restored {
					t.Error("the retry read the body again")
				}
				if n := totalInflight(p.f); n != 1 {
					t.Errorf("in flight after a retry: %d, want 1", n)
				}
				got, err := io.ReadAll(r.Body)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, []byte(body)) {
					t.Errorf("body changed: got %d bytes, want %d", len(got), len(body))
				}
				if err := r.Body.Close(); err != nil {
					t.Error(err)
				}
				end()
				waitIdle(t, p.f)
			})
		}
	}
}

// Outside a Caddy server (no vars map), nothing is cached but the body still survives.
func TestWithoutVars(t *testing.T) {
	body := completion("m", "hello")
	for name, p := range policies(t) {
		t.Run(name, func(t *testing.T) {
			ctx, end := context.WithCancel(context.Background())
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body)).WithContext(ctx)
			for range 2 {
				if p.s.Select(testPool(2), r, nil) == nil {
					t.Fatal("no upstream")
				}
			}
			got, _ := io.ReadAll(r.Body)
			if string(got) != body {
				t.Errorf("body = %q, want %q", got, body)
			}
			end()
			waitIdle(t, p.f)
		})
	}
}

func TestNoAvailableUpstream(t *testing.T) {
	sg, ph := new(SGLangCacheAware), new(PrefixHash)
	sg.available = func(*reverseproxy.Upstream) bool { return false }
	ph.available = sg.available
	if err := sg.setup(); err != nil {
		t.Fatal(err)
	}
	if err := ph.setup(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []reverseproxy.Selector{sg, ph} {
		r, end := newRequest(completion("m", "hi"))
		if u := s.Select(testPool(2), r, nil); u != nil {
			t.Errorf("%T picked %s with no upstream available", s, u.Dial)
		}
		if u := s.Select(nil, r, nil); u != nil {
			t.Errorf("%T picked %s from an empty pool", s, u.Dial)
		}
		end()
	}
}
