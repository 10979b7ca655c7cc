package replay

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// fleet is in-process workers behind a round-robin reverse proxy, as Caddy would be.
type fleet struct {
	workers []*llmsim.Server
	proxy   *httptest.Server
	next    atomic.Uint64
}

func startFleet(t *testing.T, n int, cfg llmsim.Config) *fleet {
	t.Helper()
	f := &fleet{}
	var targets []*url.URL
	for i := range n {
		c := cfg
		c.Name = fmt.Sprintf("w%d", i)
		s := llmsim.New(c)
		ts := httptest.NewServer(s)
		t.Cleanup(ts.Close)
		u, _ := url.Parse(ts.URL)
		targets = append(targets, u)
		f.workers = append(f.workers, s)
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(targets[(f.next.Add(1)-1)%uint64(len(targets))])
		},
		FlushInterval: -1,
	}
	f.proxy = httptest.NewServer(bufferBody(rp))
	t.Cleanup(f.proxy.Close)
	return f
}

// bufferBody reads the request body before proxying, as a router that looks at the prompt
// does. httputil.ReverseProxy streaming the body while it flushes an SSE response races: once
// the response headers are out, the server may close the request body under the transport,
// which then drops the backend connection mid-response ("unexpected EOF" at the client).
func bufferBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		r.ContentLength = int64(len(b))
		next.ServeHTTP(w, r)
	})
}

func (f *fleet) reset() {
	for _, w := range f.workers {
		w.Reset()
	}
	f.next.Store(0)
}

// fast simulates no time, so that tests run at the speed of the loopback.
var fast = llmsim.Config{StepFixed: -1, PrefillPerToken: -1, PerSeq: -1}

var smallChat = workload.ChatConfig{Conversations: 8, SystemPrompts: 2, Turns: 4, Seed: 3}

func TestOneWorkerReachesReference(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		stream   bool
	}{
		{"no eviction", 1 << 16, true},
		{"eviction", 120, true},
		{"eviction, not streamed", 120, false},
	}
	w := workload.ChatWorkload(smallChat)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// 120 blocks hold the largest request (111 blocks, prompt and output).
			cfg := fast
			cfg.CapacityBlocks = tt.capacity
			f := startFleet(t, 1, cfg)
			res, err := Run(context.Background(), w, Options{
				BaseURL: f.proxy.URL, Concurrency: 1, FleetBlocks: tt.capacity, NoStream: !tt.stream,
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Errors != 0 || res.Requests != w.Calls() {
				t.Fatalf("%d requests, %d errors: %v", res.Requests, res.Errors, res.ErrorSamples)
			}
			// One worker replaying the same prompts in the same order is the reference cache
			// without eviction. With eviction its KV cache holds the running request's blocks
			// beside the cached ones (the engine's, as vLLM's) where the reference LRU of the
			// same size holds cached blocks only: it hits no more than the reference, and
			// something.
			if res.HitRatio == 0 || (tt.capacity > 1000 && res.HitRatio != res.ReferenceHitRatio) || res.HitRatio > res.ReferenceHitRatio {
				t.Errorf("hit ratio %v, reference %v: want equal without eviction, positive and at most the reference with", res.HitRatio, res.ReferenceHitRatio)
			}
			if tt.capacity > 1000 && res.ReferenceHitRatio != res.InfiniteHitRatio {
				t.Errorf("reference %v != infinite %v without eviction", res.ReferenceHitRatio, res.InfiniteHitRatio)
			}
			if tt.capacity < 1000 && res.ReferenceHitRatio >= res.InfiniteHitRatio {
				t.Errorf("reference %v not below infinite %v with eviction", res.ReferenceHitRatio, res.InfiniteHitRatio)
			}
			var want int64
			for _, s := range w.Sessions {
				for _, c := range s.Calls {
					want += int64(llmsim.Tokens(SimText(c)))
				}
			}
			if res.PromptTokens != want {
				t.Errorf("prompt tokens %d, want %d", res.PromptTokens, want)
			}
			if res.PerWorker["w0"] != w.Calls() || res.Imbalance != 1 {
				t.Errorf("per worker %v, imbalance %v", res.PerWorker, res.Imbalance)
			}
		})
	}
}

