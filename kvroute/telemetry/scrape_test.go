package telemetry

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fast is a Scraper configuration for tests: scrapes every 10ms.
var fast = Options{Interval: 10 * time.Millisecond, Timeout: 200 * time.Millisecond, MaxBackoff: 40 * time.Millisecond}

// waitFor polls cond until it holds, for up to 10 s: a state is reached in milliseconds, but
// under -race on a loaded machine a scrape can take seconds, and only a failing test waits.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func serve(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts
}

func newScraper(t *testing.T, opts Options) *Scraper {
	t.Helper()
	s := NewScraper(opts)
	t.Cleanup(s.Stop)
	return s
}

func page(t *testing.T, file string) http.HandlerFunc {
	b := fixture(t, file)
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.Write(b)
	}
}

func TestScraperPublishesReadings(t *testing.T) {
	ts := serve(t, page(t, "vllm_v1_qwen3.txt"))
	var mu sync.Mutex
	var firstPrev *Snapshot
	calls := 0
	opts := fast
	opts.Observe = func(prev, cur *Snapshot) {
		mu.Lock()
		defer mu.Unlock()
		if calls == 0 {
			firstPrev = prev
		}
		calls++
	}
	s := newScraper(t, opts)
	if err := s.Add(Target{Key: "w1", URL: ts.URL + "/metrics"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "three readings", func() bool { snap := s.Snapshot("w1"); return snap != nil && snap.Counts[OutcomeOK] >= 3 })
	snap := s.Snapshot("w1")
	if snap.Outcome != OutcomeOK || snap.Failures != 0 || snap.Reading.Engine != EngineVLLM ||
		snap.Reading.KVCapacityTokens != 16*2340 || snap.LastError != "" {
		t.Errorf("snapshot %+v", snap)
	}
	if age := snap.Age(time.Now()); age < 0 || age > time.Second || !snap.Fresh(time.Now(), time.Second) {
		t.Errorf("age %v", age)
	}
	mu.Lock()
	if firstPrev != nil || calls < 3 {
		t.Errorf("Observe: first prev %v, %d calls", firstPrev, calls)
	}
	mu.Unlock()
	if all := s.Snapshots(); len(all) != 1 || all[0].Key != "w1" {
		t.Errorf("Snapshots %v", all)
	}
	// The admin API's JSON names outcomes and fields.
	js, err := json.Marshal(snap)
	if err != nil || !strings.Contains(string(js), `"outcome":"ok"`) || !strings.Contains(string(js), `"counts":{"ok":`) ||
		!strings.Contains(string(js), `"known":"running,waiting,kv_usage,kv_capacity"`) {
		t.Errorf("JSON %s %v", js, err)
	}
}

// TestScraperBadEndpoints runs every kind of bad endpoint after a good reading: each is
// classified, counted, keeps the last reading, and never panics.
func TestScraperBadEndpoints(t *testing.T) {
	good := fixture(t, "vllm_v1_qwen3.txt")
	refused := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}()
	tests := []struct {
		name    string
		bad     http.HandlerFunc
		url     string // instead of a server
		outcome Outcome
	}{
		{name: "404", bad: func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }, outcome: OutcomeNotFound},
		// llama.cpp's server without --metrics: its "endpoint disabled" answer.
		{name: "501", bad: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotImplemented)
			_, _ = w.Write([]byte(`{"error":{"code":501,"message":"This server does not support metrics endpoint. Start it with ` + "`--metrics`" + `","type":"not_supported_error"}}`))
		}, outcome: OutcomeNotFound},
		{name: "500", bad: func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) }, outcome: OutcomeStatus},
		{name: "slow", bad: func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}, outcome: OutcomeStale},
		{name: "trickle", bad: func(w http.ResponseWriter, r *http.Request) {
			w.Write(good[:100])
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}, outcome: OutcomeStale},
		{name: "50MB", bad: func(w http.ResponseWriter, r *http.Request) {
			line := []byte(strings.Repeat("# filler filler filler filler\n", 1<<10))
			for range 50 << 20 / len(line) {
				if _, err := w.Write(line); err != nil {
					return
				}
			}
		}, outcome: OutcomeTooLarge},
		{name: "announced 50MB", bad: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "52428800")
			w.Write(good)
		}, outcome: OutcomeTooLarge},
		{name: "garbled", bad: func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("vllm:num_requests_running{{{ 1\n"))
		}, outcome: OutcomeGarbled},
		{name: "NaN and negative", bad: func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("vllm:num_requests_running NaN\nvllm:num_requests_waiting -1\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"0\"} 1\n"))
		}, outcome: OutcomeInvalid},
		{name: "HTML", bad: func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("<html>welcome</html>"))
		}, outcome: OutcomeNoEngine},
		{name: "broken", bad: func(w http.ResponseWriter, r *http.Request) {
			conn, buf, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n# partial")
			buf.Flush()
			conn.Close()
		}, outcome: OutcomeBroken},
		{name: "refused", url: "http://" + refused + "/metrics", outcome: OutcomeRefused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var bad atomic.Bool
			ts := serve(t, func(w http.ResponseWriter, r *http.Request) {
				if bad.Load() {
					tt.bad(w, r)
					return
				}
				w.Write(good)
			})
			url := ts.URL + "/metrics"
			s := newScraper(t, fast)
			if err := s.Add(Target{Key: "u", URL: url}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "a first reading", func() bool { snap := s.Snapshot("u"); return snap != nil && snap.Outcome == OutcomeOK })
			if tt.url != "" {
				// Same key, new URL: a restarted loop with a fresh history; no reading yet.
				if err := s.Add(Target{Key: "u", URL: tt.url}); err != nil {
					t.Fatal(err)
				}
			} else {
				bad.Store(true)
			}
			waitFor(t, tt.outcome.String(), func() bool {
				snap := s.Snapshot("u")
				return snap != nil && snap.Counts[tt.outcome] >= 2
			})
			snap := s.Snapshot("u")
			if snap.Outcome != tt.outcome || snap.Failures < 2 || snap.LastError == "" {
				t.Errorf("snapshot %+v", snap)
			}
			if tt.url == "" && (snap.Reading.Engine != EngineVLLM || snap.Reading.KVCapacityTokens != 16*2340) {
				t.Errorf("the last good reading was lost: %+v", snap.Reading)
			}
			if tt.outcome == OutcomeInvalid && snap.Ignored < 3 {
				t.Errorf("ignored samples %d, want at least 3", snap.Ignored)
			}
			// A page over maxKeptBuffer does not stay in memory for the next scrape.
			// (The buffer belongs to the loop: it is looked at once Stop has ended the loop.)
			tg := (*s.targets.Load())["u"]
			s.Stop()
			if c := cap(tg.buf); c > maxKeptBuffer {
				t.Errorf("kept a buffer of %d bytes", c)
			}
		})
	}
}

