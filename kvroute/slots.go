package kvroute

import (
	"slices"
	"time"

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
const (
	slotWindow     = 5
	minSlotSamples = 3
	// maxSlots bounds a plausible slot count: vLLM's default max_num_seqs is 256 to 1,024, a
	// reading far beyond is no engine's.
	maxSlots = 1 << 16
	// maxSlotWaitSeconds bounds the predicted wait: whatever the figures, the prediction stays
	// a finite number of seconds that converts to a deadline in nanoseconds.
	maxSlotWaitSeconds = 3600.0
	// minOutputRequests is how many requests an interval window must count before the mean
	// output is learned from it.
	minOutputRequests = 4
	// slotSampleLife is how long a sample of the slot count stands: an engine reconfigured or
	// replaced behind its address without a restart the counters show is relearned within it.
	slotSampleLife = 5 * time.Minute
)

// slotLearn is what the readings teach about an upstream's batch: owned by its scrape
// goroutine (under upstreamLearn.mu), published in learnedFigures.
type slotLearn struct {
	samples []slotSample // the latest readings that reported a queue, or more running than the figure
	// outputs are the latest intervals' generation tokens and started requests, for the
	// mean output per request.
	outputs [speedWindow][2]float64
	nOut    int
}

// slotSample is one reading's running count, at the reading's time (unix nanoseconds).
type slotSample struct{ running, at int64 }

// observe takes in one reading's gauges: a queue with requests running is a sample of the
// capacity, and so is more running than the figure learned at now. A reading without both
// gauges, with nothing running (an engine starting, a gauge not updated yet), or beyond
// maxSlots is no sample.
func (s *slotLearn) observe(r *telemetry.Reading, now int64) {
	if !r.Known.Has(telemetry.HasRunning|telemetry.HasWaiting) || r.Running <= 0 || r.Running > maxSlots {
		return
	}
	if r.Waiting <= 0 {
		if cur, _ := s.figures(now); cur <= 0 || r.Running <= cur {
			return
		}
	}
	if len(s.samples) == slotWindow {
		s.samples = append(s.samples[:0], s.samples[1:]...)
	}
	s.samples = append(s.samples, slotSample{running: r.Running, at: now})
}

// observeOutput takes in one interval's generation tokens and the requests the engine started
// (its prefill-time or TTFT count): their ratio over the latest intervals is the mean output
// per request. Tokens and requests are summed over the window, not averaged per interval: a
// request's tokens fall in the intervals it decodes in, its start in one.
func (s *slotLearn) observeOutput(d *telemetry.Delta) {
	started, ok := 0.0, false
	switch {
	case d.Known.Has(telemetry.HasTTFT) && d.TTFT != nil:
		started, ok = d.TTFT.Count, true
	case d.Known.Has(telemetry.HasPrefillTime):
		started, ok = d.PrefillRequests, true
	}
	if !ok || !d.Known.Has(telemetry.HasGenerationTokens) || !(started >= 0) || !(d.GenerationTokens >= 0) {
		return
	}
	s.outputs[s.nOut%speedWindow] = [2]float64{d.GenerationTokens, started}
	s.nOut++
}

// reset forgets everything: a restarted engine may run with other settings.
func (s *slotLearn) reset() { *s = slotLearn{samples: s.samples[:0]} }

// figures returns the slot count learned from the samples that stand at now (0: none) and
// the mean output tokens per request (0: none).
func (s *slotLearn) figures(now int64) (slots int64, meanOutput float64) {
	var buf [slotWindow]int64
	live := buf[:0]
	for _, x := range s.samples {
		if now-x.at <= int64(slotSampleLife) {
			live = append(live, x.running)
		}
	}
	if len(live) >= minSlotSamples {
		slices.Sort(live)
		slots = live[len(live)/2]
	}
	var tokens, requests float64
	for i := range min(s.nOut, speedWindow) {
		tokens += s.outputs[i][0]
		requests += s.outputs[i][1]
	}
	if requests >= minOutputRequests {
		meanOutput = tokens / requests
	}
	return slots, meanOutput
}
