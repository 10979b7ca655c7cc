package llmsim

import (
	"net/http"
	"testing"

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
		{"small", Config{Name: "s", CapacityBlocks: 64, BlockTokens: 32, PrefillPerToken: -1, DecodePerToken: -1}, 64 * 32},
		{"unlimited", Config{Name: "u", CapacityBlocks: -1, PrefillPerToken: -1, DecodePerToken: -1}, 0},
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
