package telemetry

import (
	"math"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// CounterFields is the set of a Counters' totals that the engine exported with a valid value.
type CounterFields uint16

// The totals of Counters.
const (
	HasPromptTokens CounterFields = 1 << iota
	HasComputedTokens
	HasCacheQueries
	HasCacheHits
	HasGenerationTokens
	HasPrefillTime
	HasDecodeTime
	HasTTFT
	HasStartTime
)

var counterFieldNames = []struct {
	f    CounterFields
	name string
}{
	{HasPromptTokens, "prompt_tokens"}, {HasComputedTokens, "computed_tokens"},
	{HasCacheQueries, "cache_queries"}, {HasCacheHits, "cache_hits"},
	{HasGenerationTokens, "generation_tokens"}, {HasPrefillTime, "prefill_time"},
	{HasDecodeTime, "decode_time"}, {HasTTFT, "ttft"}, {HasStartTime, "start_time"},
}

// Has reports whether every field of want is in f.
func (f CounterFields) Has(want CounterFields) bool { return f&want == want }

// String lists the fields, as "prompt_tokens,cache_hits,..." (for the admin API).
func (f CounterFields) String() string {
	var names []string
	for _, n := range counterFieldNames {
		if f.Has(n.f) {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ",")
}

// MarshalText writes String.
func (f CounterFields) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

// Counters are the cumulative totals an engine exports since it started. A total is meaningful
// only when Known has its bit. What each engine exports (families as of vLLM v0.11, SGLang
// v0.5, llama.cpp's server in 2025, llm-d-inference-sim v0.10):
//
//   - PromptTokens, every prompt token the engine took in, cached or not: vllm:prompt_tokens_total,
//     sglang:prompt_tokens_total. llama.cpp's llamacpp:prompt_tokens_total counts only the
//     tokens it computed: it is ComputedTokens there, and llama.cpp has no PromptTokens.
//   - ComputedTokens, prompt tokens prefilled rather than found in a cache:
//     vllm:prompt_tokens_by_source_total{source="local_compute"} (newer vLLM), llama.cpp's
//     prompt tokens; else PromptTokens − CacheHits where both are known (Diff does that).
//   - CacheQueries and CacheHits, in tokens: vllm:prefix_cache_queries_total and _hits_total
//     (llm-d's simulator writes them without _total); SGLang: sglang:cached_tokens_total (every
//     cache_source) as hits, its prompt tokens as queries.
//   - GenerationTokens: vllm:generation_tokens_total, sglang:generation_tokens_total,
//     llamacpp:tokens_predicted_total.
//   - PrefillSeconds (and PrefillRequests, the requests they add up over): the _sum and _count
//     of vllm:request_prefill_time_seconds; llamacpp:prompt_seconds_total (no count).
//   - DecodeSeconds: the _sum of vllm:request_decode_time_seconds;
//     llamacpp:tokens_predicted_seconds_total.
//   - TTFT: vllm:time_to_first_token_seconds, sglang:time_to_first_token_seconds.
//   - StartTime: process_start_time_seconds (vLLM's and SGLang's Python exporters, Go exporters).
type Counters struct {
	PromptTokens     float64 `json:"prompt_tokens,omitempty"`
	ComputedTokens   float64 `json:"computed_tokens,omitempty"`
	CacheQueries     float64 `json:"cache_queries,omitempty"`
	CacheHits        float64 `json:"cache_hits,omitempty"`
	GenerationTokens float64 `json:"generation_tokens,omitempty"`
	PrefillSeconds   float64 `json:"prefill_seconds,omitempty"`
	PrefillRequests  float64 `json:"prefill_requests,omitempty"`
	DecodeSeconds    float64 `json:"decode_seconds,omitempty"`
	// TTFT is the time-to-first-token histogram; nil unless Known has HasTTFT.
	TTFT *Histogram `json:"ttft,omitempty"`
	// StartTime is the engine process's start, in Unix seconds.
	StartTime float64       `json:"start_time,omitempty"`
	Known     CounterFields `json:"known"`
}

// MaxBuckets bounds a histogram's buckets: the engines' have at most a few dozen.
const MaxBuckets = 64

// Histogram is a cumulative Prometheus histogram: Counts[i] observations at most Bounds[i],
// Bounds ascending (the +Inf bucket is Count).
type Histogram struct {
	Count  float64   `json:"count"`
	Sum    float64   `json:"sum"`
	Bounds []float64 `json:"bounds,omitempty"`
	Counts []float64 `json:"counts,omitempty"`
}

// Quantile estimates the q-quantile (0 < q < 1) by linear interpolation within the bucket that
// holds it, as Prometheus' histogram_quantile does; false when the histogram is empty or the
// quantile lies in the +Inf bucket.
func (h *Histogram) Quantile(q float64) (float64, bool) {
	if h == nil || h.Count <= 0 || len(h.Bounds) == 0 || !(q > 0 && q < 1) {
		return 0, false
	}
	rank := q * h.Count
	lower, below := 0.0, 0.0
	for i, b := range h.Bounds {
		if h.Counts[i] >= rank {
			in := h.Counts[i] - below
			if in <= 0 {
				return b, true
			}
			return lower + (b-lower)*(rank-below)/in, true
		}
		lower, below = b, h.Counts[i]
	}
	return 0, false
}

// maxCounter bounds a total: 10^15 tokens is thousands of GPU-years of prefill.
const maxCounter = 1e15

// Counter families: what each total is, per engine. Histograms are read whole (their _sum,
// _count and _bucket samples); part says which sample of a histogram feeds which total.
type counterKind uint8

const (
	cNone counterKind = iota
	cPromptTokens
	cComputedTokens // a sample counts only with source="local_compute" (vLLM's by_source)
	cComputedAll    // llama.cpp's prompt tokens: every sample
	cCacheQueries
	cCacheHits
	cGenerationTokens
	cPrefillSeconds // a plain counter of seconds
	cDecodeSeconds
	cPrefillHist // histogram: sum → PrefillSeconds, count → PrefillRequests
	cDecodeHist  // histogram: sum → DecodeSeconds
	cTTFTHist
	cStartTime
)

// counterFamilies maps each counter and histogram family to its engine and total; the names
// with and without _total are both read (llm-d's simulator leaves it out).
var counterFamilies = func() map[string]family {
	m := map[string]family{}
	add := func(e Engine, k counterKind, names ...string) {
		for _, n := range names {
			m[n] = family{engine: e, counter: k}
		}
	}
	add(EngineVLLM, cPromptTokens, "vllm:prompt_tokens_total", "vllm:prompt_tokens")
	add(EngineVLLM, cComputedTokens, "vllm:prompt_tokens_by_source_total", "vllm:prompt_tokens_by_source")
	add(EngineVLLM, cCacheQueries, "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries")
	add(EngineVLLM, cCacheHits, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")
	add(EngineVLLM, cGenerationTokens, "vllm:generation_tokens_total", "vllm:generation_tokens")
	add(EngineVLLM, cPrefillHist, "vllm:request_prefill_time_seconds")
	add(EngineVLLM, cDecodeHist, "vllm:request_decode_time_seconds")
	add(EngineVLLM, cTTFTHist, "vllm:time_to_first_token_seconds")
	for _, p := range []string{"sglang:", "sglang_"} {
		add(EngineSGLang, cPromptTokens, p+"prompt_tokens_total")
		add(EngineSGLang, cCacheHits, p+"cached_tokens_total")
		add(EngineSGLang, cGenerationTokens, p+"generation_tokens_total")
		add(EngineSGLang, cTTFTHist, p+"time_to_first_token_seconds")
	}
	add(EngineLlamaCpp, cComputedAll, "llamacpp:prompt_tokens_total")
	add(EngineLlamaCpp, cPrefillSeconds, "llamacpp:prompt_seconds_total")
	add(EngineLlamaCpp, cGenerationTokens, "llamacpp:tokens_predicted_total")
	add(EngineLlamaCpp, cDecodeSeconds, "llamacpp:tokens_predicted_seconds_total")
	add(EngineUnknown, cStartTime, "process_start_time_seconds")
	return m
}()

// histogramSuffixes are the sample names of a histogram family beyond its own name.
var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

func isHistogram(k counterKind) bool { return k == cPrefillHist || k == cDecodeHist || k == cTTFTHist }

// counterSlot is one series group of a total: the series that differ only in rank labels are
// one engine seen from each rank (their largest value counts); the others add up.
type counterSlot struct {
	kind   counterKind
	model  string
	engine string
}

// interpretCounters reads the totals of engine from the parsed families. It returns the number
// of samples dropped as invalid.
func interpretCounters(fams map[string]*dto.MetricFamily, engine Engine) (c Counters, ignored int) {
	values := map[counterSlot]float64{}
	hists := map[counterSlot]*Histogram{}
	for name, mf := range fams {
		f, ok := counterFamilies[name]
		if !ok || (f.engine != engine && f.engine != EngineUnknown) {
			if _, part := histogramPart(name); part {
				ignored += len(mf.GetMetric()) // a histogram's samples without its TYPE line
			}
			continue
		}
		for _, m := range mf.GetMetric() {
			s := counterSlot{kind: f.counter, model: modelOf(m), engine: engineKey(m)}
			if isHistogram(f.counter) {
				h, ok := histogramOf(m)
				if !ok {
					ignored++
					continue
				}
				if old := hists[s]; old == nil || h.Count > old.Count {
					hists[s] = h
				}
				continue
			}
			if f.counter == cComputedTokens && label(m, "source") != "local_compute" {
				continue
			}
			v, ok := scalarOf(m)
			if !ok || v > maxCounter || (f.counter == cStartTime && v < 1) {
				ignored++
				continue
			}
			if old, seen := values[s]; !seen || v > old {
				values[s] = v
			}
		}
	}
	for s, v := range values {
		switch s.kind {
		case cPromptTokens:
			c.PromptTokens += v
			c.Known |= HasPromptTokens
		case cComputedTokens, cComputedAll:
			c.ComputedTokens += v
			c.Known |= HasComputedTokens
		case cCacheQueries:
			c.CacheQueries += v
			c.Known |= HasCacheQueries
		case cCacheHits:
			c.CacheHits += v
			c.Known |= HasCacheHits
		case cGenerationTokens:
			c.GenerationTokens += v
			c.Known |= HasGenerationTokens
		case cPrefillSeconds:
			c.PrefillSeconds += v
			c.Known |= HasPrefillTime
		case cDecodeSeconds:
			c.DecodeSeconds += v
			c.Known |= HasDecodeTime
		case cStartTime:
			// Processes behind one page (vLLM's API server and engine cores) start apart: the
			// newest start is the one a restart changes.
			c.StartTime = max(c.StartTime, v)
			c.Known |= HasStartTime
		}
	}
	// Histograms of several engines behind one port add up when their buckets agree.
	merged := map[counterKind]*Histogram{}
	bad := map[counterKind]bool{}
	keys := make([]counterSlot, 0, len(hists))
	for s := range hists {
		keys = append(keys, s)
	}
	slices.SortFunc(keys, func(a, b counterSlot) int {
		return strings.Compare(a.model+"\x00"+a.engine, b.model+"\x00"+b.engine)
	})
	for _, s := range keys {
		h := hists[s]
		if bad[s.kind] {
			continue
		}
		cur := merged[s.kind]
		if cur == nil {
			merged[s.kind] = h
			continue
		}
		if !slices.Equal(cur.Bounds, h.Bounds) {
			bad[s.kind] = true
			delete(merged, s.kind)
			ignored++
			continue
		}
		sum := &Histogram{Count: cur.Count + h.Count, Sum: cur.Sum + h.Sum, Bounds: cur.Bounds, Counts: make([]float64, len(cur.Counts))}
		for i := range sum.Counts {
			sum.Counts[i] = cur.Counts[i] + h.Counts[i]
		}
		merged[s.kind] = sum
	}
	for k, h := range merged {
		switch k {
		case cPrefillHist:
			c.PrefillSeconds, c.PrefillRequests = h.Sum, h.Count
			c.Known |= HasPrefillTime
		case cDecodeHist:
			c.DecodeSeconds = h.Sum
			c.Known |= HasDecodeTime
		case cTTFTHist:
			c.TTFT = h
			c.Known |= HasTTFT
		}
	}
	// SGLang looks every prompt token up in its radix cache: its queries are its prompt tokens.
	if engine == EngineSGLang && c.Known.Has(HasPromptTokens|HasCacheHits) {
		c.CacheQueries = c.PromptTokens
		c.Known |= HasCacheQueries
	}
	return c, ignored
}

// histogramPart reports whether name is a histogram sample's name (_bucket, _sum, _count) of a
// known histogram family, and that family's name.
func histogramPart(name string) (string, bool) {
	for _, suf := range histogramSuffixes {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if f, known := counterFamilies[base]; known && isHistogram(f.counter) {
				return base, true
			}
		}
	}
	return "", false
}

// scalarOf returns a counter's, gauge's or untyped sample's value when it is finite and not
// negative.
func scalarOf(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.Counter != nil:
		v = m.Counter.GetValue()
	case m.Gauge != nil:
		v = m.Gauge.GetValue()
	case m.Untyped != nil:
		v = m.Untyped.GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false
	}
	return v, true
}

// histogramOf checks and copies a histogram sample: finite non-negative sum and count, at least
// one finite bucket, at most MaxBuckets, cumulative counts that never decrease and never
// exceed the count.
func histogramOf(m *dto.Metric) (*Histogram, bool) {
	dh := m.GetHistogram()
	if dh == nil {
		return nil, false
	}
	h := &Histogram{Count: float64(dh.GetSampleCount()), Sum: dh.GetSampleSum()}
	if dh.SampleCountFloat != nil {
		h.Count = dh.GetSampleCountFloat()
	}
	if !finiteNonNeg(h.Count) || !finiteNonNeg(h.Sum) || h.Count > maxCounter || h.Sum > maxCounter {
		return nil, false
	}
	type bucket struct{ le, n float64 }
	var bs []bucket
	for _, b := range dh.GetBucket() {
		le := b.GetUpperBound()
		n := float64(b.GetCumulativeCount())
		if b.CumulativeCountFloat != nil {
			n = b.GetCumulativeCountFloat()
		}
		if math.IsInf(le, 1) {
			continue // the +Inf bucket is the count
		}
		if math.IsNaN(le) || math.IsInf(le, -1) || !finiteNonNeg(n) {
			return nil, false
		}
		bs = append(bs, bucket{le, n})
		if len(bs) > MaxBuckets {
			return nil, false
		}
	}
	if len(bs) == 0 {
		return nil, false
	}
	slices.SortFunc(bs, func(a, b bucket) int {
		switch {
		case a.le < b.le:
			return -1
		case a.le > b.le:
			return 1
		}
		return 0
	})
	h.Bounds = make([]float64, len(bs))
	h.Counts = make([]float64, len(bs))
	for i, b := range bs {
		if i > 0 && (b.le == bs[i-1].le || b.n < bs[i-1].n) {
			return nil, false
		}
		h.Bounds[i], h.Counts[i] = b.le, b.n
	}
	if h.Counts[len(bs)-1] > h.Count {
		return nil, false
	}
	return h, true
}

func finiteNonNeg(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) && v >= 0 }
