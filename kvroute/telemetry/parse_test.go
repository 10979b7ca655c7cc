package telemetry

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func parseString(s string) (Reading, error) { return Parse(strings.NewReader(s), 0) }

// TestParseFixtures reads each engine's real page (testdata/README.md says where each comes
// from) and checks every figure against the page's own lines.
func TestParseFixtures(t *testing.T) {
	tests := []struct {
		file   string
		engine Engine
		want   Figures
		models []string
	}{
		// block_size 16 × num_gpu_blocks 2340; the older gpu_cache_usage_perc is the usage.
		{"vllm_v1_qwen3.txt", EngineVLLM, Figures{Running: 0, Waiting: 0, KVUsage: 0, KVCapacityTokens: 16 * 2340,
			Known: HasRunning | HasWaiting | HasKVUsage | HasKVCapacity}, []string{"Qwen/Qwen3-0.6B"}},
		// SGLang's documented example has no max_total_num_tokens: no capacity.
		{"sglang_docs.txt", EngineSGLang, Figures{Running: 162, Waiting: 2826, KVUsage: 0.28,
			Known: HasRunning | HasWaiting | HasKVUsage}, []string{"meta-llama/Llama-3.1-8B-Instruct"}},
		{"llamacpp_server.txt", EngineLlamaCpp, Figures{Running: 0, Waiting: 0, KVUsage: 0.491063,
			Known: HasRunning | HasWaiting | HasKVUsage}, nil},
		{"tgi_docs.txt", EngineTGI, Figures{Running: 4, Waiting: 6, Known: HasRunning | HasWaiting}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			r, err := Parse(bytes.NewReader(fixture(t, tt.file)), 0)
			if err != nil {
				t.Fatal(err)
			}
			if r.Engine != tt.engine || r.Figures != tt.want || r.Ignored != 0 {
				t.Errorf("got %s %+v ignored %d, want %s %+v", r.Engine, r.Figures, r.Ignored, tt.engine, tt.want)
			}
			var models []string
			for _, m := range r.Models {
				models = append(models, m.Model)
				if m.Figures != tt.want {
					t.Errorf("model %s: %+v, want %+v (one model: its figures are the totals)", m.Model, m.Figures, tt.want)
				}
			}
			if strings.Join(models, ",") != strings.Join(tt.models, ",") {
				t.Errorf("models %q, want %q", models, tt.models)
			}
		})
	}
}

func TestParseLlmdSimulator(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "llmd_sim_v0.10.2.txt"))
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("no capture of llm-d-inference-sim")
	}
	if err != nil {
		t.Fatal(err)
	}
	r, err := Parse(bytes.NewReader(b), 0)
	if err != nil {
		t.Fatal(err)
	}
	// Captured with 2 requests running and 3 waiting (TestLlmdSimulatorLive).
	if r.Engine != EngineVLLM || !r.Known.Has(HasRunning|HasWaiting|HasKVUsage|HasKVCapacity) {
		t.Fatalf("%+v", r)
	}
	if r.KVCapacityTokens != llmdBlocks*16 || r.Running != 2 || r.Waiting != 3 || r.KVUsage <= 0 || r.Ignored != 0 {
		t.Errorf("%+v ignored %d; want capacity %d, 2 running, 3 waiting, some usage", r.Figures, r.Ignored, llmdBlocks*16)
	}
	// Its cache_config_info has no model label, its gauges do: with one model, the capacity
	// is that model's.
	if len(r.Models) != 1 || r.Models[0].Model != "llama-3.1-8b" || r.Models[0].Figures != r.Figures {
		t.Errorf("models %+v", r.Models)
	}
}

