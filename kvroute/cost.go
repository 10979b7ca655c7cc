package kvroute

import "github.com/kvroute/caddy-kvroute/kvroute/decide"

// decision cost (docs/decision.md): every candidate gets a predicted time to first token, and
// the choice is made on those (kvroute/decide: the signals, the session's bound and the
// ranking). What the signals read is gathered in select.go (facts):
//
//	ttft = (queued + uncached) / speed + slot wait
//
// queued: the prefill work ahead of the request there, in tokens: the uncached tokens of the
// requests this replica and its peers sent that have not produced a first token (prefill.go),
// or, when larger, the engine's own waiting queue (telemetry) at the mean uncached prompt
// sent there. uncached: the request's prompt tokens minus those the candidate holds. speed:
// the candidate's prefill speed, learned from its engine (learn.go), else the upstream
// block's prefill_tokens_per_second, else DefaultPrefillTokensPerSecond. slot wait: the time
// the request waits for one of the candidate's batch slots when the requests in flight there
// fill them (slots.go; 0 until the slot count is learned). A term that delays a first token
// on one candidate and not another (loading a LoRA adapter) adds to the sum. Under objective
// completion each candidate also gets the request's decode time there, kept apart from the
// TTFT.

// Decision rules (the decision option).
const (
	decisionCost       = "cost"
	decisionThresholds = "thresholds"
)

// Objectives of decision cost.
const (
	objectiveLatency = "latency"
	// objectiveCompletion: latency, a warm upstream also kept only while the request's decode
	// there, at its engine's learned speed, is no slower than a move costs (keepsWarm).
	objectiveCompletion = "completion"
	objectiveEnergy     = "energy"
	objectiveCarbon     = "carbon"
)

// costPrediction is one candidate's predicted cost (decide.Prediction).
type costPrediction struct {
	uncached int64   // prompt tokens it would prefill
	queued   int64   // prefill tokens ahead of the request there
	speed    float64 // prefill tokens per second
	slot     float64 // seconds waiting for a batch slot
	ttft     float64 // seconds
	// decode: seconds the request's output takes there (objective completion; 0 where not
	// learned); slower: what that is beyond the fastest candidate's and a tolerance.
	decode, slower float64
}

func predictionOf(d *decide.Prediction) costPrediction {
	return costPrediction{uncached: d.Uncached, queued: d.Queued, speed: d.Speed, slot: d.Slot, ttft: d.TTFT, decode: d.Decode, slower: d.Slower}
}

// DefaultAdapterLoadSeconds is what one LoRA adapter load adds to a request's time to first
// token where the adapter is not warm (adapterCost: 1 with a free slot, 2 when it evicts
// another adapter): vLLM loads an adapter from CPU memory or disk before the batch can run
// it, tens to hundreds of milliseconds for a rank-16 adapter of a 7-8B model. A default, not
// learned yet: it only has to outweigh the noise between otherwise equal candidates.
const DefaultAdapterLoadSeconds = decide.AdapterLoadSeconds

// meanUncachedTokens is the mean uncached prompt, in tokens, of what this router sent u (at
// the default chars per token: the figure weighs a count of requests, roughly is enough).
func (u *upstreamState) meanUncachedTokens() float64 {
	n := u.learn.sent.requests.Load()
	if n <= 0 {
		return 0
	}
	chars := u.learn.sent.chars.Load() - u.learn.sent.matched.Load()
	return max(0, float64(chars)/float64(n)/DefaultCharsPerToken)
}

// DecodePoolCost is a candidate's cost in a disaggregated decode pool (issue 25: the decode
// leg after a remote prefill), in seconds: the KV the candidate must receive (the prompt's
// tokens it does not hold, at transferTokensPerSecond) plus the decode work already running
// there (decodeTokens in flight, at decodeTokensPerSecond). It runs no prefill, so prefill
// speed and queue do not enter. A speed that is not positive counts its term as free.
func DecodePoolCost(promptTokens, heldTokens int64, transferTokensPerSecond float64, decodeTokens int64, decodeTokensPerSecond float64) float64 {
	cost := 0.0
	if transferTokensPerSecond > 0 {
		cost += float64(max(0, promptTokens-heldTokens)) / transferTokensPerSecond
	}
	if decodeTokensPerSecond > 0 {
		cost += float64(max(0, decodeTokens)) / decodeTokensPerSecond
	}
	return cost
}
