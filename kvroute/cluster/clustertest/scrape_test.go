package clustertest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// engine is a loopback vLLM stand-in: /metrics serves a real vLLM capture (with 3 running and
// 2 waiting requests) and counts the GETs; anything else answers a chat completion.
type engine struct {
	srv     *httptest.Server
	scrapes atomic.Int64
}

func newEngine(t *testing.T) *engine {
	t.Helper()
	page, err := os.ReadFile("../../telemetry/testdata/vllm_v1_qwen3.txt")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(page), `vllm:num_requests_running{model_name="Qwen/Qwen3-0.6B"} 0.0`, `vllm:num_requests_running{model_name="Qwen/Qwen3-0.6B"} 3.0`, 1)
	text = strings.Replace(text, `vllm:num_requests_waiting{model_name="Qwen/Qwen3-0.6B"} 0.0`, `vllm:num_requests_waiting{model_name="Qwen/Qwen3-0.6B"} 2.0`, 1)
	if text == string(page) {
		t.Fatal("the capture's running and waiting lines changed: fix newEngine")
	}
	e := &engine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			http.NotFound(w, r) // the readers' model list: not a request
			return
		}
		if r.URL.Path == "/metrics" {
			e.scrapes.Add(1)
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = w.Write([]byte(text))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[{"message":{"role":"assistant","content":"ok"}}]}`))
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

// engineStatus is the part of GET /kvroute/ that shows one upstream's telemetry.
type engineStatus struct {
	Upstreams map[string]struct {
		Telemetry *struct {
			Source  string `json:"source"`
			Outcome string `json:"outcome"`
			Figures struct {
				Running          int64 `json:"running"`
				Waiting          int64 `json:"waiting"`
				KVCapacityTokens int64 `json:"kv_capacity_tokens"`
			} `json:"figures"`
			AgeSeconds float64 `json:"age_seconds"`
		} `json:"telemetry"`
	} `json:"upstreams"`
}

// figures returns r's telemetry figures of the upstream at addr, and their source.
func (r *replica) figures(addr string) (running, waiting, capacity int64, source string, age float64) {
	r.t.Helper()
	resp, err := http.Get("http://" + r.admin + "/kvroute/")
	if err != nil {
		r.t.Fatalf("%s: GET /kvroute/: %v", r.name, err)
	}
	defer resp.Body.Close()
	var st engineStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		r.t.Fatalf("%s: GET /kvroute/: %v", r.name, err)
	}
	for a, u := range st.Upstreams {
		if a == addr && u.Telemetry != nil {
			f := u.Telemetry.Figures
			return f.Running, f.Waiting, f.KVCapacityTokens, u.Telemetry.Source, u.Telemetry.AgeSeconds
		}
	}
	return -1, -1, -1, "", -1
}

const scrapeInterval = 500 * time.Millisecond

// TestScrapesShared: three replicas in a cluster read one engine about once per interval in
// all, not three times, and every replica shows the engine's figures; when the replica that
// reads it stops, another takes over within a few intervals; with NATS down, each reads it
// itself.
func TestScrapesShared(t *testing.T) {
	ns := startNATS(t, nil)
	e := newEngine(t)
	extra := fmt.Sprintf("\n\t\t\ttelemetry {\n\t\t\t\tinterval %v\n\t\t\t\ttimeout 400ms\n\t\t\t}", scrapeInterval)
	var rs []*replica
	for i := range 3 {
		rs = append(rs, startReplicaWith(t, fmt.Sprintf("r%d", i), e.addr(), ns.url(), replicaSecret, extra))
	}
	// Telemetry and the cluster start with the config; each replica routes one request too.
	for _, r := range rs {
		if _, code := r.chat(t, []string{"system prompt", "hello"}); code != http.StatusOK {
			t.Fatalf("%s: status %d", r.name, code)
		}
	}
	for _, r := range rs {
		eventually(t, 10*time.Second, r.name+" hears its two peers", func() bool { return r.livePeers() == 2 })
	}
	// Let ownership settle (every node knows every peer), then count over 10 intervals.
	time.Sleep(3 * scrapeInterval)
	const intervals = 10
	before := e.scrapes.Load()
	time.Sleep(intervals * scrapeInterval)
	perInterval := float64(e.scrapes.Load()-before) / intervals
	t.Logf("3 replicas: %.2f scrapes of the engine per interval", perInterval)
	if perInterval > 1.5 {
		t.Errorf("3 replicas read the engine %.2f times per interval, want about once (at most 1.5)", perInterval)
	}
	sources := map[string]int{}
	for _, r := range rs {
		run, wait, kv, src, age := r.figures(e.addr())
		t.Logf("%s: running %d waiting %d kv_capacity %d source %q age %.2fs", r.name, run, wait, kv, src, age)
		if run != 3 || wait != 2 || kv != 2340*16 {
			t.Errorf("%s shows running %d waiting %d kv_capacity %d, want 3, 2, %d", r.name, run, wait, kv, 2340*16)
		}
		if age < 0 || age > 3*scrapeInterval.Seconds() {
			t.Errorf("%s: reading %.2fs old, want fresh", r.name, age)
		}
		sources[src]++
	}
	if sources["own"] != 1 || sources["peer"] != 2 {
		t.Errorf("sources of the readings %v, want one own and two from a peer", sources)
	}

	// Kill the owner: the others read the engine themselves once its reading is stale, and
	// after the load TTL (2s) one of them owns it and reads it for both.
	var owner *replica
	var rest []*replica
	for _, r := range rs {
		if _, _, _, src, _ := r.figures(e.addr()); src == "own" && owner == nil {
			owner = r
		} else {
			rest = append(rest, r)
		}
	}
	if owner == nil {
		t.Fatal("no replica reads the engine itself")
	}
	// Killed: no goodbye reaches the peers.
	if err := owner.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = owner.cmd.Wait()
	killed := time.Now()
	eventually(t, 10*time.Second, "another replica reads the engine itself", func() bool {
		n := 0
		for _, r := range rest {
			if _, _, _, src, age := r.figures(e.addr()); src == "own" && age >= 0 && age < 2*scrapeInterval.Seconds() {
				n++
			}
		}
		return n >= 1
	})
	took := time.Since(killed)
	t.Logf("another replica read the engine itself %v after the owner was killed", took.Round(10*time.Millisecond))
	// The peers notice the silence after load_ttl (2s); the new owner reads within an
	// interval after that, and the others read for themselves as soon as the dead owner's
	// reading is 1.5 intervals old.
	if took > 4*time.Second {
		t.Errorf("the takeover took %v, want at most load_ttl plus a few intervals", took)
	}
	time.Sleep(5 * scrapeInterval) // the dead owner's load TTL, and settling
	before = e.scrapes.Load()
	time.Sleep(intervals * scrapeInterval)
	perInterval = float64(e.scrapes.Load()-before) / intervals
	t.Logf("2 replicas after the owner stopped: %.2f scrapes per interval", perInterval)
	if perInterval > 1.5 || perInterval < 0.5 {
		t.Errorf("2 replicas read the engine %.2f times per interval, want about once", perInterval)
	}
	for _, r := range rest {
		if run, wait, kv, _, age := r.figures(e.addr()); run != 3 || wait != 2 || kv != 2340*16 || age < 0 || age > 3*scrapeInterval.Seconds() {
			t.Errorf("%s after the owner stopped: running %d waiting %d kv_capacity %d age %.2fs", r.name, run, wait, kv, age)
		}
	}

	// NATS down: no peer's reading arrives, and each replica reads the engine itself.
	ns.stop()
	time.Sleep(3 * scrapeInterval)
	before = e.scrapes.Load()
	time.Sleep(intervals * scrapeInterval)
	perInterval = float64(e.scrapes.Load()-before) / intervals
	t.Logf("2 replicas with NATS down: %.2f scrapes per interval", perInterval)
	if perInterval < 1.5 {
		t.Errorf("with NATS down 2 replicas read the engine %.2f times per interval, want about twice", perInterval)
	}
	for _, r := range rest {
		if run, _, _, src, age := r.figures(e.addr()); run != 3 || src != "own" || age < 0 || age > 3*scrapeInterval.Seconds() {
			t.Errorf("%s with NATS down: running %d source %q age %.2fs, want its own fresh reading", r.name, run, src, age)
		}
	}
}
