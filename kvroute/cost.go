package kvroute

import (
	"math"
	"time"

	"github.com/kvroute/caddy-kvroute/energy"
)

// decision cost (docs/decision.md): every candidate gets a predicted time to first token, and
// the choice is made on those. The signals are small functions over one candidate (match,
// queue, speed, energy), combined in predict; the session and the objective read the result.
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
// fill them (slotWait, slots.go; 0 until the slot count is learned). A term that delays a first
// token on one candidate and not another (loading a LoRA adapter) adds to the sum. Under
// objective completion each candidate also gets the request's decode time there (decodeTime),
// kept apart from the TTFT.

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

// minSlackSeconds is the least difference in predicted TTFT that moves a session: below one
// engine step (tens of milliseconds), predictions differ by noise, and a session that moved
// on noise would leave its cache for nothing.
const minSlackSeconds = 0.02

// costPrediction is one candidate's predicted cost.
type costPrediction struct {
	uncached int64   // prompt tokens it would prefill
	queued   int64   // prefill tokens ahead of the request there
	speed    float64 // prefill tokens per second
	slot     float64 // seconds waiting for a batch slot
	ttft     float64 // seconds
	// decode: seconds the request's output takes there at the engine's learned decode speed
	// (0 where it is not learned, and under objectives other than completion); slower: what
	// that is beyond (1 + decodeTolerance) × the fastest candidate's (else 0, markSlower). Not
	// part of the TTFT: keepsWarm and a move weigh slower.
	decode, slower float64
}

// costInputs are what predict needs of the request, computed once per decision.
type costInputs struct {
	prompt        int64   // the prompt's tokens
	charsPerToken float64 // the model's
	now           int64   // unix nanoseconds
	output        float64 // the output tokens expected of the request (decodeOutput)
}

// predict fills every candidate's prediction.
func (p *KVCacheAware) predict(cands []candidate, in costInputs) {
	for i := range cands {
		c := &cands[i]
		c.cost.uncached = uncachedTokens(c, in)
		c.cost.queued = p.queuedTokens(c, in.now)
		c.cost.speed = p.prefillSpeed(c)
		c.cost.slot = p.slotWait(c, in.now)
		c.cost.ttft = float64(c.cost.queued+c.cost.uncached)/c.cost.speed + c.cost.slot + adapterCost(c)*DefaultAdapterLoadSeconds
		c.cost.decode = decodeTime(c, in.output, in.now)
	}
	markSlower(cands)
}

// markSlower sets each candidate's slower: its decode time beyond the fastest candidate's
// and a tolerance of decodeTolerance of it (continuous: a decode a hair past the tolerance is
// a hair slower, not a tenth).
func markSlower(cands []candidate) {
	fastest := math.Inf(1)
	for i := range cands {
		if d := cands[i].cost.decode; d > 0 {
			fastest = min(fastest, d)
		}
	}
	for i := range cands {
		c := &cands[i]
		c.cost.slower = 0
		if d := c.cost.decode - fastest*(1+decodeTolerance); d > 0 {
			c.cost.slower = d
		}
	}
}

// decodeTolerance is the share of the fastest candidate's decode time within which another's
// is the same: like engines' learned decode speeds differ by a few percent from noise alone
// (llm-d's simulator: 413 to 420 tokens per second per request), and ranking cold candidates
// by that noise instead of their load would place requests at random.
const decodeTolerance = 0.1

// decodeTime is the decode signal: the seconds output tokens take on c at its engine's
// learned per-request decode speed; 0 where none is learned, or without a fresh reading of the
// engine (as slotWait: with telemetry off since, its reader gone or its metrics failing, the
// figure may be another engine's by now). A 0 weighs nothing against any candidate
// (markSlower): an unknown speed is no evidence of a slow one.
func decodeTime(c *candidate, output float64, now int64) float64 {
	f := c.st.learn.figures.Load()
	if f == nil || !f.DecodeLearned || !(f.DecodeTokensPerSecond > 0) || !(output > 0) {
		return 0
	}
	if !c.st.freshReading(now) {
		return 0
	}
	return output / f.DecodeTokensPerSecond
}

// freshReading reports whether u's engine has a reading that still stands at now: the figures
// learned from it are then its engine's, not those of one that has since taken its address.
func (u *upstreamState) freshReading(now int64) bool {
	e := u.engine.Load()
	return e != nil && now <= e.until
}