// The gaps between failed scrapes double up to MaxBackoff: each is checked against its lower
// bound (a loaded machine only makes gaps longer), not a count of scrapes in a fixed time.
func TestScraperBacksOff(t *testing.T) {
	var (
		mu   sync.Mutex
		hits []time.Time
	)
	ts := serve(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits = append(hits, time.Now())
		mu.Unlock()
		http.NotFound(w, r)
	})
	opts := Options{Interval: 5 * time.Millisecond, MaxBackoff: 80 * time.Millisecond, Timeout: 100 * time.Millisecond}
	s := newScraper(t, opts)
	s.Add(Target{Key: "u", URL: ts.URL + "/metrics"})
	const failures = 6
	waitFor(t, fmt.Sprintf("%d failed scrapes", failures), func() bool { mu.Lock(); defer mu.Unlock(); return len(hits) >= failures })
	s.Stop()
	mu.Lock()
	defer mu.Unlock()
	// Without backoff every gap would be about 5 ms. With it, after k failures: 5 ms << k,
	// at most 80 ms, less 10% of jitter.
	for k := 1; k < failures; k++ {
		want := time.Duration(0.9 * float64(min(opts.Interval<<k, opts.MaxBackoff)))
		if gap := hits[k].Sub(hits[k-1]); gap < want {
			t.Errorf("%v between failure %d and the next scrape, want at least %v", gap, k, want)
		}
	}
	if w := s.wait(0); w < 4*time.Millisecond || w > 6*time.Millisecond {
		t.Errorf("wait(0) = %v", w)
	}
	if w := s.wait(30); w < 72*time.Millisecond || w > 88*time.Millisecond {
		t.Errorf("wait(30) = %v", w)
	}
}

