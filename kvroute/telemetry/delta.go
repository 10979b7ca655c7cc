package telemetry

import (
	"math"
	"slices"
)

// Anomalies is the set of things wrong with a pair of readings that Diff left out of a Delta.
type Anomalies uint8

// The anomalies Diff notices.
const (
	// AnomalyWobble: a total went back by less than a restart would (rounding, an exporter
	// adding up processes); that total's delta is left out.
	AnomalyWobble Anomalies = 1 << iota
	// AnomalyGone: a total of the previous reading is missing from this one.
	AnomalyGone
	// AnomalyModel: the engine serves other models than at the previous reading; no delta.
	AnomalyModel
	// AnomalyAbsurd: a delta faster than any engine (more than maxRate a second); left out.
	AnomalyAbsurd
	// AnomalyBuckets: the TTFT histogram's buckets changed, or a bucket went back.
	AnomalyBuckets
)

// maxRate bounds a plausible delta per second, in tokens or requests: 10^8 tokens a second is
// far beyond any engine behind one port.
const maxRate = 1e8

// restartWobble is how far a total may go back without meaning a restart: a thousandth of it,
// at least one (a restarted engine's totals go back to about zero).
func restartWobble(prev float64) float64 { return max(1, prev*1e-3) }

// Delta is what an engine's totals say of the interval between two readings.
type Delta struct {
	// Seconds between the two readings (the engine's answers).
	Seconds          float64 `json:"seconds"`
	PromptTokens     float64 `json:"prompt_tokens,omitempty"`
	ComputedTokens   float64 `json:"computed_tokens,omitempty"`
	CacheQueries     float64 `json:"cache_queries,omitempty"`
	CacheHits        float64 `json:"cache_hits,omitempty"`
	GenerationTokens float64 `json:"generation_tokens,omitempty"`
	PrefillSeconds   float64 `json:"prefill_seconds,omitempty"`
	PrefillRequests  float64 `json:"prefill_requests,omitempty"`
	DecodeSeconds    float64 `json:"decode_seconds,omitempty"`
	// TTFT is the histogram of the interval's first tokens; nil unless Known has HasTTFT.
	TTFT *Histogram `json:"ttft,omitempty"`
	// Known says which deltas are meaningful.
	Known CounterFields `json:"known"`
	// Restart: the engine restarted between the readings (a total went back by more than a
	// wobble, or its process start time changed); no delta is known then.
	Restart   bool      `json:"restart,omitempty"`
	Anomalies Anomalies `json:"anomalies,omitempty"`
}