func TestParseNewerVLLM(t *testing.T) {
	// kv_cache_usage_perc is preferred to gpu_cache_usage_perc; kv_cache_size_tokens, when
	// given, to block_size × num_gpu_blocks (hybrid models' blocks are not all alike).
	r, err := parseString(`# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="832",engine="0",kv_cache_size_tokens="619479",num_gpu_blocks="745"} 1.0
`)
	if err != nil {
		t.Fatal(err)
	}
	if r.KVUsage != 0.42 || r.KVCapacityTokens != 619479 {
		t.Errorf("%+v", r.Figures)
	}
}

func TestParseDataParallelAndRanks(t *testing.T) {
	// vLLM under data parallelism: one series per engine, each its own cache and queue; they add up.
	r, err := parseString(`# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3
vllm:num_requests_running{engine="1",model_name="m"} 4
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1
vllm:num_requests_waiting{engine="1",model_name="m"} 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1
`)
	if err != nil {
		t.Fatal(err)
	}
	if r.Running != 7 || r.Waiting != 3 || math.Abs(r.KVUsage-0.4) > 1e-9 || r.KVCapacityTokens != 32000 {
		t.Errorf("data parallel: %+v", r.Figures)
	}

	// SGLang with tensor parallelism: every rank reports the same engine; it counts once.
	r, err = parseString(`# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="q",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 5
sglang:num_running_reqs{engine_type="unified",model_name="q",moe_ep_rank="0",pp_rank="0",tp_rank="1"} 5
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="unified",model_name="q",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 144870
sglang:max_total_num_tokens{engine_type="unified",model_name="q",moe_ep_rank="0",pp_rank="0",tp_rank="1"} 144870
`)
	if err != nil {
		t.Fatal(err)
	}
	if r.Running != 5 || r.KVCapacityTokens != 144870 {
		t.Errorf("tensor parallel: %+v", r.Figures)
	}
}

func TestParseSGLangNewPrefix(t *testing.T) {
	// SGLang v0.5.4 renamed "sglang:" to "sglang_".
	r, err := parseString(`# TYPE sglang_num_running_reqs gauge
sglang_num_running_reqs{model_name="q"} 2
# TYPE sglang_num_queue_reqs gauge
sglang_num_queue_reqs{model_name="q"} 9
# TYPE sglang_max_total_num_tokens gauge
sglang_max_total_num_tokens{model_name="q"} 1000
`)
	if err != nil {
		t.Fatal(err)
	}
	if r.Engine != EngineSGLang || r.Running != 2 || r.Waiting != 9 || r.KVCapacityTokens != 1000 {
		t.Errorf("%s %+v", r.Engine, r.Figures)
	}
}

func TestParseSeveralModels(t *testing.T) {
	// One server, two models: the upstream's load is both; Models splits it.
	r, err := parseString(`# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="b"} 1
vllm:num_requests_running{model_name="a"} 2
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 5
vllm:num_requests_waiting{model_name="b"} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="a"} 0.5
vllm:kv_cache_usage_perc{model_name="b"} 0.1
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",model_name="a",num_gpu_blocks="10"} 1
vllm:cache_config_info{block_size="16",model_name="b",num_gpu_blocks="20"} 1
`)
	if err != nil {
		t.Fatal(err)
	}
	if r.Running != 3 || r.Waiting != 5 || math.Abs(r.KVUsage-0.3) > 1e-9 || r.KVCapacityTokens != 480 {
		t.Errorf("totals %+v", r.Figures)
	}
	if len(r.Models) != 2 || r.Models[0].Model != "a" || r.Models[1].Model != "b" {
		t.Fatalf("models %+v", r.Models)
	}
	if a := r.Models[0]; a.Running != 2 || a.Waiting != 5 || a.KVUsage != 0.5 || a.KVCapacityTokens != 160 {
		t.Errorf("model a %+v", a)
	}
}

func TestParseManyModelsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("# TYPE vllm:num_requests_running gauge\n")
	for i := range 3 * MaxModels {
		fmt.Fprintf(&b, "vllm:num_requests_running{model_name=\"m%d\"} 1\n", i)
	}
	r, err := parseString(b.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Models) != MaxModels || r.Running != 3*MaxModels {
		t.Errorf("%d models, running %d", len(r.Models), r.Running)
	}
}

