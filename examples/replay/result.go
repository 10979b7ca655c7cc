package replay

import (
	"math"
	"slices"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
)

// Record is the measurement of one call.
type Record struct {
	Seq              int     `json:"seq"` // send order
	Session          string  `json:"session"`
	Turn             int     `json:"turn"`
	Worker           string  `json:"worker,omitempty"`     // from the X-Kvsim-Worker header
	Replica          string  `json:"replica,omitempty"`    // from the X-Kvroute-Replica header (a front's)
	RequestID        string  `json:"request_id,omitempty"` // from the X-Request-Id header (the demo's -diagnose)
	Status           int     `json:"status,omitempty"`
	Error            string  `json:"error,omitempty"`
	StartMs          float64 `json:"start_ms"` // from the start of the replay
	TTFTMs           float64 `json:"ttft_ms"`
	LatencyMs        float64 `json:"latency_ms"`
	PromptTokens     int     `json:"prompt_tokens"`
	CachedTokens     int     `json:"cached_tokens"`
	CompletionTokens int     `json:"completion_tokens"`

	prompt llmsim.Prompt // as the simulator sees it, for the reference
}

// Result is the summary of a replay. Ratios are in [0, 1], times in milliseconds.
type Result struct {
	Workload    string  `json:"workload"`
	Mode        string  `json:"mode"` // "closed" or "open"
	Concurrency int     `json:"concurrency,omitempty"`
	TimeScale   float64 `json:"time_scale,omitempty"`
	Interrupted bool    `json:"interrupted,omitempty"`

	Requests int `json:"requests"` // calls sent
	Errors   int `json:"errors"`   // non-2xx, transport errors, broken streams, calls cut by ctx

	// Hit ratio = Σ cached / Σ prompt tokens over the successful calls, as the workers
	// reported them.
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	HitRatio     float64 `json:"hit_ratio"`
	// ReferenceHitRatio is what one LRU cache of FleetBlocks blocks would have hit on the
	// same prompts in the same order (0 when FleetBlocks is 0); InfiniteHitRatio, an unlimited
	// cache. Both count tokens as the simulator does.
	FleetBlocks       int     `json:"fleet_blocks"`
	BlockTokens       int     `json:"block_tokens"`
	ReferenceHitRatio float64 `json:"reference_hit_ratio"`
	InfiniteHitRatio  float64 `json:"infinite_hit_ratio"`

	TTFTP50Ms    float64 `json:"ttft_p50_ms"`
	TTFTP99Ms    float64 `json:"ttft_p99_ms"`
	LatencyP50Ms float64 `json:"latency_p50_ms"`
	LatencyP99Ms float64 `json:"latency_p99_ms"`

	// PerWorker counts successful calls by serving worker; Imbalance = max / mean of it
	// (1 is perfect balance).
	PerWorker map[string]int `json:"per_worker"`
	Imbalance float64        `json:"imbalance"`

	WallSeconds       float64 `json:"wall_seconds"`
	RequestsPerSecond float64 `json:"requests_per_second"`

	ErrorSamples []string `json:"error_samples,omitempty"` // the first few distinct errors
	Records      []Record `json:"records,omitempty"`       // with Options.KeepRecords
}

const maxErrorSamples = 5

// summarize computes the result of the calls recorded, in send order.
func summarize(recs []Record, opts Options, wall time.Duration) *Result {
	res := &Result{
		Mode:        "closed",
		Concurrency: opts.Concurrency,
		Requests:    len(recs),
		FleetBlocks: opts.FleetBlocks,
		BlockTokens: opts.BlockTokens,
		PerWorker:   map[string]int{},
		WallSeconds: wall.Seconds(),
	}
	if opts.OpenLoop {
		res.Mode, res.Concurrency, res.TimeScale = "open", 0, opts.TimeScale
	}
	var ttft, latency []float64
	var prompts []llmsim.Prompt
	for _, rec := range recs {
		if rec.Error != "" {
			res.Errors++
			if len(res.ErrorSamples) < maxErrorSamples && !slices.Contains(res.ErrorSamples, rec.Error) {
				res.ErrorSamples = append(res.ErrorSamples, rec.Error)
			}
			continue
		}
		res.PromptTokens += int64(rec.PromptTokens)
		res.CachedTokens += int64(rec.CachedTokens)
		ttft = append(ttft, rec.TTFTMs)
		latency = append(latency, rec.LatencyMs)
		worker := rec.Worker
		if worker == "" {
			worker = "unknown"
		}
		res.PerWorker[worker]++
		prompts = append(prompts, rec.prompt)
	}
	res.HitRatio = ratio(res.CachedTokens, res.PromptTokens)
	res.ReferenceHitRatio, res.InfiniteHitRatio = HitRatios(prompts, opts.FleetBlocks)
	res.TTFTP50Ms, res.TTFTP99Ms = percentile(ttft, 0.50), percentile(ttft, 0.99)
	res.LatencyP50Ms, res.LatencyP99Ms = percentile(latency, 0.50), percentile(latency, 0.99)
	res.Imbalance = imbalance(res.PerWorker, opts.Workers)
	if wall > 0 {
		res.RequestsPerSecond = float64(len(recs)-res.Errors) / wall.Seconds()
	}
	if opts.KeepRecords {
		res.Records = recs
	}
	return res
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// percentile returns the nearest-rank p-quantile of xs (which it sorts), 0 for none.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	i := int(math.Ceil(p*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// imbalance returns max / mean of the counts, the mean taken over workers (when larger than
// the workers seen, so that idle workers count).
func imbalance(counts map[string]int, workers int) float64 {
	total, most := 0, 0
	for _, n := range counts {
		total += n
		most = max(most, n)
	}
	if total == 0 {
		return 0
	}
	return float64(most) / (float64(total) / float64(max(workers, len(counts))))
}