func TestScraperTargets(t *testing.T) {
	ts := serve(t, page(t, "tgi_docs.txt"))
	s := newScraper(t, Options{Interval: time.Hour, MaxTargets: 2})
	for _, bad := range []string{"", "ftp://x/metrics", "http:///metrics", "://"} {
		if err := s.Add(Target{Key: "x", URL: bad}); err == nil {
			t.Errorf("Add(%q) accepted", bad)
		}
	}
	if err := s.Add(Target{Key: "a", URL: ts.URL + "/metrics"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(Target{Key: "a", URL: ts.URL + "/metrics"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(Target{Key: "b", URL: ts.URL + "/metrics"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(Target{Key: "c", URL: ts.URL + "/metrics"}); !errors.Is(err, ErrTooManyTargets) {
		t.Errorf("third target: %v", err)
	}
	if got := strings.Join(s.Keys(), ","); got != "a,b" {
		t.Errorf("keys %s", got)
	}
	s.Remove("a")
	s.Remove("nope")
	if got := strings.Join(s.Keys(), ","); got != "b" || s.Snapshot("a") != nil {
		t.Errorf("after Remove: keys %s", got)
	}
	if err := s.Add(Target{Key: "c", URL: ts.URL + "/metrics"}); err != nil {
		t.Errorf("room after Remove: %v", err)
	}
	s.Stop()
	if err := s.Add(Target{Key: "d", URL: ts.URL + "/metrics"}); err == nil {
		t.Error("Add after Stop accepted")
	}
	if len(s.Keys()) != 0 {
		t.Errorf("keys after Stop: %v", s.Keys())
	}
}

// TestScraperStopLeavesNoGoroutine adds targets of every kind, slow ones scraping when Stop
// comes, and checks that no goroutine is left: neither loops nor idle connections.
func TestScraperStopLeavesNoGoroutine(t *testing.T) {
	good := serve(t, page(t, "sglang_docs.txt"))
	slow := serve(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	base := runtime.NumGoroutine()
	s := NewScraper(Options{Interval: 5 * time.Millisecond, Timeout: time.Minute})
	for i, url := range []string{good.URL, slow.URL, good.URL, slow.URL, "http://127.0.0.1:1"} {
		s.Add(Target{Key: string(rune('a' + i)), URL: url + "/metrics"})
	}
	waitFor(t, "readings", func() bool { snap := s.Snapshot("a"); return snap != nil && snap.Counts[OutcomeOK] > 2 })
	start := time.Now()
	s.Stop()
	// Waiting for the scrapes in flight would take their minute-long timeout; 30 s leaves room
	// for a loaded machine and still tells.
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("Stop took %v with scrapes in flight", d)
	}
	waitFor(t, "goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
}

// TestSnapshotNeverWaits reads snapshots while every target's scrape hangs.
func TestSnapshotNeverWaits(t *testing.T) {
	var slow atomic.Bool
	var hanging atomic.Int64
	ts := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if slow.Load() {
			hanging.Add(1)
			<-r.Context().Done()
			return
		}
		w.Write(fixture(t, "tgi_docs.txt"))
	})
	s := newScraper(t, Options{Interval: time.Millisecond, Timeout: time.Minute})
	s.Add(Target{Key: "u", URL: ts.URL + "/metrics"})
	waitFor(t, "a reading", func() bool { return s.Snapshot("u") != nil })
	slow.Store(true)
	waitFor(t, "a hanging scrape", func() bool { return hanging.Load() > 0 })
	start := time.Now()
	for range 100000 {
		if snap := s.Snapshot("u"); snap == nil || snap.Reading.Running != 4 {
			t.Fatal("lost the reading")
		}
	}
	// Waiting on the scrape would take its minute-long timeout; 100000 atomic loads take
	// milliseconds, a second or so under -race on a loaded machine; 30 s still tells.
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("100000 snapshots took %v", d)
	}
}

func TestScraperReadsLlamaCppProps(t *testing.T) {
	var props atomic.Int64
	metrics := fixture(t, "llamacpp_server.txt")
	propsJSON := fixture(t, "llamacpp_props.json")
	ts := serve(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			w.Write(metrics)
		case "/props":
			props.Add(1)
			w.Write(propsJSON)
		default:
			http.NotFound(w, r)
		}
	})
	s := newScraper(t, fast)
	s.Add(Target{Key: "l", URL: ts.URL + "/metrics"})
	waitFor(t, "readings", func() bool { snap := s.Snapshot("l"); return snap != nil && snap.Counts[OutcomeOK] >= 5 })
	r := s.Snapshot("l").Reading
	if r.Engine != EngineLlamaCpp || r.KVCapacityTokens != 8192 || !r.Known.Has(HasKVCapacity) {
		t.Errorf("%+v", r)
	}
	if n := props.Load(); n != 1 {
		t.Errorf("/props read %d times in 5 scrapes, want once", n)
	}
}

// TestScraperDoesNotFollowProxyEnv: the endpoint is the upstream's own, whatever HTTP_PROXY says.
func TestScraperDoesNotFollowProxyEnv(t *testing.T) {
	var proxied atomic.Bool
	proxy := serve(t, func(w http.ResponseWriter, r *http.Request) { proxied.Store(true) })
	t.Setenv("HTTP_PROXY", proxy.URL)
	ts := serve(t, page(t, "tgi_docs.txt"))
	s := newScraper(t, fast)
	s.Add(Target{Key: "u", URL: ts.URL + "/metrics"})
	waitFor(t, "a reading", func() bool { snap := s.Snapshot("u"); return snap != nil && snap.Outcome == OutcomeOK })
	if proxied.Load() {
		t.Error("scraped through HTTP_PROXY")
	}
}

func TestProbe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// Probe sends nothing: the connection yields EOF.
			if n, _ := bufio.NewReader(c).Read(make([]byte, 1)); n != 0 {
				t.Error("probe sent bytes")
			}
			c.Close()
		}
	}()
	if err := Probe(context.Background(), "tcp", addr, time.Second); err != nil {
		t.Errorf("up: %v", err)
	}
	ln.Close()
	if err := Probe(context.Background(), "tcp", addr, time.Second); err == nil || !strings.Contains(err.Error(), addr) {
		t.Errorf("down: %v", err)
	}
}