func TestParseBadValues(t *testing.T) {
	tests := []struct {
		name, page string
		err        error
		known      Fields
		ignored    int
	}{
		{"NaN", "vllm:num_requests_running NaN\nvllm:num_requests_waiting 2\n", nil, HasWaiting, 1},
		{"infinite", "vllm:num_requests_running +Inf\n", ErrInvalid, 0, 1},
		{"negative", "vllm:num_requests_waiting -3\nvllm:num_requests_running 1\n", nil, HasRunning, 1},
		{"usage above 1", "vllm:kv_cache_usage_perc 1.5\nvllm:num_requests_running 1\n", nil, HasRunning, 1},
		{"capacity 0", `vllm:cache_config_info{block_size="16",num_gpu_blocks="0"} 1` + "\nvllm:num_requests_running 1\n", nil, HasRunning, 1},
		{"capacity None", `vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1` + "\n", ErrInvalid, 0, 1},
		{"capacity huge", `vllm:cache_config_info{block_size="1e9",num_gpu_blocks="1e9"} 1` + "\n", ErrInvalid, 0, 1},
		{"sglang capacity 0", "sglang:max_total_num_tokens 0\n", ErrInvalid, 0, 1},
		{"absurd count", "tgi_queue_size 1e300\ntgi_batch_current_size 2\n", nil, HasRunning, 1},
		{"garbled", "vllm:num_requests_running{model_name=\"x} 1\n", ErrGarbled, 0, 0},
		{"no value", "vllm:num_requests_running\n", ErrGarbled, 0, 0},
		{"not UTF-8", "vllm:num_requests_running 1\n\xff\xfe\n", ErrGarbled, 0, 0},
		{"binary", "\x00\x01\x02\x03", ErrNoEngine, 0, 0},
		{"HTML", "<html><body>It works!</body></html>\n", ErrNoEngine, 0, 0},
		{"empty", "", ErrNoEngine, 0, 0},
		{"other exporter", "# TYPE go_goroutines gauge\ngo_goroutines 12\n", ErrNoEngine, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseString(tt.page)
			if !errors.Is(err, tt.err) || (err == nil) != (tt.err == nil) {
				t.Fatalf("err %v, want %v", err, tt.err)
			}
			if r.Known != tt.known || r.Ignored != tt.ignored {
				t.Errorf("known %v ignored %d, want %v and %d", r.Known, r.Ignored, tt.known, tt.ignored)
			}
		})
	}
}