// decodeOutput is the output expected of a request for the decode signal, the same for every
// candidate: the mean of the mean outputs per request the candidates' engines report
// (slots.go) when every one has reported one, else expected_tokens (the cluster does not carry
// the mean output: a replica that reads only some engines must still compute the costs its
// peers do); at most the request's max_tokens. 0 (no decode signal) unless the objective is
// completion: objective latency ranks by the time to the first token alone.
func (p *KVCacheAware) decodeOutput(cands []candidate, req *llmRequest) float64 {
	if p.opts.objective != objectiveCompletion {
		return 0
	}
	out, sum := float64(p.opts.expectedTokens), 0.0
	for i := range cands {
		f := cands[i].st.learn.figures.Load()
		if f == nil || !(f.MeanOutputTokens > 0) {
			sum = 0 // one without: expected_tokens for all
			break
		}
		sum += f.MeanOutputTokens
	}
	if sum > 0 {
		out = sum / float64(len(cands))
	}
	if req.MaxTokens > 0 {
		out = min(out, float64(req.MaxTokens))
	}
	return out
}

// DefaultAdapterLoadSeconds is what one LoRA adapter load adds to a request's time to first
// token where the adapter is not warm (adapterCost: 1 with a free slot, 2 when it evicts
// another adapter): vLLM loads an adapter from CPU memory or disk before the batch can run
// it, tens to hundreds of milliseconds for a rank-16 adapter of a 7-8B model. A default, not
// learned yet: it only has to outweigh the noise between otherwise equal candidates.
const DefaultAdapterLoadSeconds = 0.25

// uncachedTokens is the match signal: the prompt's tokens the candidate does not hold.
func uncachedTokens(c *candidate, in costInputs) int64 {
	held := int64(math.Round(float64(c.match) / in.charsPerToken))
	return max(0, in.prompt-held)
}

// queuedTokens is the queue signal: the prefill tokens ahead of a request sent to c now. Each
// request counts once: the engine's waiting queue holds this router's and its peers'
// requests too, so the larger of the two figures counts, not their sum.
func (p *KVCacheAware) queuedTokens(c *candidate, now int64) int64 {
	c.st.expirePrefill(now)
	routed := max(0, c.st.prefillTokens.Load()) + p.state.peersPrefill(c.up.Dial)
	return max(routed, c.st.waitingTokens(now))
}

// waitingTokens is the engine's reported waiting queue in tokens: its count at the mean
// uncached prompt this router sent the upstream (0 without a fresh reading).
func (u *upstreamState) waitingTokens(now int64) int64 {
	e := u.engine.Load()
	if e == nil || now > e.until || e.waiting <= 0 {
		return 0
	}
	return int64(float64(e.waiting) * u.meanUncachedTokens())
}

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

// prefillSpeed is the speed signal: the candidate's prefill tokens per second, learned from
// its engine's totals, else from single answers (llm_feedback), else its upstream block's
// prior, else the default.
func (p *KVCacheAware) prefillSpeed(c *candidate) float64 {
	if f := c.st.learn.figures.Load(); f != nil && f.PrefillLearned && f.PrefillTokensPerSecond > 0 {
		return f.PrefillTokensPerSecond
	}
	if v := math.Float64frombits(c.st.learn.answerSpeed.Load()); v > 0 {
		return v
	}
	if c.prof != nil && c.prof.PrefillTokensPerSecond > 0 {
		return c.prof.PrefillTokensPerSecond
	}
	return DefaultPrefillTokensPerSecond
}

// bestTTFT is the lowest predicted TTFT among the candidates within the balance band.
func bestTTFT(cands []candidate, b band) float64 {
	best := math.Inf(1)
	for i := range cands {
		if b.holds(cands[i].load) {
			best = min(best, cands[i].cost.ttft)
		}
	}
	return best
}

// ttftBound is the predicted TTFT within ttft_slack of best: the energy objective chooses up
// to it, and a warm upstream keeps a request up to it (best then priced by moveBound).
func ttftBound(best, slack float64) float64 {
	return best + max(best*slack, minSlackSeconds)
}

// moveBound is the predicted TTFT up to which w, the candidate a request is warm on (its
// session's upstream, or the one holding its longest prefix), keeps it: within ttft_slack of
// the best candidate in the band, each priced at its predicted TTFT plus what moving there
// forfeits. A prefix that w holds, moved, is paid twice (forfeit); a request w holds little
// of is free to go.
func moveBound(cands []candidate, b band, w *candidate) float64 {
	best := math.Inf(1)
	for i := range cands {
		if c := &cands[i]; b.holds(c.load) {
			best = min(best, c.cost.ttft+forfeit(c, w))
		}
	}
	return ttftBound(best, b.slack)
}