func TestRoundRobinFleet(t *testing.T) {
	w := workload.ChatWorkload(smallChat)
	f := startFleet(t, 3, fast)
	res, err := Run(context.Background(), w, Options{BaseURL: f.proxy.URL, Concurrency: 4, FleetBlocks: 3 * llmsim.DefaultCapacityBlocks, Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 || res.Requests != 32 || len(res.PerWorker) != 3 {
		t.Fatalf("%+v", res)
	}
	for name, n := range res.PerWorker {
		if n < 10 || n > 11 {
			t.Errorf("worker %s served %d of 32", name, n)
		}
	}
	// 4 workers announced, 3 used: the mean is 32/4 = 8.
	if res.Imbalance < 11.0/8 || res.Imbalance > 11.0/8+0.01 {
		t.Errorf("imbalance %v, want %v", res.Imbalance, 11.0/8)
	}
	// Round robin scatters conversations: it hits less than one shared cache.
	if res.HitRatio >= res.ReferenceHitRatio || res.ReferenceHitRatio > res.InfiniteHitRatio {
		t.Errorf("hit %v, reference %v, infinite %v", res.HitRatio, res.ReferenceHitRatio, res.InfiniteHitRatio)
	}
	if res.TTFTP50Ms <= 0 || res.TTFTP99Ms < res.TTFTP50Ms || res.LatencyP99Ms < res.TTFTP50Ms || res.WallSeconds <= 0 {
		t.Errorf("timings %+v", res)
	}
}

func TestReproducible(t *testing.T) {
	w := workload.ChatWorkload(smallChat)
	cfg := fast
	cfg.CapacityBlocks = 150
	f := startFleet(t, 2, cfg)
	opts := Options{BaseURL: f.proxy.URL, Concurrency: 1, FleetBlocks: 300}
	var results []*Result
	for range 2 {
		f.reset()
		res, err := Run(context.Background(), w, opts)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
	}
	a, b := results[0], results[1]
	if a.CachedTokens != b.CachedTokens || a.PromptTokens != b.PromptTokens ||
		a.ReferenceHitRatio != b.ReferenceHitRatio || fmt.Sprint(a.PerWorker) != fmt.Sprint(b.PerWorker) {
		t.Errorf("runs differ:\n%+v\n%+v", a, b)
	}
	// With one client, the offline estimate sees the very same order.
	est := Estimate(w, opts)
	if est.ReferenceHitRatio != a.ReferenceHitRatio || est.InfiniteHitRatio != a.InfiniteHitRatio || est.PromptTokens != a.PromptTokens {
		t.Errorf("estimate %+v\nrun %+v", est, a)
	}
}

func TestErrorsAreCounted(t *testing.T) {
	var n atomic.Int64
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) % 3 {
		case 0:
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
		case 1:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[]}\n\n") // cut before [DONE]
		default:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
		}
	}))
	defer flaky.Close()
	w := workload.ChatWorkload(workload.ChatConfig{Conversations: 3, Turns: 3})
	res, err := Run(context.Background(), w, Options{BaseURL: flaky.URL, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 9 || res.Errors != 6 || res.PromptTokens != 30 || res.PerWorker["unknown"] != 3 {
		t.Errorf("%+v", res)
	}
	if len(res.ErrorSamples) != 2 || !strings.Contains(strings.Join(res.ErrorSamples, "|"), "HTTP 503") {
		t.Errorf("error samples %q", res.ErrorSamples)
	}

	flaky.Close() // transport errors
	res, _ = Run(context.Background(), w.Limit(1), Options{BaseURL: flaky.URL})
	if res.Errors != 3 {
		t.Errorf("%d errors against a closed server, want 3", res.Errors)
	}
}

func TestOpenLoop(t *testing.T) {
	reqs := []workload.Request{
		{Timestamp: 0, InputLength: 600, OutputLength: 2, HashIDs: []int{1, 2}},
		{Timestamp: 200 * time.Millisecond, InputLength: 600, OutputLength: 2, HashIDs: []int{1, 3}},
		{Timestamp: 400 * time.Millisecond, InputLength: 1100, OutputLength: 2, HashIDs: []int{1, 2, 4}},
	}
	w := workload.MooncakeWorkload(reqs, workload.MooncakeConfig{})
	f := startFleet(t, 1, fast)
	res, err := Run(context.Background(), w, Options{BaseURL: f.proxy.URL, OpenLoop: true, TimeScale: 0.5, KeepRecords: true, FleetBlocks: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if res.Mode != "open" || res.Errors != 0 || len(res.Records) != 3 {
		t.Fatalf("%+v", res)
	}
	for i, rec := range res.Records {
		want := float64(i) * 100
		if rec.StartMs < want || rec.StartMs > want+50 {
			t.Errorf("request %d sent at %.1fms, want %vms", i, rec.StartMs, want)
		}
	}
	// Request 1 shares block 1 (512 tokens) with request 0; request 2 shares request 0's
	// whole 600-token prompt, of which 37 full 16-token blocks.
	if got := []int{res.Records[1].CachedTokens, res.Records[2].CachedTokens}; got[0] != 512 || got[1] != 592 {
		t.Errorf("cached %v, want [512 592]", got)
	}
	if res.HitRatio != res.ReferenceHitRatio {
		t.Errorf("hit %v, reference %v", res.HitRatio, res.ReferenceHitRatio)
	}
}

func TestInterrupted(t *testing.T) {
	cfg := llmsim.Config{PrefillPerToken: -1, StepFixed: 20 * time.Millisecond, PerSeq: -1}
	f := startFleet(t, 1, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	res, err := Run(ctx, workload.ChatWorkload(smallChat), Options{BaseURL: f.proxy.URL, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Interrupted || res.Requests >= 32 {
		t.Errorf("interrupted %v after %d requests", res.Interrupted, res.Requests)
	}
	if _, err := Run(ctx, workload.Workload{}, Options{}); err == nil {
		t.Error("no error without a base URL")
	}
}
