package telemetry

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// loraFamily is vLLM's gauge of the LoRA adapters of its running and waiting requests (also
// llm-d's simulator's; the Gateway API Inference Extension's model-server protocol reads it).
// Each update sets the series of its label set (running_lora_adapters, waiting_lora_adapters,
// max_lora) to the current unix time, and the older series stay on the page: the newest
// series is the engine's present.
const loraFamily = "vllm:lora_requests_info"

// Bounds of what a lora_requests_info family may cost.
const (
	// maxLoRASeries bounds the series read (kept apart from maxSamples: the engine keeps one
	// per label set it ever wrote).
	maxLoRASeries = 4096
	// MaxActiveAdapters bounds the adapters kept of one list (running or waiting).
	MaxActiveAdapters = 64
	// maxMaxLoRA: no engine keeps more adapters than this on its GPUs.
	maxMaxLoRA = 1 << 16
)

// LoRAInfo is what an engine's newest lora_requests_info series says.
type LoRAInfo struct {
	// Running and Waiting name the adapters of the running and the waiting requests, sorted,
	// each at most MaxActiveAdapters. Both are empty when the engine is idle: they say which
	// adapters are active, not which are loaded.
	Running []string `json:"running"`
	Waiting []string `json:"waiting"`
	// MaxLoRA is how many adapters the engine keeps in GPU memory at once (vLLM's
	// --max-loras); 0 when the series does not say.
	MaxLoRA int `json:"max_lora"`
	// At is the series' value: when the engine last updated it.
	At time.Time `json:"at"`
}

// Active reports whether adapter is among the running or waiting adapters.
func (l *LoRAInfo) Active(adapter string) bool {
	return l != nil && (slices.Contains(l.Running, adapter) || slices.Contains(l.Waiting, adapter))
}

// loraInfo reads the newest series of a lora_requests_info family. Series whose value ties
// with the newest (the simulator writes whole seconds) are merged: an adapter in any of them
// was active within that second. bad counts the series dropped as invalid.
func loraInfo(mf *dto.MetricFamily) (info *LoRAInfo, bad int) {
	newest := math.Inf(-1)
	var top []*dto.Metric
	for _, m := range mf.GetMetric() {
		var v float64
		switch {
		case m.Gauge != nil:
			v = m.Gauge.GetValue()
		case m.Untyped != nil:
			v = m.Untyped.GetValue()
		default:
			bad++
			continue
		}
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > 1e11 || !loraLabelled(m) {
			bad++
			continue
		}
		switch {
		case v > newest:
			newest, top = v, append(top[:0], m)
		case v == newest:
			top = append(top, m)
		}
	}
	if len(top) == 0 {
		return nil, bad
	}
	sec, frac := math.Modf(newest)
	info = &LoRAInfo{Running: []string{}, Waiting: []string{}, At: time.Unix(int64(sec), int64(frac*1e9)).UTC()}
	for _, m := range top {
		info.Running = addAdapters(info.Running, label(m, "running_lora_adapters"))
		info.Waiting = addAdapters(info.Waiting, label(m, "waiting_lora_adapters"))
		if n, err := strconv.ParseFloat(label(m, "max_lora"), 64); err == nil && n >= 1 && n <= maxMaxLoRA && n == math.Trunc(n) {
			info.MaxLoRA = max(info.MaxLoRA, int(n))
		}
	}
	slices.Sort(info.Running)
	slices.Sort(info.Waiting)
	return info, bad
}

// loraLabelled reports whether a series carries any of the labels vLLM writes on
// lora_requests_info (it writes all three, empty lists included): a series with none of them
// says nothing of the engine's adapters and is not taken for a reading.
func loraLabelled(m *dto.Metric) bool {
	for _, lp := range m.GetLabel() {
		switch lp.GetName() {
		case "max_lora", "running_lora_adapters", "waiting_lora_adapters":
			return true
		}
	}
	return false
}

// addAdapters adds the adapters of a comma-separated label value to dst, without duplicates,
// up to MaxActiveAdapters.
func addAdapters(dst []string, list string) []string {
	for a := range strings.SplitSeq(list, ",") {
		a = strings.TrimSpace(a)
		if a == "" || len(a) > maxModelID || slices.Contains(dst, a) {
			continue
		}
		if len(dst) == MaxActiveAdapters {
			break
		}
		dst = append(dst, a)
	}
	return dst
}
