package kvroute

import (
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/decide"
	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
)

// The slot signal of decision cost: an engine runs at most a fixed number of requests at once
// (vLLM's and llm-d's --max-num-seqs, SGLang's --max-running-requests, llama.cpp's --parallel),
// and a request that arrives while every slot is busy waits for a running request to finish
// its decode before its own prefill starts. In the demo's fleets a decode (hundreds of output
// tokens at 2 ms each) takes far longer than a prefill (thousands of tokens at 50 µs each), so
// on a full engine that wait is most of the time to first token, and the prefill queue alone
// does not see it (measured: docs/benchmarks.md "Issue 23", "Slots").
//
// No engine exports its slot count: vLLM's metrics carry CacheConfig (vllm:cache_config_info),
// not the scheduler's max_num_seqs, and SGLang's capacity gauge (max_running_requests_under_SLO)
// has no setter in its scheduler. It is learned from the readings instead: an engine that
// reports requests waiting runs as many as it can, so its running count then is its capacity
// (or, when its KV cache is what holds the queue back, the capacity that cache allows, which is
// the one that counts). The figure is the median of the latest slotWindow such readings, once
// there are minSlotSamples: one odd reading (a request that finished between the two gauges'
// updates, a preemption) does not move it. A queue can also form below the slot count (a
// chunked-prefill token budget, a burst between two scheduler steps), and a figure learned too
// low would keep the engine from ever queueing again to correct it: so a reading that shows
// more running than the figure is a sample too, queue or not, and a sample stands
// slotSampleLife at most (the term lapses, and the prediction is the prefill queue's alone,
// until the engine queues again).
//
// The estimator is decide.Slots, fed with each reading and interval at its time.
const (
	slotWindow     = decide.SlotWindow
	minSlotSamples = decide.MinSlotSamples
	// maxSlots bounds a plausible slot count: vLLM's default max_num_seqs is 256 to 1,024, a
	// reading far beyond is no engine's.
	maxSlots = decide.MaxSlots
	// maxSlotWaitSeconds bounds the predicted wait: whatever the figures, the prediction stays
	// a finite number of seconds that converts to a deadline in nanoseconds.
	maxSlotWaitSeconds = 3600.0
	// slotSampleLife is how long a sample of the slot count stands: an engine reconfigured or
	// replaced behind its address without a restart the counters show is relearned within it.
	slotSampleLife = time.Duration(decide.SlotSampleLife)
)

// slotLearn is what the readings teach about an upstream's batch: owned by its scrape
// goroutine (under upstreamLearn.mu), published in learnedFigures.
type slotLearn struct{ est decide.Slots }

// observe takes in one reading's gauges at now: a reading without both gauges is no sample.
// While the router holds requests back (held: its queue, queue.go), the engine's queue has
// moved to the router: an engine running its learned figure is full, and its reading is a
// sample as one with requests waiting would be. Without this the figure would lapse
// (slotSampleLife) while the router keeps the engines from queueing, the router would stop
// holding requests back, and the engines would queue until it was learned again.
func (s *slotLearn) observe(r *telemetry.Reading, now int64, held bool) {
	if !r.Known.Has(telemetry.HasRunning | telemetry.HasWaiting) {
		return
	}
	waiting := r.Waiting
	if held && waiting <= 0 {
		if cur, _ := s.est.Figures(now); cur > 0 && r.Running >= cur {
			waiting = 1
		}
	}
	s.est.ObserveGauges(r.Running, waiting, now)
}

// observeOutput takes in one interval's generation tokens and the requests the engine started
// (its TTFT count, else its prefill-time count).
func (s *slotLearn) observeOutput(d *telemetry.Delta) {
	started, ok := 0.0, false
	switch {
	case d.Known.Has(telemetry.HasTTFT) && d.TTFT != nil:
		started, ok = d.TTFT.Count, true
	case d.Known.Has(telemetry.HasPrefillTime):
		started, ok = d.PrefillRequests, true
	}
	if !ok || !d.Known.Has(telemetry.HasGenerationTokens) {
		return
	}
	s.est.ObserveOutput(d.GenerationTokens, started)
}

// reset forgets everything: a restarted engine may run with other settings.
func (s *slotLearn) reset() { s.est.Reset() }

// figures returns the slot count learned from the samples that stand at now (0: none) and
// the mean output tokens per request (0: none).
func (s *slotLearn) figures(now int64) (slots int64, meanOutput float64) { return s.est.Figures(now) }