// keepsWarm reports whether w, the candidate a request is warm on, keeps it: its predicted TTFT
// within moveBound, and the time it costs beyond the best move in what is not prefill work
// (its wait for a batch slot, and the request's decode at a slower engine) no longer than what
// that move costs (its prefill of the prompt and what it forfeits). ttft_slack is a tolerance
// in units of that cost, for the churn a move brings to caches smaller than the working set;
// a slot wait or a slower decode is not made of prefill work, and in a fleet whose decodes
// take far longer than its prefills (llm-d's simulator: 2 slots, 0.4 s of decode against 10 ms
// of prefill) a tolerance of 5 such costs let a warm engine keep requests until their wait was
// a second or more (docs/benchmarks.md "Issue 23", "Slots"); under objective completion, a warm
// engine 4× slower at decode kept conversations whose every turn took a second longer there
// than a move's 0.1 s ("Fifth round"). Without a learned slot count and a slower decode (the
// decode signal is 0 under objective latency) this is moveBound alone.
func keepsWarm(cands []candidate, b band, w *candidate) bool {
	if w.cost.ttft > moveBound(cands, b, w) {
		return false
	}
	if w.cost.slot <= 0 && w.cost.slower <= 0 {
		return true
	}
	// The best move: the alternative to w that costs least, its slower decode counted as the
	// ranking of a move counts it (byCost). (Were w the cheapest on its TTFT, the slot rule
	// would keep it anyway: its slot wait beyond any alternative's is then less than that
	// alternative costs; a slower decode is not in the TTFT.)
	best, rank := -1, math.Inf(1)
	for i := range cands {
		if c := &cands[i]; c != w && b.holds(c.load) && c.cost.ttft+forfeit(c, w)+c.cost.slower < rank {
			best, rank = i, c.cost.ttft+forfeit(c, w)+c.cost.slower
		}
	}
	if best < 0 {
		return true
	}
	c := &cands[best]
	move := c.cost.ttft + forfeit(c, w)
	extra := w.cost.slot - c.cost.slot + w.cost.slower - c.cost.slower
	return extra <= max(move-c.cost.slot, minSlackSeconds)
}

// forfeit is what sending the request to c instead of w gives away beyond c's predicted TTFT:
// the prompt tokens w holds and c does not, at c's speed, once more. c prefills them now (its
// TTFT counts that) and they take as much of c's cache, which the requests that were cached
// there pay for again: with caches smaller than the working set, that second prefill is as
// sure as the first (measured, docs/benchmarks.md "Issue 23": deciding on the TTFT alone moved
// warm requests and sessions for a few milliseconds and lost 0.02 to 0.12 of hit ratio).
func forfeit(c, w *candidate) float64 {
	if w == nil {
		return 0
	}
	return float64(max(0, c.cost.uncached-w.cost.uncached)) / c.cost.speed
}

// byCost runs decision cost's choice among the candidates within the balance band: the count
// of requests in flight is what the router sees at decision time of the decode batch a request
// joins (an engine whose batch is full makes a new request wait for a slot, whatever its
// prefill queue: measured, docs/benchmarks.md "Issue 23"), so the band still bounds it where
// the slot term (slotWait) cannot price that wait: an engine that never queues teaches no
// slot count. Among those, the candidate holding the longest prefix keeps the request while
// its predicted TTFT is within ttft_slack of the best move, what a move forfeits counted
// (moveBound: "sticky until saturated"); past it, the lowest predicted TTFT plus forfeit. With
// objective energy or carbon, the fewest predicted joules (grams) among those within
// ttft_slack of the best, a move away from the warmest priced at the joules (grams) it
// forfeits. Ties go to the less busy, then the one holding less, then at random. The path
// says why: prefix_hit when the choice holds the longest match, imbalance when a candidate
// held more and its queue or load made it too slow, fallback when none held any.
func (p *KVCacheAware) byCost(cands []candidate, req *llmRequest, b band) (int, int) {
	inBand := func(c *candidate) bool { return b.holds(c.load) }
	var warmest *candidate
	w := longest(cands, inBand)
	if w >= 0 {
		warmest = &cands[w]
	}
	chosen := -1
	switch p.opts.objective {
	case objectiveEnergy, objectiveCarbon:
		var t energy.Ranking
		j := p.joulesOf(cands, req)
		bound := ttftBound(b.best, b.slack)
		for i := range cands {
			if c := &cands[i]; inBand(c) && c.cost.ttft <= bound {
				t.Offer(i, j.of(c)+j.forfeit(c, warmest), c.cost.ttft, busyness(c))
			}
		}
		chosen = t.Best()
	default:
		if warmest != nil && keepsWarm(cands, b, warmest) {
			chosen = w
		}
	}
	if chosen < 0 {
		// Past the bound, the move that costs least, what it forfeits and a slower decode
		// included (a warm upstream that lost the request on its decode must not win it back
		// on its TTFT).
		var t energy.Ranking
		for i := range cands {
			if c := &cands[i]; inBand(c) {
				t.Offer(i, c.cost.ttft+forfeit(c, warmest)+c.cost.slower, busyness(c), p.cachedTokens(c))
			}
		}
		chosen = max(0, t.Best()) // -1 only for NaN everywhere: any candidate is as good
	}
	warm := longest(cands, func(*candidate) bool { return true })
	switch {
	case warm < 0:
		return chosen, pathFallback
	case cands[chosen].match == cands[warm].match:
		return chosen, pathPrefixHit
	default:
		return chosen, pathImbalance
	}
}

