package peers

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
)

// maxBody is how many body bytes are read for routing, as kvroute's own default: a larger body
// routes on the text of its first maxBody bytes and still reaches the upstream whole.
const maxBody = 4 << 20

// varRequest is the http.vars key of the request's parse. kvroute's matcher caches its own parse
// under another key with an unexported type; the peers do not depend on it.
const varRequest = "kvroute.peers.request"

// request is what the peer policies know about one HTTP request. It is made by the first Select
// and kept in the request's vars, because Select runs again on every retry.
type request struct {
	llmreq.Request

	mu    sync.Mutex
	picks []*pick // one per policy instance that routed this request
}

// pick is the upstream one policy counts a request against while it is in flight.
type pick struct {
	owner *inflight
	dial  string
	done  bool // the request ended; a late retry is not counted
}

// requestFor returns the parse of r's body, reading and parsing it only the first time. The
// body is restored byte for byte.
func requestFor(r *http.Request) *request {
	if v, ok := caddyhttp.GetVar(r.Context(), varRequest).(*request); ok && v != nil {
		return v
	}
	req := new(request)
	if r.Body != nil && r.Body != http.NoBody {
		prefix, truncated, err := llmreq.ReadBody(r, maxBody)
		if len(prefix) > 0 {
			req.Request = llmreq.Parse(prefix, truncated || err != nil)
		}
		r.Body = &closeIfRead{ReadCloser: r.Body}
	}
	if _, ok := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any); ok {
		caddyhttp.SetVar(r.Context(), varRequest, req)
	}
	return req
}

// closeIfRead passes Close on only once the body has been read from. Go's transport closes a
// request body when the dial fails; the retry that follows must still find the whole body.
type closeIfRead struct {
	io.ReadCloser
	read atomic.Bool
}

func (b *closeIfRead) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.ReadCloser.Read(p)
}

func (b *closeIfRead) Close() error {
	if !b.read.Load() {
		return nil
	}
	return b.ReadCloser.Close()
}

// inflight counts, per upstream dial address, the requests a policy sent there that have not
// ended yet. Upstreams are keyed by address, not pointer: dynamic upstreams are new values on
// every request.
type inflight struct {
	mu sync.Mutex
	n  map[string]int
}

func newInflight() *inflight { return &inflight{n: make(map[string]int)} }

// load returns the requests in flight on dial.
func (f *inflight) load(dial string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n[dial]
}

// loads returns the in-flight count of every upstream of pool, in pool order.
func (f *inflight) loads(pool reverseproxy.UpstreamPool) []int {
	out := make([]int, len(pool))
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, u := range pool {
		out[i] = f.n[u.Dial]
	}
	return out
}

func (f *inflight) add(dial string, d int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v := f.n[dial] + d; v > 0 {
		f.n[dial] = v
	} else {
		delete(f.n, dial) // the map holds only upstreams with requests in flight
	}
}

// acquire counts req as in flight on u until r's context ends. When this policy already routed
// req (a retry), the request moves from the previous upstream to u.
func (f *inflight) acquire(r *http.Request, req *request, u *reverseproxy.Upstream) *reverseproxy.Upstream {
	req.mu.Lock()
	defer req.mu.Unlock()
	for _, p := range req.picks {
		if p.owner == f {
			if !p.done {
				f.add(p.dial, -1)
				f.add(u.Dial, 1)
			}
			p.dial = u.Dial
			return u
		}
	}
	p := &pick{owner: f, dial: u.Dial}
	req.picks = append(req.picks, p)
	f.add(u.Dial, 1)
	context.AfterFunc(r.Context(), func() {
		req.mu.Lock()
		defer req.mu.Unlock()
		if !p.done {
			p.done = true
			f.add(p.dial, -1)
		}
	})
	return u
}
