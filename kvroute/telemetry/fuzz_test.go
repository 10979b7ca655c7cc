package telemetry

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzParse feeds Parse arbitrary pages: it must never panic, and whatever it accepts must be
// figures an engine could report.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.txt"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"",
		"vllm:num_requests_running NaN\n",
		"vllm:num_requests_running -1\nvllm:num_requests_waiting 1e308\n",
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1` + "\n",
		`vllm:cache_config_info{block_size="1e6",num_gpu_blocks="1e7",kv_cache_size_tokens="0.5"} 1` + "\n",
		"# TYPE vllm:num_requests_running histogram\nvllm:num_requests_running_bucket{le=\"+Inf\"} 1\n",
		"# TYPE sglang:token_usage gauge\n# TYPE sglang:token_usage gauge\n",
		"sglang_num_running_reqs{tp_rank=\"0\"} 3\nsglang_num_running_reqs{tp_rank=\"1\"} 4\n",
		"tgi_queue_size{a=\"\\\"\"} 1\n",
		"llamacpp:requests_processing 1 1700000000000\n",
		"\xff\xfe\x00",
		"# TYPE vllm:time_to_first_token_seconds histogram\nvllm:time_to_first_token_seconds_bucket{le=\"1\"} 5\nvllm:time_to_first_token_seconds_bucket{le=\"0.1\"} 7\nvllm:time_to_first_token_seconds_count 3\n",
		"# TYPE vllm:request_prefill_time_seconds histogram\nvllm:request_prefill_time_seconds_sum 1e300\nvllm:request_prefill_time_seconds_count 1\n",
		"vllm:prompt_tokens_total 5\nvllm:prefix_cache_hits_total 9\nprocess_start_time_seconds 1\n",
		"sglang:cached_tokens_total{cache_source=\"device\",tp_rank=\"1\"} 3\nsglang:prompt_tokens_total -1\n",
	} {
		f.Add([]byte(s))
	}
	base, err := os.ReadFile(filepath.Join("testdata", "vllm_documented_counters.txt"))
	if err != nil {
		f.Fatal(err)
	}
	prev, err := Parse(bytes.NewReader(base), 0)
	if err != nil {
		f.Fatal(err)
	}
	prev.At = time.Unix(1_800_000_000, 0)
	f.Fuzz(func(t *testing.T, page []byte) {
		r, err := Parse(bytes.NewReader(page), 1<<20)
		checkCounters(t, r.Counters)
		// Whatever the page, its delta against a good reading (either way round) is bounded.
		r.At = prev.At.Add(time.Second)
		for _, d := range []Delta{Diff(&prev, &r), Diff(&r, &prev)} {
			checkDelta(t, d)
		}
		if len(r.Models) > MaxModels || r.Ignored < 0 {
			t.Fatalf("models %d ignored %d", len(r.Models), r.Ignored)
		}
		if err != nil {
			return
		}
		if r.Engine == EngineUnknown || (r.Known == 0 && r.Counters.Known&^HasStartTime == 0 && r.LoRA == nil) {
			t.Fatalf("accepted without figures: %+v", r)
		}
		for _, f := range append([]Figures{r.Figures}, modelsFigures(r)...) {
			if f.Running < 0 || f.Waiting < 0 || f.KVCapacityTokens < 0 ||
				math.IsNaN(f.KVUsage) || f.KVUsage < 0 || f.KVUsage > 1 ||
				(f.Known.Has(HasKVCapacity) && f.KVCapacityTokens < 1) {
				t.Fatalf("invalid figures %+v", f)
			}
		}
	})
}

func modelsFigures(r Reading) []Figures {
	out := make([]Figures, len(r.Models))
	for i, m := range r.Models {
		out[i] = m.Figures
	}
	return out
}

func checkCounters(t *testing.T, c Counters) {
	t.Helper()
	for _, v := range []float64{c.PromptTokens, c.ComputedTokens, c.CacheQueries, c.CacheHits, c.GenerationTokens,
		c.PrefillSeconds, c.PrefillRequests, c.DecodeSeconds, c.StartTime} {
		if !finiteNonNeg(v) || v > maxCounter {
			t.Fatalf("invalid counters %+v", c)
		}
	}
	if c.Known.Has(HasTTFT) != (c.TTFT != nil) {
		t.Fatalf("ttft %v with known %v", c.TTFT, c.Known)
	}
	if h := c.TTFT; h != nil && (len(h.Bounds) == 0 || len(h.Bounds) > MaxBuckets || len(h.Counts) != len(h.Bounds)) {
		t.Fatalf("histogram %+v", h)
	}
}

func checkDelta(t *testing.T, d Delta) {
	t.Helper()
	for _, v := range []float64{d.PromptTokens, d.ComputedTokens, d.CacheQueries, d.CacheHits, d.GenerationTokens,
		d.PrefillSeconds, d.PrefillRequests, d.DecodeSeconds} {
		if !finiteNonNeg(v) || v > maxRate*max(d.Seconds, 1)+1e6*max(d.Seconds, 1) {
			t.Fatalf("invalid delta %+v", d)
		}
	}
	if d.Restart && d.Known != 0 {
		t.Fatalf("restart with deltas %+v", d)
	}
	if r, ok := d.HitRatio(); ok && !(r >= 0 && r <= 1) {
		t.Fatalf("hit ratio %v", r)
	}
	if h := d.TTFT; h != nil {
		for i, n := range h.Counts {
			if n < 0 || n > h.Count || (i > 0 && n < h.Counts[i-1]) {
				t.Fatalf("ttft delta %+v", h)
			}
		}
	}
}
