package llmsim

import (
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
)

// readTelemetry scrapes the worker as kvroute's telemetry does.
func readTelemetry(t *testing.T, url string) telemetry.Reading {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r, err := telemetry.Parse(resp.Body, 0)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestMetricsReadAsVLLM: the simulator's page reads as a vLLM engine's, KV capacity included.
func TestMetricsReadAsVLLM(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Config
		capacity int64 // 0: unknown
	}{
		{"defaults", fast, DefaultCapacityBlocks * DefaultBlockTokens},
		{"small", Config{Name: "s", CapacityBlocks: 64, BlockTokens: 32, StepFixed: -1, PrefillPerToken: -1, PerSeq: -1}, 64 * 32},
		{"unlimited", Config{Name: "u", CapacityBlocks: -1, StepFixed: -1, PrefillPerToken: -1, PerSeq: -1}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ts := startServer(t, tt.cfg)
			r := readTelemetry(t, ts.URL)
			want := telemetry.HasRunning | telemetry.HasWaiting | telemetry.HasKVUsage
			if tt.capacity > 0 {
				want |= telemetry.HasKVCapacity
			}
			if r.Engine != telemetry.EngineVLLM || r.Known != want || r.KVCapacityTokens != tt.capacity || r.Ignored != 0 {
				t.Errorf("%s %+v ignored %d; want known %v and capacity %d", r.Engine, r.Figures, r.Ignored, want, tt.capacity)
			}
		})
	}
}

// TestScrapesAreNotRequests: a router's telemetry reads /metrics every second; tests that count
// the requests a worker served (kvsim_requests_total, Stats, the prefix-cache counters) must
// count only the requests.
func TestScrapesAreNotRequests(t *testing.T) {
	s, ts := startServer(t, fast)
	decode[chatResponse](t, post(t, ts.URL+"/v1/completions", map[string]any{"prompt": blocksText("q", 2) + "?", "max_tokens": 2}))
	before := s.Stats()
	for range 20 {
		readTelemetry(t, ts.URL)
	}
	m := scrape(t, ts.URL)
	if after := s.Stats(); after != before {
		t.Errorf("scrapes changed the stats: %+v, then %+v", before, after)
	}
	if m["kvsim_requests_total"] != 1 || m["vllm:prefix_cache_queries_total"] != float64(before.PromptTokens) {
		t.Errorf("after 20 scrapes: requests %v, prefix cache queries %v (want 1 and %d)",
			m["kvsim_requests_total"], m["vllm:prefix_cache_queries_total"], before.PromptTokens)
	}
}

// TestLearnedFamilies: the simulator exports what kvroute learns from (prefill and decode time,
// TTFT, the process start), and its prefill time is the simulated GPU's: uncached tokens over it
// give the configured speed, four times lower on a worker four times slower. Restart zeroes the
// totals and takes a new start time, which kvroute's Diff reads as a restart.
func TestLearnedFamilies(t *testing.T) {
	for _, factor := range []int{1, 4} {
		cfg := Config{Name: "w", PrefillPerToken: time.Duration(factor) * 10 * time.Microsecond, StepFixed: -1, PerSeq: -1, Speed: 1}
		s, ts := startServer(t, cfg)
		before := readTelemetry(t, ts.URL)
		before.At = time.Now() // as the scraper stamps its readings
		decode[chatResponse](t, post(t, ts.URL+"/v1/completions", map[string]any{"prompt": blocksText("a", 8), "max_tokens": 2}))
		decode[chatResponse](t, post(t, ts.URL+"/v1/completions", map[string]any{"prompt": blocksText("a", 8) + blocksText("b", 4), "max_tokens": 2}))
		r := readTelemetry(t, ts.URL)
		r.At = time.Now()
		want := telemetry.HasPromptTokens | telemetry.HasCacheQueries | telemetry.HasCacheHits | telemetry.HasGenerationTokens |
			telemetry.HasPrefillTime | telemetry.HasDecodeTime | telemetry.HasTTFT | telemetry.HasStartTime
		if !r.Counters.Known.Has(want) || r.Ignored != 0 {
			t.Fatalf("known %v (ignored %d), want at least %v", r.Counters.Known, r.Ignored, want)
		}
		d := telemetry.Diff(&before, &r)
		st := s.Stats()
		computed := float64(st.PromptTokens - st.CachedTokens)
		speed := computed / d.PrefillSeconds
		if wantSpeed := 1e5 / float64(factor); math.Abs(speed-wantSpeed) > 1e-6*wantSpeed || d.PrefillRequests != 2 || d.TTFT.Count != 2 {
			t.Errorf("slowdown %d: %v uncached tokens in %vs of prefill = %v tokens/s (want %v), %v prefills, %v first tokens",
				factor, computed, d.PrefillSeconds, speed, wantSpeed, d.PrefillRequests, d.TTFT.Count)
		}
		// Diff takes a start time that moved by more than a second for a restart (Python
		// exporters round it): the restart comes more than a second after the start.
		start := r.Counters.StartTime
		for time.Since(time.Unix(0, int64(start*1e9))) < 1100*time.Millisecond {
			time.Sleep(50 * time.Millisecond)
		}
		s.Restart()
		after := readTelemetry(t, ts.URL)
		after.At = time.Now()
		if d := telemetry.Diff(&r, &after); !d.Restart || after.Counters.PromptTokens != 0 || after.Counters.StartTime <= start {
			t.Errorf("after Restart: restart %v, prompt tokens %v, start %v (was %v)", d.Restart, after.Counters.PromptTokens, after.Counters.StartTime, start)
		}
		if s.Stats().CacheBlocks != 0 {
			t.Errorf("after Restart the cache holds %d blocks", s.Stats().CacheBlocks)
		}
	}
}