func TestMetricsURL(t *testing.T) {
	tests := []struct{ scheme, dial, path, want string }{
		{"http", "10.0.0.1:8000", "", "http://10.0.0.1:8000/metrics"},
		{"https", "[::1]:8443", "/stats/prometheus", "https://[::1]:8443/stats/prometheus"},
		{"http", "gpu-1.internal:30000", "metrics", "http://gpu-1.internal:30000/metrics"},
	}
	for _, tt := range tests {
		if got := MetricsURL(tt.scheme, tt.dial, tt.path); got != tt.want {
			t.Errorf("MetricsURL(%q, %q, %q) = %q, want %q", tt.scheme, tt.dial, tt.path, got, tt.want)
		}
	}
}

// TestReadingTimeIsTheAnswer: a reading is dated when the engine answered, not when the scrape
// began, since a caller compares it with its own in-flight count at that moment.
func TestReadingTimeIsTheAnswer(t *testing.T) {
	body := fixture(t, "tgi_docs.txt")
	ts := serve(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(60 * time.Millisecond)
		w.Write(body)
	})
	s := newScraper(t, Options{Interval: time.Hour, Timeout: 5 * time.Second})
	s.Add(Target{Key: "u", URL: ts.URL + "/metrics"})
	waitFor(t, "the first reading, soon after Add despite the hour-long interval", func() bool { return s.Snapshot("u") != nil })
	seen := time.Now()
	snap := s.Snapshot("u")
	if d := snap.Reading.At.Sub(snap.Attempted); d < 60*time.Millisecond || snap.Reading.At.After(seen) {
		t.Errorf("reading dated %v after the attempt began (%v before it was seen), want the answer's time (60ms or more, before it was seen)", d, seen.Sub(snap.Reading.At))
	}
}