// Diff compares two readings of one engine, prev before cur. A restart leaves every delta
// unknown: the totals since the restart are not an interval's.
func Diff(prev, cur *Reading) Delta {
	d := Delta{Seconds: cur.At.Sub(prev.At).Seconds()}
	p, c := &prev.Counters, &cur.Counters
	both := p.Known & c.Known
	if p.Known&^c.Known&^HasStartTime != 0 {
		d.Anomalies |= AnomalyGone
	}
	if both.Has(HasStartTime) && math.Abs(c.StartTime-p.StartTime) > 1 {
		d.Restart = true
	}
	type total struct {
		f          CounterFields
		prev, cur  float64
		out        *float64
		isRequests bool
	}
	totals := []total{
		{HasPromptTokens, p.PromptTokens, c.PromptTokens, &d.PromptTokens, false},
		{HasComputedTokens, p.ComputedTokens, c.ComputedTokens, &d.ComputedTokens, false},
		{HasCacheQueries, p.CacheQueries, c.CacheQueries, &d.CacheQueries, false},
		{HasCacheHits, p.CacheHits, c.CacheHits, &d.CacheHits, false},
		{HasGenerationTokens, p.GenerationTokens, c.GenerationTokens, &d.GenerationTokens, false},
		{HasPrefillTime, p.PrefillSeconds, c.PrefillSeconds, &d.PrefillSeconds, false},
		{HasDecodeTime, p.DecodeSeconds, c.DecodeSeconds, &d.DecodeSeconds, false},
	}
	if both.Has(HasPrefillTime) {
		totals = append(totals, total{0, p.PrefillRequests, c.PrefillRequests, &d.PrefillRequests, true})
	}
	if both.Has(HasTTFT) {
		totals = append(totals, total{0, p.TTFT.Count, c.TTFT.Count, new(float64), true})
	}
	var known CounterFields
	for _, t := range totals {
		if t.f != 0 && !both.Has(t.f) {
			continue
		}
		switch diff := t.cur - t.prev; {
		case diff < -restartWobble(t.prev):
			d.Restart = true
		case diff < 0:
			d.Anomalies |= AnomalyWobble
			if t.f != 0 {
				known &^= t.f
			}
		default:
			*t.out = diff
			if t.f != 0 {
				known |= t.f
			}
		}
	}
	if d.Restart {
		return Delta{Seconds: d.Seconds, Restart: true, Anomalies: d.Anomalies}
	}
	if !sameModels(prev, cur) {
		return Delta{Seconds: d.Seconds, Anomalies: d.Anomalies | AnomalyModel}
	}
	if !(d.Seconds > 0) {
		return Delta{Seconds: d.Seconds, Anomalies: d.Anomalies}
	}
	if both.Has(HasTTFT) {
		if h, ok := histogramDelta(p.TTFT, c.TTFT); ok {
			d.TTFT = h
			known |= HasTTFT
		} else {
			d.Anomalies |= AnomalyBuckets
		}
	}
	for _, t := range totals {
		if t.f != 0 && known.Has(t.f) && *t.out > maxRate*d.Seconds {
			d.Anomalies |= AnomalyAbsurd
			known &^= t.f
			*t.out = 0
		}
	}
	// Seconds of prefill or decode cannot exceed wall time by more than the engine's
	// concurrency allows; a million times the interval is no engine's.
	for _, t := range []struct {
		f CounterFields
		v *float64
	}{{HasPrefillTime, &d.PrefillSeconds}, {HasDecodeTime, &d.DecodeSeconds}} {
		if known.Has(t.f) && *t.v > 1e6*d.Seconds {
			d.Anomalies |= AnomalyAbsurd
			known &^= t.f
			*t.v = 0
		}
	}
	// Without an exported computed count, the prompt tokens not found in the cache are the
	// computed ones (SGLang; vLLM before prompt_tokens_by_source).
	if !known.Has(HasComputedTokens) && known.Has(HasPromptTokens|HasCacheHits) && d.CacheHits <= d.PromptTokens {
		d.ComputedTokens = d.PromptTokens - d.CacheHits
		known |= HasComputedTokens
	}
	d.Known = known
	return d
}

// HitRatio is the engine's own prefix-cache hit ratio over the interval: hits over queries, in
// tokens; false when unknown or nothing was queried.
func (d *Delta) HitRatio() (float64, bool) {
	if !d.Known.Has(HasCacheQueries|HasCacheHits) || d.CacheQueries <= 0 {
		return 0, false
	}
	return min(1, d.CacheHits/d.CacheQueries), true
}

// histogramDelta is cur − prev bucket by bucket; false when the buckets differ or one went back.
func histogramDelta(prev, cur *Histogram) (*Histogram, bool) {
	if prev == nil || cur == nil || !slices.Equal(prev.Bounds, cur.Bounds) {
		return nil, false
	}
	h := &Histogram{Count: cur.Count - prev.Count, Sum: cur.Sum - prev.Sum, Bounds: cur.Bounds, Counts: make([]float64, len(cur.Counts))}
	if h.Count < 0 || h.Sum < 0 {
		return nil, false
	}
	for i := range h.Counts {
		h.Counts[i] = cur.Counts[i] - prev.Counts[i]
		if h.Counts[i] < 0 || h.Counts[i] > h.Count || (i > 0 && h.Counts[i] < h.Counts[i-1]) {
			return nil, false
		}
	}
	return h, true
}

// sameModels reports whether two readings carry the same model labels.
func sameModels(a, b *Reading) bool {
	return slices.EqualFunc(a.Models, b.Models, func(x, y ModelFigures) bool { return x.Model == y.Model })
}
