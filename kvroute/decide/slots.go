package decide

import "slices"

// Slots learns an engine's batch slots (the requests it runs at once) and its mean output per
// request from timestamped observations of its gauges and counters, as kvroute's telemetry
// reads them and a simulator in virtual time produces them. The zero value is ready; it
// allocates nothing.
//
// No engine exports its slot count (vLLM's max_num_seqs, SGLang's max_running_requests,
// llama.cpp's --parallel): an engine that reports requests waiting runs as many as it can, so
// its running count then is its capacity (or what its KV cache allows, the one that counts).
// The figure is the median of the latest SlotWindow such readings, once there are
// MinSlotSamples: one odd reading does not move it. A queue can also form below the slot count
// (a chunked-prefill token budget, a burst between two scheduler steps), and a figure learned
// too low would keep the engine from ever queueing again to correct it: so a reading that
// shows more running than the figure is a sample too, queue or not, and a sample stands
// SlotSampleLife at most.
type Slots struct {
	samples [SlotWindow]slotSample // the latest samples, oldest first
	n       int
	// outputs are the latest windows' generation tokens and started requests, for the mean
	// output per request.
	outputs [OutputWindow][2]float64
	nOut    int
}

// Constants of Slots.
const (
	SlotWindow     = 5
	MinSlotSamples = 3
	// MaxSlots bounds a plausible slot count: vLLM's default max_num_seqs is 256 to 1,024.
	MaxSlots = 1 << 16
	// SlotSampleLife is how long a sample stands (nanoseconds): an engine reconfigured behind
	// its address is relearned within it.
	SlotSampleLife = int64(5 * 60 * 1e9)
	// OutputWindow is how many observations of the output the mean is taken over;
	// MinOutputRequests how many requests they must count.
	OutputWindow      = 9
	MinOutputRequests = 4
)

type slotSample struct{ running, at int64 }

// ObserveGauges takes in one reading of the engine's running and waiting gauges at at (unix
// nanoseconds): a queue with requests running is a sample of the capacity, and so is more
// running than the figure learned at at. Nothing running (an engine starting, a gauge not
// updated yet) or beyond MaxSlots is no sample.
func (s *Slots) ObserveGauges(running, waiting, at int64) {
	if running <= 0 || running > MaxSlots {
		return
	}
	if waiting <= 0 {
		if cur, _ := s.Figures(at); cur <= 0 || running <= cur {
			return
		}
	}
	if s.n == SlotWindow {
		copy(s.samples[:], s.samples[1:])
		s.n--
	}
	s.samples[s.n] = slotSample{running: running, at: at}
	s.n++
}

// ObserveOutput takes in one interval's generation tokens and the requests the engine started
// in it: their ratio over the latest OutputWindow intervals is the mean output per request
// (summed over the window, not averaged per interval: a request's tokens fall in the
// intervals it decodes in, its start in one). Negative or NaN figures are no observation.
func (s *Slots) ObserveOutput(generated, started float64) {
	if !(started >= 0) || !(generated >= 0) {
		return
	}
	s.outputs[s.nOut%OutputWindow] = [2]float64{generated, started}
	s.nOut++
}

// Reset forgets everything: a restarted engine may run with other settings.
func (s *Slots) Reset() { *s = Slots{} }

// Figures returns the slot count learned from the samples that stand at now (0: none) and the
// mean output tokens per request (0: none).
func (s *Slots) Figures(now int64) (slots int64, meanOutput float64) {
	var buf [SlotWindow]int64
	live := buf[:0]
	for _, x := range s.samples[:s.n] {
		if now-x.at <= SlotSampleLife {
			live = append(live, x.running)
		}
	}
	if len(live) >= MinSlotSamples {
		slices.Sort(live)
		slots = live[len(live)/2]
	}
	var tokens, requests float64
	for i := range min(s.nOut, OutputWindow) {
		tokens += s.outputs[i][0]
		requests += s.outputs[i][1]
	}
	if requests >= MinOutputRequests {
		meanOutput = tokens / requests
	}
	return slots, meanOutput
}
