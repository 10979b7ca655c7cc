package telemetry

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"
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
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, page []byte) {
		r, err := Parse(bytes.NewReader(page), 1<<20)
		if len(r.Models) > MaxModels || r.Ignored < 0 {
			t.Fatalf("models %d ignored %d", len(r.Models), r.Ignored)
		}
		if err != nil {
			return
		}
		if r.Engine == EngineUnknown || r.Known == 0 {
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
