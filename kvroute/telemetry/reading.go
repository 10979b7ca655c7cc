package telemetry

import (
	"strings"
	"time"
)

// Engine names the inference server whose metric families a page carries.
type Engine string

// The engines Parse understands. EngineUnknown is a page with none of their families.
const (
	EngineUnknown  Engine = ""
	EngineVLLM     Engine = "vllm"
	EngineSGLang   Engine = "sglang"
	EngineLlamaCpp Engine = "llama.cpp"
	EngineTGI      Engine = "tgi"
)

// Fields is the set of a Reading's figures that the engine reported with a valid value.
type Fields uint8

// The figures of a Reading.
const (
	HasRunning Fields = 1 << iota
	HasWaiting
	HasKVUsage
	HasKVCapacity
)

// Has reports whether every field of want is in f.
func (f Fields) Has(want Fields) bool { return f&want == want }

// String lists the fields, as "running,waiting,kv_usage,kv_capacity" (for logs and the admin API).
func (f Fields) String() string {
	var names []string
	for _, n := range []struct {
		f    Fields
		name string
	}{{HasRunning, "running"}, {HasWaiting, "waiting"}, {HasKVUsage, "kv_usage"}, {HasKVCapacity, "kv_capacity"}} {
		if f.Has(n.f) {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ",")
}

// MarshalText writes String, so that the admin API's JSON names the fields.
func (f Fields) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

// Figures are what an engine reports of its own load and KV cache. A figure is meaningful only
// when Known has its bit.
type Figures struct {
	// Running is the requests in the engine's running batch.
	Running int64 `json:"running"`
	// Waiting is the requests queued in the engine, not yet running.
	Waiting int64 `json:"waiting"`
	// KVUsage is the fraction of the KV cache in use, 0 to 1.
	KVUsage float64 `json:"kv_usage"`
	// KVCapacityTokens is the size of the KV cache in tokens.
	KVCapacityTokens int64 `json:"kv_capacity_tokens"`
	// Known says which of the figures above the engine reported.
	Known Fields `json:"known"`
}

// ModelFigures are the figures of the series labelled with one model.
type ModelFigures struct {
	Model string `json:"model"`
	Figures
}

// Reading is what one metrics page says about one upstream.
//
// A server that serves several models (several engines behind one port, SGLang or vLLM labelling
// each series with model_name) is still one upstream with one set of GPUs, so the top-level
// figures are the upstream's own: running and waiting requests and KV capacity are summed over
// every model, and KV usage is the mean of the models' usage. Models breaks them down per model
// label for a caller that wants one model's share; it is empty when no series carries a model
// label.
type Reading struct {
	Engine Engine `json:"engine"`
	// At is when the engine answered, the moment its figures describe (set by the Scraper;
	// zero from Parse). A caller subtracting its own in-flight count from the engine's keeps
	// the count it had then.
	At time.Time `json:"at"`
	Figures
	// Models holds the figures per model label, sorted by model, at most MaxModels of them
	// (the totals above count every model).
	Models []ModelFigures `json:"models,omitempty"`
	// Counters are the engine's cumulative totals (tokens, prefix-cache hits, prefill time,
	// TTFT, its start time): Diff of two readings gives the interval's.
	Counters Counters `json:"counters"`
	// LoRA is what the engine's newest vllm:lora_requests_info series says of its LoRA
	// adapters; nil when the page has none.
	LoRA *LoRAInfo `json:"lora,omitempty"`
	// Ignored counts the samples of understood families that were dropped as invalid: NaN or
	// infinite, negative, a usage above 1, a capacity of 0 or an implausibly large count.
	Ignored int `json:"ignored"`
}

// MaxModels bounds Reading.Models: a page may label its series with any number of models.
const MaxModels = 16
