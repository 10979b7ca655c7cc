package telemetry

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func parseFile(t *testing.T, name string) Reading {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Parse(strings.NewReader(string(b)), 0)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return r
}

// TestParseCounters reads each engine's totals from its real or documented page
// (testdata/README.md says which is which).
func TestParseCounters(t *testing.T) {
	for _, tc := range []struct {
		file string
		want Counters
		ttft float64 // the TTFT histogram's count, when the page has one
	}{
		{"vllm_v1_qwen3.txt", Counters{PromptTokens: 43952, GenerationTokens: 4874, PrefillSeconds: 239.16777801513672,
			PrefillRequests: 38, DecodeSeconds: 662.8201270103455,
			Known: HasPromptTokens | HasGenerationTokens | HasPrefillTime | HasDecodeTime | HasTTFT}, 69},
		{"vllm_documented_counters.txt", Counters{PromptTokens: 1873216, ComputedTokens: 671632, CacheQueries: 1873216,
			CacheHits: 1201584, GenerationTokens: 248113, PrefillSeconds: 139.5311, PrefillRequests: 1741,
			DecodeSeconds: 4571.0932, StartTime: 1.79614e9, Known: HasPromptTokens | HasComputedTokens | HasCacheQueries |
				HasCacheHits | HasGenerationTokens | HasPrefillTime | HasDecodeTime | HasTTFT | HasStartTime}, 1741},
		{"llmd_sim_v0.10.2.txt", Counters{CacheQueries: 214, PrefillSeconds: 2.444e-06, PrefillRequests: 2,
			Known: HasCacheQueries | HasCacheHits | HasPrefillTime | HasTTFT}, 2},
		{"llmd_sim_v0.10.2_counters.txt", Counters{PromptTokens: 2958, CacheQueries: 2958, CacheHits: 2400, GenerationTokens: 51,
			PrefillSeconds: 0.024574053999999998, PrefillRequests: 6, DecodeSeconds: 0.10926406500000001,
			Known: HasPromptTokens | HasCacheQueries | HasCacheHits | HasGenerationTokens | HasPrefillTime | HasDecodeTime | HasTTFT}, 6},
		{"sglang_docs.txt", Counters{PromptTokens: 8.128902e+06, GenerationTokens: 7.557572e+06,
			Known: HasPromptTokens | HasGenerationTokens | HasTTFT}, 11008},
		// SGLang's cached tokens from every cache_source, its prompt tokens from both
		// is_streaming series; its queries are its prompt tokens.
		{"sglang_documented_counters.txt", Counters{PromptTokens: 400000, CacheQueries: 400000, CacheHits: 256000,
			GenerationTokens: 60000, StartTime: 1.7961362e9,
			Known: HasPromptTokens | HasCacheQueries | HasCacheHits | HasGenerationTokens | HasTTFT | HasStartTime}, 940},
		// llama.cpp counts only the prompt tokens it computed: no prompt total, no hits.
		{"llamacpp_server.txt", Counters{ComputedTokens: 6886, PrefillSeconds: 2903.63, GenerationTokens: 3469,
			DecodeSeconds: 3544.27, Known: HasComputedTokens | HasPrefillTime | HasGenerationTokens | HasDecodeTime}, 0},
		{"tgi_docs.txt", Counters{}, 0},
	} {
		t.Run(tc.file, func(t *testing.T) {
			r := parseFile(t, tc.file)
			got := r.Counters
			if r.Ignored != 0 {
				t.Errorf("ignored %d samples", r.Ignored)
			}
			if tc.want.Known.Has(HasTTFT) {
				if got.TTFT == nil || got.TTFT.Count != tc.ttft || len(got.TTFT.Bounds) == 0 {
					t.Errorf("ttft %+v, want count %v", got.TTFT, tc.ttft)
				}
			}
			got.TTFT = nil
			if got != tc.want {
				t.Errorf("counters\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// vllmPage writes a vLLM page with the given totals (and a TTFT histogram of count ttft).
func vllmPage(prompt, hits, prefillSec, start float64, ttft int, model string) string {
	var b strings.Builder
	l := fmt.Sprintf(`model_name=%q`, model)
	fmt.Fprintf(&b, "vllm:num_requests_running{%s} 1\n", l)
	fmt.Fprintf(&b, "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{%s} %v\n", l, prompt)
	fmt.Fprintf(&b, "# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{%s} %v\n", l, prompt)
	fmt.Fprintf(&b, "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{%s} %v\n", l, hits)
	fmt.Fprintf(&b, "# TYPE vllm:request_prefill_time_seconds histogram\n")
	fmt.Fprintf(&b, "vllm:request_prefill_time_seconds_bucket{%s,le=\"1\"} %d\n", l, ttft)
	fmt.Fprintf(&b, "vllm:request_prefill_time_seconds_bucket{%s,le=\"+Inf\"} %d\n", l, ttft)
	fmt.Fprintf(&b, "vllm:request_prefill_time_seconds_sum{%s} %v\nvllm:request_prefill_time_seconds_count{%s} %d\n", l, prefillSec, l, ttft)
	fmt.Fprintf(&b, "# TYPE vllm:time_to_first_token_seconds histogram\n")
	fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{%s,le=\"0.1\"} %d\n", l, ttft/2)
	fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{%s,le=\"1\"} %d\n", l, ttft)
	fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{%s,le=\"+Inf\"} %d\n", l, ttft)
	fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_sum{%s} %v\nvllm:time_to_first_token_seconds_count{%s} %d\n", l, float64(ttft)*0.2, l, ttft)
	if start > 0 {
		fmt.Fprintf(&b, "process_start_time_seconds %v\n", start)
	}
	return b.String()
}

func mustParse(t *testing.T, s string, at time.Time) Reading {
	t.Helper()
	r, err := Parse(strings.NewReader(s), 0)
	if err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	r.At = at
	return r
}

func TestDiff(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	t1 := t0.Add(2 * time.Second)
	base := mustParse(t, vllmPage(10000, 6000, 5, 1.7e9, 100, "m"), t0)
	for _, tc := range []struct {
		name      string
		cur       string
		restart   bool
		anomalies Anomalies
		check     func(t *testing.T, d Delta)
	}{
		{"interval", vllmPage(14000, 9000, 6, 1.7e9, 120, "m"), false, 0, func(t *testing.T, d Delta) {
			if d.PromptTokens != 4000 || d.CacheHits != 3000 || d.ComputedTokens != 1000 || d.PrefillSeconds != 1 ||
				d.PrefillRequests != 20 || d.Seconds != 2 || d.TTFT == nil || d.TTFT.Count != 20 || d.TTFT.Counts[0] != 10 {
				t.Errorf("%+v", d)
			}
			if r, ok := d.HitRatio(); !ok || r != 0.75 {
				t.Errorf("hit ratio %v %v", r, ok)
			}
		}},
		{"counter back to zero", vllmPage(0, 0, 0, 1.7e9, 0, "m"), true, 0, nil},
		{"new start time", vllmPage(14000, 9000, 6, 1.7e9+60, 120, "m"), true, 0, nil},
		// Back by less than a thousandth: rounding, not a restart; that total is left out.
		{"wobble", vllmPage(9995, 6000, 6, 1.7e9, 120, "m"), false, AnomalyWobble, func(t *testing.T, d Delta) {
			if d.Known.Has(HasPromptTokens) || d.Known.Has(HasComputedTokens) || !d.Known.Has(HasPrefillTime) || d.PrefillSeconds != 1 {
				t.Errorf("%+v", d)
			}
		}},
		{"other model", vllmPage(14000, 9000, 6, 1.7e9, 120, "other"), false, AnomalyModel, func(t *testing.T, d Delta) {
			if d.Known != 0 {
				t.Errorf("%+v", d)
			}
		}},
		{"absurd", vllmPage(1e14, 9000, 6, 1.7e9, 120, "m"), false, AnomalyAbsurd, func(t *testing.T, d Delta) {
			if d.Known.Has(HasPromptTokens) || !d.Known.Has(HasCacheHits) {
				t.Errorf("%+v", d)
			}
		}},
		// The start time and the hits go away: the others still count.
		{"family gone", strings.ReplaceAll(strings.ReplaceAll(vllmPage(14000, 9000, 6, 0, 120, "m"), "vllm:prefix_cache_hits_total", "x"), "process_start", "x"),
			false, AnomalyGone, func(t *testing.T, d Delta) {
				if d.Known.Has(HasCacheHits) || !d.Known.Has(HasPromptTokens) || d.PromptTokens != 4000 {
					t.Errorf("%+v", d)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := mustParse(t, tc.cur, t1)
			d := Diff(&base, &cur)
			if d.Restart != tc.restart || d.Anomalies != tc.anomalies {
				t.Fatalf("restart %v anomalies %b, want %v %b: %+v", d.Restart, d.Anomalies, tc.restart, tc.anomalies, d)
			}
			if d.Restart && d.Known != 0 {
				t.Errorf("a restart with deltas %+v", d)
			}
			if tc.check != nil {
				tc.check(t, d)
			}
		})
	}
	// A family that appears is a baseline, not a delta; gone again, it is counted.
	noHits := mustParse(t, strings.ReplaceAll(vllmPage(12000, 0, 5.5, 1.7e9, 110, "m"), "vllm:prefix_cache_hits_total", "x"), t0)
	withHits := mustParse(t, vllmPage(14000, 9000, 6, 1.7e9, 120, "m"), t1)
	if d := Diff(&noHits, &withHits); d.Known.Has(HasCacheHits) || d.Anomalies != 0 || d.Restart || d.PromptTokens != 2000 {
		t.Errorf("appearing family: %+v", d)
	}
}

// TestParseBadHistograms: a histogram without buckets, with decreasing buckets, with buckets
// above its count or with a NaN sum is dropped and counted, never a panic; the rest stays.
func TestParseBadHistograms(t *testing.T) {
	const head = "vllm:num_requests_running 1\n# TYPE vllm:time_to_first_token_seconds histogram\n"
	for name, body := range map[string]string{
		"no buckets": "vllm:time_to_first_token_seconds_sum 1\nvllm:time_to_first_token_seconds_count 3\n",
		"decreasing": "vllm:time_to_first_token_seconds_bucket{le=\"0.1\"} 3\nvllm:time_to_first_token_seconds_bucket{le=\"1\"} 2\n" +
			"vllm:time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\nvllm:time_to_first_token_seconds_sum 1\nvllm:time_to_first_token_seconds_count 3\n",
		"above count": "vllm:time_to_first_token_seconds_bucket{le=\"0.1\"} 9\nvllm:time_to_first_token_seconds_sum 1\nvllm:time_to_first_token_seconds_count 3\n",
		"nan sum":     "vllm:time_to_first_token_seconds_bucket{le=\"0.1\"} 1\nvllm:time_to_first_token_seconds_sum NaN\nvllm:time_to_first_token_seconds_count 3\n",
	} {
		r, err := Parse(strings.NewReader(head+body), 0)
		if err != nil || r.Counters.Known.Has(HasTTFT) || r.Ignored != 1 || r.Running != 1 {
			t.Errorf("%s: %v %+v", name, err, r)
		}
	}
	// Untyped _bucket samples are a histogram without its TYPE line: counted, not read.
	r, err := Parse(strings.NewReader("vllm:num_requests_running 1\nvllm:time_to_first_token_seconds_bucket{le=\"1\"} 2\n"), 0)
	if err != nil || r.Counters.Known != 0 || r.Ignored != 1 {
		t.Errorf("untyped buckets: %v %+v", err, r)
	}
	// Negative and absurd totals.
	r, err = Parse(strings.NewReader("vllm:num_requests_running 1\nvllm:prompt_tokens_total -5\nvllm:generation_tokens_total 1e300\nprocess_start_time_seconds NaN\n"), 0)
	if err != nil || r.Counters.Known != 0 || r.Ignored != 3 {
		t.Errorf("bad totals: %v %+v", err, r)
	}
	// A page of totals alone is an engine's reading; the start time alone is no engine's.
	if r, err := Parse(strings.NewReader("vllm:prompt_tokens_total 5\n"), 0); err != nil || r.Engine != EngineVLLM {
		t.Errorf("totals alone: %v %+v", err, r)
	}
	if _, err := Parse(strings.NewReader("process_start_time_seconds 1.7e9\n"), 0); err != ErrNoEngine {
		t.Errorf("start time alone: %v", err)
	}
}

func TestHistogramQuantile(t *testing.T) {
	h := &Histogram{Count: 10, Bounds: []float64{0.1, 1}, Counts: []float64{5, 10}}
	if q, ok := h.Quantile(0.5); !ok || q != 0.1 {
		t.Errorf("p50 %v %v", q, ok)
	}
	if q, ok := h.Quantile(0.75); !ok || math.Abs(q-0.55) > 1e-9 {
		t.Errorf("p75 %v %v", q, ok)
	}
	if _, ok := (&Histogram{Count: 10, Bounds: []float64{1}, Counts: []float64{5}}).Quantile(0.99); ok {
		t.Error("a quantile in the +Inf bucket")
	}
}

// TestScraperDelta: a loopback engine whose totals grow, wobble, then restart from zero.
func TestScraperDelta(t *testing.T) {
	var mu sync.Mutex
	cur := vllmPage(1000, 500, 1, 1.7e9, 10, "m")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprint(w, cur)
	}))
	defer srv.Close()
	set := func(s string) {
		mu.Lock()
		cur = s
		mu.Unlock()
	}
	s := newScraper(t, Options{Interval: 10 * time.Millisecond})
	if err := s.Add(Target{Key: "e", URL: srv.URL}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a first reading", func() bool { snap := s.Snapshot("e"); return snap != nil && snap.Outcome == OutcomeOK })
	set(vllmPage(3000, 1500, 2, 1.7e9, 20, "m"))
	waitFor(t, "a delta", func() bool {
		d := s.Snapshot("e").Delta
		return d != nil && d.Known.Has(HasPromptTokens) && d.PromptTokens > 0
	})
	set(vllmPage(0, 0, 0, 1.7e9, 0, "m"))
	waitFor(t, "a restart", func() bool { return s.Snapshot("e").Restarts == 1 })
	if snap := s.Snapshot("e"); snap.Anomalies != 0 {
		t.Errorf("anomalies %d", snap.Anomalies)
	}
	// Totals that grow again after the restart are intervals, not more restarts.
	set(vllmPage(200, 100, 0.5, 1.7e9, 3, "m"))
	waitFor(t, "a delta after the restart", func() bool {
		d := s.Snapshot("e").Delta
		return d != nil && d.Known.Has(HasPromptTokens) && d.PromptTokens == 200
	})
	if snap := s.Snapshot("e"); snap.Restarts != 1 {
		t.Errorf("restarts %d", snap.Restarts)
	}
}