// cachedTokens is what the candidate holds of all prompts, in tokens: among cold candidates
// tied on TTFT and busyness, the one holding least has the most room.
func (p *KVCacheAware) cachedTokens(c *candidate) float64 {
	return float64(p.state.forest.TenantChars(c.up.Dial)) / DefaultCharsPerToken
}

// joules is the energy signal: per candidate, the predicted joules (or grams of CO2e) of the
// request there.
type joules struct {
	expected               float64 // output tokens
	ePrefill, eDecode, eCI float64 // the means of the annotated candidates, for those without
	carbon                 bool
}

// joulesOf prepares the energy signal over the candidates. An upstream without an annotation
// counts as the mean of those that have one; with none, every candidate costs the same.
func (p *KVCacheAware) joulesOf(cands []candidate, req *llmRequest) joules {
	j := joules{expected: float64(p.opts.expectedTokens), carbon: p.opts.objective == objectiveCarbon}
	if req.MaxTokens > 0 {
		j.expected = float64(req.MaxTokens)
	}
	var sp, sd, sc float64
	var np, nd, nc int
	for i := range cands {
		pr := cands[i].prof
		if pr == nil {
			continue
		}
		if v := float64(prefillEnergy(pr)); v > 0 {
			sp, np = sp+v, np+1
		}
		if v := float64(pr.EnergyPerToken); v > 0 {
			sd, nd = sd+v, nd+1
		}
		if pr.CarbonIntensity > 0 {
			sc, nc = sc+pr.CarbonIntensity, nc+1
		}
	}
	j.ePrefill, j.eDecode, j.eCI = meanOr(sp, np, 0), meanOr(sd, nd, 0), meanOr(sc, nc, 1)
	return j
}

func (j joules) of(c *candidate) float64 {
	ep, ed, ci := j.perToken(c)
	return j.unit(float64(c.cost.uncached)*ep+j.expected*ed, ci)
}

// forfeit is what sending the request to c instead of w gives away, in joules (grams), as
// forfeit prices it in seconds: the prompt tokens w holds and c does not, prefilled on c once
// more for the cache they take there. Without it the fewest joules of the request alone moved
// conversations from a dear upstream holding their prefix to a cheap one and spent more than
// objective latency in all (measured, docs/benchmarks.md "Issue 23").
func (j joules) forfeit(c, w *candidate) float64 {
	if w == nil {
		return 0
	}
	ep, _, ci := j.perToken(c)
	return j.unit(float64(max(0, c.cost.uncached-w.cost.uncached))*ep, ci)
}

// perToken is c's prefill and decode energy per token and carbon intensity, the means of the
// annotated candidates for what its upstream block does not say.
func (j joules) perToken(c *candidate) (ep, ed, ci float64) {
	ep, ed, ci = j.ePrefill, j.eDecode, j.eCI
	if pr := c.prof; pr != nil {
		if v := float64(prefillEnergy(pr)); v > 0 {
			ep = v
		}
		if v := float64(pr.EnergyPerToken); v > 0 {
			ed = v
		}
		if pr.CarbonIntensity > 0 {
			ci = pr.CarbonIntensity
		}
	}
	return ep, ed, ci
}

// unit is e joules in the objective's unit: joules, or grams of CO2e at ci.
func (j joules) unit(e, ci float64) float64 {
	if j.carbon {
		return e * ci / 3.6e6 // J × gCO2e/kWh → g
	}
	return e
}

// prefillEnergy is an upstream's joules per prefilled token: prefill_energy_per_token, else
// energy_per_token (energy.Profile's rule).
func prefillEnergy(pr *energy.Profile) energy.Joules {
	if pr.PrefillEnergyPerToken > 0 {
		return pr.PrefillEnergyPerToken
	}
	return pr.EnergyPerToken
}

func meanOr(sum float64, n int, def float64) float64 {
	if n == 0 {
		return def
	}
	return sum / float64(n)
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

// predictOne fills the prediction of the one candidate in c under decision thresholds, which
// ranks by other means: the request still counts in the queued prefill (for the cluster, the
// admin API and the explain header), at the cost predicted for it.
func (p *KVCacheAware) predictOne(c []candidate, req *llmRequest, prompt int64) {
	p.predict(c, costInputs{prompt: prompt, charsPerToken: p.state.charsPerToken(req.Model), now: time.Now().UnixNano()})
}