func TestParseTooLarge(t *testing.T) {
	page := fixture(t, "vllm_v1_qwen3.txt")
	if _, err := Parse(bytes.NewReader(page), int64(len(page))); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	if _, err := Parse(bytes.NewReader(page), int64(len(page)-1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("one byte over: %v", err)
	}
}

func TestParseSeriesBounded(t *testing.T) {
	// A page repeating one family's series: the parser sees at most maxSamples of them.
	var b strings.Builder
	b.WriteString("# TYPE vllm:num_requests_running gauge\n")
	for i := range maxSamples + 10 {
		b.WriteString(`vllm:num_requests_running{engine="` + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + `",n="` + string(rune(0x4e00+i)) + `"} 1` + "\n")
	}
	r, err := parseString(b.String())
	if err != nil {
		t.Fatal(err)
	}
	if r.Running != maxSamples || r.Ignored != 10 {
		t.Errorf("running %d ignored %d, want %d and 10", r.Running, r.Ignored, maxSamples)
	}
}

func TestLineName(t *testing.T) {
	tests := []struct {
		line, name string
		sample     bool
	}{
		{`vllm:num_requests_running{a="b"} 1`, "vllm:num_requests_running", true},
		{`tgi_queue_size 3`, "tgi_queue_size", true},
		{"  \ttgi_queue_size\t3", "tgi_queue_size", true},
		{"# HELP tgi_queue_size Current queue size", "tgi_queue_size", false},
		{"#\tTYPE  tgi_queue_size gauge", "tgi_queue_size", false},
		{"# TYPEtgi_queue_size gauge", "", false},
		{"# a comment", "", false},
		{`{"vllm:num_requests_running"} 1`, "", true},
		{"", "", false},
	}
	for _, tt := range tests {
		name, sample := lineName([]byte(tt.line))
		if string(name) != tt.name || (sample && tt.name != "") != (tt.sample && tt.name != "") {
			t.Errorf("lineName(%q) = %q %v, want %q %v", tt.line, name, sample, tt.name, tt.sample)
		}
	}
}

func TestParseProps(t *testing.T) {
	n, err := ParseProps(bytes.NewReader(fixture(t, "llamacpp_props.json")), 0)
	if err != nil || n != 8192 {
		t.Fatalf("ParseProps = %d, %v; want 8192", n, err)
	}
	for _, bad := range []string{`{}`, `{"default_generation_settings":{"n_ctx":0}}`, `{"n_ctx":-1}`,
		`{"n_ctx":1.5}`, `not json`, `{"n_ctx":"many"}`} {
		if n, err := ParseProps(strings.NewReader(bad), 0); err == nil {
			t.Errorf("ParseProps(%s) = %d, want an error", bad, n)
		}
	}
	if n, err := ParseProps(strings.NewReader(`{"n_ctx":4096}`), 0); err != nil || n != 4096 {
		t.Errorf("top-level n_ctx: %d %v", n, err)
	}
	if _, err := ParseProps(strings.NewReader(`{"n_ctx":4096}`+strings.Repeat(" ", 100)), 50); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the limit: %v", err)
	}
}

// llmdBlocks is the --kv-cache-size the llm-d simulator's capture was made with.
const llmdBlocks = 1024

// TestParseSGLangCapacity: SGLang gives its KV pool as max_total_num_tokens, as
// cache_config_info{page_size,num_pages} (before v0.5.11) and as page_size and num_pages
// gauges (since); the number wins when several are there, and nothing is counted twice. The
// pages are constructed from those names (no published capture of them was found).
func TestParseSGLangCapacity(t *testing.T) {
	tests := []struct {
		name, page string
		want       int64
	}{
		{"info labels", `sglang:cache_config_info{page_size="16",num_pages="9000"} 1` + "\n", 144000},
		{"page gauges", "sglang:page_size{model_name=\"q\",tp_rank=\"0\"} 16\nsglang:num_pages{model_name=\"q\",tp_rank=\"0\"} 9000\n" +
			"sglang:page_size{model_name=\"q\",tp_rank=\"1\"} 16\nsglang:num_pages{model_name=\"q\",tp_rank=\"1\"} 9000\n", 144000},
		{"number and info", "sglang:max_total_num_tokens 144870\n" + `sglang:cache_config_info{page_size="16",num_pages="9054"} 1` + "\n", 144870},
		{"number and gauges", "sglang_max_total_num_tokens 144870\nsglang_page_size 16\nsglang_num_pages 9054\n", 144870},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseString(tt.page)
			if err != nil {
				t.Fatal(err)
			}
			if r.Engine != EngineSGLang || r.KVCapacityTokens != tt.want || !r.Known.Has(HasKVCapacity) || r.Ignored != 0 {
				t.Errorf("%s %+v ignored %d, want capacity %d", r.Engine, r.Figures, r.Ignored, tt.want)
			}
		})
	}
	// A page size without a page count is no capacity.
	if r, err := parseString("sglang:num_running_reqs 1\nsglang:page_size 16\n"); err != nil || r.Known.Has(HasKVCapacity) {
		t.Errorf("page size alone: %+v %v", r.Figures, err)
	}
}