// TestHugePageMemoryBounded: a 50 MB page costs about MaxBytes of memory, not 50 MB.
func TestHugePageMemoryBounded(t *testing.T) {
	line := []byte(strings.Repeat("vllm:num_requests_running 1\n", 1<<12))
	var sent atomic.Int64
	ts := serve(t, func(w http.ResponseWriter, r *http.Request) {
		for sent.Load() < 50<<20 {
			n, err := w.Write(line)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	s := NewScraper(Options{Timeout: 10 * time.Second})
	defer s.Stop()
	tg := &target{Target: Target{Key: "u", URL: ts.URL + "/metrics"}}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, outcome, err := s.fetch(context.Background(), tg)
	runtime.ReadMemStats(&after)
	if outcome != OutcomeTooLarge || !errors.Is(err, ErrTooLarge) {
		t.Fatalf("outcome %v, %v", outcome, err)
	}
	// The buffer doubles up to the bound: about twice the bound in all.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 5*DefaultMaxBytes/2 {
		t.Errorf("allocated %d bytes for a page cut at %d", alloc, DefaultMaxBytes)
	}
	if cap(tg.buf) > maxKeptBuffer {
		t.Errorf("kept %d bytes", cap(tg.buf))
	}
}

// TestTargetsAreIndependent: a hung endpoint does not delay the readings of the others.
func TestTargetsAreIndependent(t *testing.T) {
	hung := serve(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	good := serve(t, page(t, "tgi_docs.txt"))
	s := newScraper(t, Options{Interval: 10 * time.Millisecond, Timeout: time.Minute})
	s.Add(Target{Key: "hung", URL: hung.URL + "/metrics"})
	s.Add(Target{Key: "good", URL: good.URL + "/metrics"})
	waitFor(t, "ten readings of the good target", func() bool {
		snap := s.Snapshot("good")
		return snap != nil && snap.Counts[OutcomeOK] >= 10
	})
	if snap := s.Snapshot("hung"); snap != nil {
		t.Errorf("the hung target has a snapshot: %+v", snap)
	}
}

func TestReadBounded(t *testing.T) {
	for _, tt := range []struct {
		size, limit int
		over        bool
	}{{0, 10, false}, {10, 10, false}, {11, 10, true}, {100000, 100000, false}, {100001, 100000, true}, {5 << 20, 1 << 20, true}} {
		b, err := readBounded(strings.NewReader(strings.Repeat("x", tt.size)), nil, int64(tt.limit))
		if err != nil || (len(b) > tt.limit) != tt.over || (!tt.over && len(b) != tt.size) || cap(b) > max(tt.limit+1, 16<<10) {
			t.Errorf("size %d limit %d: len %d cap %d err %v", tt.size, tt.limit, len(b), cap(b), err)
		}
	}
}

// TestScraperConcurrentUse: configs adding and removing targets while requests read snapshots.
func TestScraperConcurrentUse(t *testing.T) {
	ts := serve(t, page(t, "sglang_docs.txt"))
	base := runtime.NumGoroutine()
	s := NewScraper(Options{Interval: time.Millisecond, MaxTargets: 8})
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[(g*7+i)%len(keys)]
				switch i % 5 {
				case 0:
					err := s.Add(Target{Key: k, URL: ts.URL + "/metrics?v=" + string(rune('0'+i%3))})
					if err != nil && !errors.Is(err, ErrTooManyTargets) {
						t.Error(err)
					}
				case 1:
					s.Remove(k)
				case 2:
					if snap := s.Snapshot(k); snap != nil && snap.Key != k {
						t.Errorf("snapshot of %s under key %s", snap.Key, k)
					}
				case 3:
					if n := len(s.Keys()); n > 8 {
						t.Errorf("%d targets, bound 8", n)
					}
				default:
					s.Snapshots()
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	s.Stop()
	waitFor(t, "goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
}

// TestScraperSkipAndAdopt: while Skip says so the endpoint is not read at all, an adopted
// reading becomes the target's latest (FromPeer) without counting as an attempt, an older one
// is refused, and an own reading takes over again once Skip lets it.
func TestScraperSkipAndAdopt(t *testing.T) {
	var gets atomic.Int64
	h := page(t, "vllm_v1_qwen3.txt")
	ts := serve(t, func(w http.ResponseWriter, r *http.Request) { gets.Add(1); h(w, r) })
	var skip atomic.Bool
	var skipped atomic.Int64 // scrapes of a left out
	opts := fast
	opts.Skip = func(key string) bool {
		if key == "a" && skip.Load() {
			skipped.Add(1)
			return true
		}
		return false
	}
	s := newScraper(t, opts)
	if _, _, ok := s.Adopt("a", Reading{At: time.Now()}); ok {
		t.Error("adopted a reading of a target that is not read")
	}
	if err := s.Add(Target{Key: "a", URL: ts.URL + "/metrics"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an own reading", func() bool { return s.Snapshot("a").Fresh(time.Now(), time.Second) })
	skip.Store(true)
	// A scrape that asked Skip before it turned may land however late; the target's loop runs
	// one scrape at a time, so once it asks again that one is over.
	waitFor(t, "a scrape left out", func() bool { return skipped.Load() >= 1 })
	before := gets.Load()
	waitFor(t, "ten more scrapes left out", func() bool { return skipped.Load() >= 11 })
	if n := gets.Load() - before; n != 0 {
		t.Errorf("%d reads while Skip said no", n)
	}
	own := s.Snapshot("a")
	peer := Reading{Engine: EngineVLLM, At: time.Now(), Figures: Figures{Running: 7, Waiting: 1, KVCapacityTokens: 1000, Known: HasRunning | HasWaiting | HasKVCapacity}}
	prev, cur, ok := s.Adopt("a", peer)
	if !ok || prev != own || cur != s.Snapshot("a") || !cur.FromPeer || cur.Reading.Running != 7 || cur.Outcome != OutcomeOK {
		t.Fatalf("Adopt: ok %v, snapshot %+v", ok, cur)
	}
	if cur.Counts != own.Counts {
		t.Errorf("an adopted reading counted as an attempt: %v, was %v", cur.Counts, own.Counts)
	}
	if _, _, ok := s.Adopt("a", Reading{At: peer.At.Add(-time.Millisecond)}); ok {
		t.Error("adopted a reading older than the latest")
	}
	skip.Store(false)
	waitFor(t, "an own reading again", func() bool { sn := s.Snapshot("a"); return !sn.FromPeer && sn.Reading.At.After(peer.At) })
}
