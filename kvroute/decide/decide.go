package decide

import (
	"math"
	"math/rand/v2"

	"github.com/kvroute/caddy-kvroute/energy"
)

// Rule is how the decision chooses (the Caddyfile's decision option).
type Rule uint8

const (
	// Thresholds: the balance band, cache_threshold and the fallback placement, in steps (the
	// default).
	Thresholds Rule = iota
	// Cost: one ranking by predicted time to first token.
	Cost
)

// Objective is what decision cost minimises (the objective option).
type Objective uint8

const (
	// Latency: the lowest predicted TTFT (the default).
	Latency Objective = iota
	// Completion: Latency, and a warm upstream or a session also leaves an engine whose slower
	// decode costs the request more than a move.
	Completion
	// Energy: the fewest predicted joules among the candidates within TTFTSlack of the best.
	Energy
	// Carbon: the fewest predicted grams of CO2e, as Energy.
	Carbon
)

// Path says why the decision chose what it chose. The values are those of the metric
// caddy_kvroute_decisions_total's path label, in order.
type Path uint8

const (
	PathSession Path = iota
	PathImbalance
	PathPrefixHit
	PathFallback
)

var pathNames = [...]string{"session", "imbalance", "prefix_hit", "fallback"}

func (p Path) String() string {
	if int(p) < len(pathNames) {
		return pathNames[p]
	}
	return "unknown"
}

// SessionOutcome is what the session step did with a session bound to a candidate.
type SessionOutcome uint8

const (
	// SessionNone: no candidate carries the request's session (none, or one the caller
	// handled: not a candidate, an earlier attempt's).
	SessionNone SessionOutcome = iota
	// SessionKept: the request goes to its session's upstream.
	SessionKept
	// SessionSkipped: the session's upstream is out of the band (or beyond the TTFT bound) for
	// this request; the binding stays.
	SessionSkipped
	// SessionFollows: decision cost, another candidate in the band holds a KV block more of the
	// prompt than the session's upstream: the binding follows the request to its choice.
	SessionFollows
)

// Constants of the decision (docs/decision.md).
const (
	// MinMatchRunes is the shortest shared prefix that counts as a match: one KV block of 16
	// tokens at 4 chars per token. The caller leaves shorter matches at 0.
	MinMatchRunes = 64
	// DefaultPrefillTokensPerSecond is the prefill speed of a candidate that has none learned
	// and no prior.
	DefaultPrefillTokensPerSecond = 5000.0
	// DefaultCharsPerToken is the chars per token of a model not learned yet.
	DefaultCharsPerToken = 4.0
	// AdapterLoadSeconds is what one LoRA adapter load adds to a predicted TTFT (Candidate.Adapter
	// counts the loads).
	AdapterLoadSeconds = 0.25
	// minSlackSeconds is the least difference in predicted TTFT that moves a warm request.
	minSlackSeconds = 0.02
	// decodeTolerance is the share of the fastest decode within which another is the same.
	decodeTolerance = 0.1
	// maxSlotWaitSeconds bounds a predicted slot wait.
	maxSlotWaitSeconds = 3600.0
)

// Adapter costs (Candidate.Adapter), in adapter loads.
const (
	AdapterWarm     = 0 // warm there, or the request names no adapter
	AdapterFreeSlot = 1 // a load into a free adapter slot
	AdapterEvict    = 2 // a load that evicts another warm adapter
)

// Options are the policy's settings the decision reads.
type Options struct {
	Rule      Rule
	Objective Objective
	// CacheThreshold: decision thresholds' prefix step takes the longest match when its share
	// of the prompt's chars is above it.
	CacheThreshold float64
	// The balance band: a load is in band when load−min ≤ BalanceAbs or load ≤ min×BalanceRel;
	// the loads are imbalanced when the highest is not.
	BalanceAbs int64
	BalanceRel float64
	// LeastBusyOnImbalance: on_imbalance least_busy (else prefix_in_band).
	LeastBusyOnImbalance bool
	// Placer is decision thresholds' fallback placement; nil places by joules.
	Placer *energy.Placer
	// ExpectedTokens is the output assumed of a request that states no max_tokens.
	ExpectedTokens int
	// TTFTSlack is decision cost's tolerance, a fraction of the best predicted TTFT.
	TTFTSlack float64
	// SlotRank: decision thresholds sees batch slots. Its least-busy choices (on_imbalance
	// least_busy, and the fallback when it places by load: least_busy, or joule and carbon
	// without energy annotations) take a candidate with a free batch slot before a full one
	// (full: its load reaches its learned slots while its reading stands, else its
	// max_concurrency), then the least busy as before.
	SlotRank bool
	// SlotMove: a session, warm or prefix choice whose batch is full moves to the best
	// candidate in the band with a free slot when that one's predicted TTFT plus what the move
	// forfeits is lower (decision thresholds; decision cost prices the slot wait itself).
	SlotMove bool
	// SpeedRank: decision thresholds sees a slower engine (more than SlowFactor times slower
	// than the fastest candidate in both learned prefill and decode speed). Its
	// least-busy choices and the prefix step's ties weigh a candidate's busyness, the request's
	// own included, by its slowdown, and a session, imbalance or prefix choice on a slower
	// engine moves to the least busy candidate in the band (so weighed, a free slot first)
	// when that one is faster.
	SpeedRank bool
	// FullStay: when every candidate's batch is full (SlotRank's full), decision thresholds
	// skips the imbalance step: a move off a warm engine onto another full batch waits there
	// as well and gives up the prefix.
	FullStay bool
	// Rand is the source of the random choices among ties (and of fallback random); nil is
	// the global source. A simulator passes a seeded one: the same seed, the same decisions.
	// A *rand.Rand is not safe for concurrent use: Caddy leaves it nil.
	Rand *rand.Rand
}

// Request is what the decision knows of the request.
type Request struct {
	// PromptChars is the routing text's length in chars (runes); PromptTokens its estimated
	// tokens at CharsPerToken, the model's (DefaultCharsPerToken until learned).
	PromptChars   int
	PromptTokens  int64
	CharsPerToken float64
	// MaxTokens is the request's max_tokens (0: not stated).
	MaxTokens int
	// Adapter: the request names a LoRA adapter (the candidates' Adapter costs are set).
	Adapter bool
}

// Candidate is one upstream that may take the request: what the decision reads of it, and,
// in Cost, what it predicts for it. Zero values mean "none" or "not learned".
type Candidate struct {
	// Key is the caller's: the decision never reads it (Filter keeps it with its candidate).
	Key int
	// Profile is its upstream block (energy, priors, max_concurrency); nil: none.
	Profile *energy.Profile
	// Load is its requests in flight as the router counts them at decision time: its own,
	// its peers' and the engine's external ones.
	Load int64
	// Down: the router holds it down; Tried: an earlier attempt of this request went there.
	Down, Tried bool
	// Match is the leading chars of the routing text it holds (0 below MinMatchRunes).
	Match int
	// HeldChars is what the router's tree holds for it, all prompts; HeldCharsPerToken the
	// chars per token of the model it was sent (0: DefaultCharsPerToken).
	HeldChars         int64
	HeldCharsPerToken float64
	// QueuedTokens is the prompt tokens of the requests this router has in flight there.
	QueuedTokens int64
	// Prefill is the uncached prompt tokens this router and its peers sent there that have not
	// produced a first token.
	Prefill int64
	// Waiting is the engine's waiting requests at its latest reading, priced at MeanUncached
	// tokens each; the reading stands until ReadingUntil (unix nanoseconds; 0: no reading).
	Waiting      int64
	MeanUncached float64
	ReadingUntil int64
	// PrefillSpeed is the prefill tokens per second learned from its engine's totals,
	// AnswerSpeed from single answers; DecodeSpeed the per-request decode tokens per second
	// learned; Slots the requests it runs at once; MeanOutput its mean output tokens per
	// request. The engine-read figures count only while a reading stands (ReadingUntil).
	PrefillSpeed, AnswerSpeed, DecodeSpeed float64
	Slots                                  int64
	MeanOutput                             float64
	// Adapter is the request's LoRA adapter there, in loads (AdapterWarm, AdapterFreeSlot,
	// AdapterEvict).
	Adapter float64
	// Session: the request's session is bound here; StoredResponse: this engine stored the
	// response a Responses follow-up names.
	Session, StoredResponse bool

	// Cost is the decision's prediction (filled by Decide; Cost rule: every candidate,
	// Thresholds: every candidate, without the decode term).
	Cost Prediction
}

// Prediction is one candidate's predicted cost.
type Prediction struct {
	Uncached int64   // prompt tokens it would prefill
	Queued   int64   // prefill tokens ahead of the request there
	Speed    float64 // prefill tokens per second
	Slot     float64 // seconds waiting for a batch slot
	TTFT     float64 // seconds
	// Decode is the seconds the output takes there (objective Completion; 0 where not
	// learned); Slower what that is beyond the fastest candidate's and a tolerance.
	Decode, Slower float64
}

// Snapshot is one decision's input: the time, the request and its candidates.
type Snapshot struct {
	Now        int64 // unix nanoseconds
	Request    Request
	Candidates []Candidate
}

// Result is one decision's output.
type Result struct {
	Chosen  int // index in Snapshot.Candidates; -1 when there is none
	Path    Path
	Session SessionOutcome
}

// Saturated reports whether c's requests in flight reach its upstream block's max_concurrency.
func (c *Candidate) Saturated() bool {
	return c.Profile != nil && c.Profile.MaxConcurrency > 0 && c.Load >= int64(c.Profile.MaxConcurrency)
}

// Filter is step 1's leaving out, in place: the candidates held down, then those saturated,
// then those an earlier attempt went to, each unless it would leave out all of them. It
// returns cands shortened; the order is kept.
func Filter(cands []Candidate) []Candidate {
	cands = leaveOut(cands, outDown)
	cands = leaveOut(cands, outSaturated)
	return leaveOut(cands, outTried)
}

// The filters of step 1 (leaveOut takes a kind, not a func: a candidate passed to an unknown
// func escapes, and the caller's candidates with it).
const (
	outDown = iota
	outSaturated
	outTried
)

func isOut(c *Candidate, kind int) bool {
	switch kind {
	case outDown:
		return c.Down
	case outSaturated:
		return c.Saturated()
	}
	return c.Tried
}

func leaveOut(cands []Candidate, kind int) []Candidate {
	n := 0
	for i := range cands {
		if isOut(&cands[i], kind) {
			n++
		}
	}
	if n == 0 || n == len(cands) {
		return cands
	}
	kept := 0
	for i := range cands {
		if !isOut(&cands[i], kind) {
			cands[kept] = cands[i]
			kept++
		}
	}
	return cands[:kept]
}

// Decide runs steps 2 to 5 of the decision over s's candidates (step 1, Filter, done): the
// session, a Responses follow-up, then decision cost's ranking or decision thresholds'
// imbalance, prefix and fallback steps. It fills every candidate's Cost and allocates nothing
// (up to 16 candidates). Ties are broken at random (energy.Ranking), from o.Rand.
func Decide(o *Options, s *Snapshot) Result {
	cands := s.Candidates
	if len(cands) == 0 {
		return Result{Chosen: -1}
	}
	d := decision{o: o, req: &s.Request, now: s.Now, cands: cands}
	d.band = d.bandOf()
	cost := o.Rule == Cost
	if o.FullStay && !cost && d.band.overflow && d.allFull() {
		d.band.overflow = false
	}
	if o.SpeedRank && !cost {
		d.fastest()
	}
	d.predict()
	if cost {
		d.band.cost, d.band.best, d.band.slack = true, d.bestTTFT(), o.TTFTSlack
	}

	res := Result{Chosen: -1, Path: PathSession}
	// 2. Session.
	if i := d.bound(); i >= 0 {
		switch {
		case cost && d.heldElsewhere(i):
			res.Session = SessionFollows
		case d.keeps(i):
			res.Chosen, res.Session = i, SessionKept
		default:
			res.Session = SessionSkipped
		}
	}
	// A Responses follow-up goes to the engine that stored the response, whatever the costs.
	for i := range cands {
		if cands[i].StoredResponse {
			res.Chosen = i
			break
		}
	}
	// 3 to 5, decision cost: the ranking by predicted TTFT.
	if res.Chosen < 0 && cost {
		res.Chosen, res.Path = d.byCost()
	}
	// 3. Imbalance.
	if res.Chosen < 0 {
		res.Chosen, res.Path = d.imbalance()
	}
	// 4. Prefix.
	if res.Chosen < 0 {
		res.Chosen, res.Path = d.prefix()
	}
	// 5. Fallback.
	if res.Chosen < 0 {
		res.Chosen, res.Path = d.place(), PathFallback
	}
	if o.SlotMove && !cost && res.Path != PathFallback && res.Chosen >= 0 && !cands[res.Chosen].StoredResponse {
		if i := d.freeMove(res.Chosen); i >= 0 {
			res.Chosen = i
		}
	}
	if o.SpeedRank && !cost && res.Path != PathFallback && res.Chosen >= 0 && !cands[res.Chosen].StoredResponse {
		if i := d.slowMove(res.Chosen); i >= 0 {
			res.Chosen = i
		}
	}
	return res
}

// full reports whether c's batch slots are all taken: its load reaches its learned slots
// (while its reading stands), else its max_concurrency.
func (d *decision) full(c *Candidate) bool {
	n := c.Capacity(d.now)
	return n > 0 && c.Load >= n
}

// Capacity returns c's batch slots at now (unix nanoseconds): learned from its engine while
// the reading stands, else its upstream block's max_concurrency; 0 when neither is known (it
// is never full). The decision's batch-slot rules and kvroute's router-side queue both count
// a candidate full by it.
func (c *Candidate) Capacity(now int64) int64 {
	if c.Slots > 0 && c.ReadingUntil > 0 && now <= c.ReadingUntil {
		return c.Slots
	}
	if c.Profile != nil && c.Profile.MaxConcurrency > 0 {
		return int64(c.Profile.MaxConcurrency)
	}
	return 0
}

// bySlots is SlotRank's least-busy choice among the candidates idx names (all when idx is
// nil; of those, the ones in the band when inBand): a free batch slot before a full one, then
// the lowest busyness, then the one holding the least, then at random.
func (d *decision) bySlots(idx []int, inBand bool) int {
	n := len(idx)
	if idx == nil {
		n = len(d.cands)
	}
	t := energy.Ranking{Rand: d.o.Rand}
	for k := range n {
		i := k
		if idx != nil {
			i = idx[k]
		}
		c := &d.cands[i]
		if inBand && !d.inBand(c) {
			continue
		}
		full := 0.0
		if d.full(c) {
			full = 1
		}
		t.Offer(i, full, d.slowBusyness(c), float64(placement(c).CachedTokens))
	}
	return t.Best()
}

// slowBusyness is c's busyness for the least-busy choices: with SpeedRank, its busyness and
// the request's own times its Slowdown.
func (d *decision) slowBusyness(c *Candidate) float64 {
	if !d.o.SpeedRank {
		return busyness(c)
	}
	return (busyness(c) + energy.Busyness(1, d.req.PromptTokens)) * d.slowdown(c)
}

// fastest notes the candidates' fastest learned prefill speed and decode speed (the latter
// while its reading stands), for slowdown.
func (d *decision) fastest() {
	for i := range d.cands {
		c := &d.cands[i]
		d.fastPrefill = max(d.fastPrefill, c.PrefillSpeed)
		if d.fresh(c) {
			d.fastDecode = max(d.fastDecode, c.DecodeSpeed)
		}
	}
}

// slowdown is c's slowdown against the fastest candidates noted.
func (d *decision) slowdown(c *Candidate) float64 {
	return slowdown(c, d.fastPrefill, d.fastDecode, d.fresh(c))
}

// SlowFactor: an engine is slower when it is more than SlowFactor times slower than the
// fastest candidate in both prefill and decode speed. A busy engine of the same kind seems
// slower in one of the two (a large batch lowers the decode speed per request, chunked
// prefills mixed with decodes the prefill speed), rarely in both: in the fleet simulator's
// homogeneous mooncake-80 and mooncake-closed-16, 15 and 36 of 1,500 decisions (seed 1) saw an
// engine more than 3× slower in both, none more than 3.5× (the 4-slot fleet: 15). A slower machine is slower in both: on chat-slow-half-80 (two engines
// 4× slower) the learned ratios were 4.5× in prefill and 7-10× in decode, and 3.5 instead of
// 3 left 99 of 2,000 decisions blind to them (issue 34, docs/simulator.md).
const SlowFactor = 3.0

// slowdown is how many times slower c is than the fastest prefill and decode speeds fp and fd:
// the lesser of the two ratios, 1 when that is within SlowFactor or either speed is not
// learned (fresh: c's reading stands).
func slowdown(c *Candidate, fp, fd float64, fresh bool) float64 {
	if !(c.PrefillSpeed > 0) || !(c.DecodeSpeed > 0) || !fresh {
		return 1
	}
	if k := min(fp/c.PrefillSpeed, fd/c.DecodeSpeed); k > SlowFactor {
		return k
	}
	return 1
}

// freeMove returns, when cands[i]'s batch is full, the candidate in the band with a free
// slot to move the request to (SlotMove), or -1 to keep it.
func (d *decision) freeMove(i int) int {
	w := &d.cands[i]
	if !d.full(w) {
		return -1
	}
	j := d.bySlots(nil, true)
	if j < 0 || j == i {
		return -1
	}
	c := &d.cands[j]
	if d.full(c) || c.Cost.TTFT+forfeit(c, w) >= w.Cost.TTFT {
		return -1
	}
	return j
}

// slowMove returns, when cands[i] is slower (SpeedRank), the least busy candidate in the band
// (weighed by slowdown, a free slot first) when it is faster and not full where cands[i] is
// not, or -1 to keep the request on cands[i].
func (d *decision) slowMove(i int) int {
	k := d.slowdown(&d.cands[i])
	if k <= 1 {
		return -1
	}
	j := d.bySlots(nil, true)
	if j < 0 || j == i || d.slowdown(&d.cands[j]) >= k || (d.full(&d.cands[j]) && !d.full(&d.cands[i])) {
		return -1
	}
	return j
}

// decision is one run of Decide.
type decision struct {
	o     *Options
	req   *Request
	now   int64
	cands []Candidate
	band  band
	// fastPrefill, fastDecode: the candidates' fastest learned speeds (SpeedRank).
	fastPrefill, fastDecode float64
}

// allFull reports whether every candidate's batch is full.
func (d *decision) allFull() bool {
	for i := range d.cands {
		if !d.full(&d.cands[i]) {
			return false
		}
	}
	return true
}

// bound returns the candidate the session is bound to, or -1.
func (d *decision) bound() int {
	for i := range d.cands {
		if d.cands[i].Session {
			return i
		}
	}
	return -1
}

// band is the candidates' balance band: the loads within the balance thresholds of the least
// loaded candidate.
type band struct {
	lo, hi   int64
	abs      int64
	rel      float64
	overflow bool // the loads are imbalanced: max-min beyond both thresholds
	// With decision cost: best is the lowest predicted TTFT in the band, slack ttft_slack.
	cost        bool
	best, slack float64
}

func (d *decision) bandOf() band {
	c := d.cands
	b := band{lo: c[0].Load, hi: c[0].Load, abs: d.o.BalanceAbs, rel: d.o.BalanceRel}
	for i := range c[1:] {
		b.lo, b.hi = min(b.lo, c[i+1].Load), max(b.hi, c[i+1].Load)
	}
	b.overflow = !b.holds(b.hi)
	return b
}

// holds reports whether load is within the band.
func (b *band) holds(load int64) bool {
	return load-b.lo <= b.abs || float64(load) <= float64(b.lo)*b.rel
}

func (d *decision) inBand(c *Candidate) bool { return d.band.holds(c.Load) }

// keeps reports whether a session bound to cands[i] stays there: its load is within the band
// and, with decision cost, its predicted TTFT within ttft_slack of the best place to move the
// request to, counting what the move forfeits (keepsWarm).
func (d *decision) keeps(i int) bool {
	c := &d.cands[i]
	return d.band.holds(c.Load) && (!d.band.cost || d.keepsWarm(c))
}

// heldElsewhere reports whether a candidate in the band holds at least one KV block more of
// the routing text than cands[i].
func (d *decision) heldElsewhere(i int) bool {
	w := d.longest(true)
	return w >= 0 && d.cands[w].Match >= d.cands[i].Match+MinMatchRunes
}

// imbalance runs step 3: when the loads are imbalanced, on_imbalance picks among the
// candidates.
func (d *decision) imbalance() (int, Path) {
	if !d.band.overflow {
		return -1, PathImbalance
	}
	if !d.o.LeastBusyOnImbalance {
		if i := d.longest(true); i >= 0 {
			return i, PathImbalance
		}
		if i := d.warmInBand(); i >= 0 {
			return i, PathImbalance
		}
	}
	if d.o.SlotRank {
		return d.bySlots(nil, false), PathImbalance
	}
	return d.leastBusy(nil), PathImbalance
}

// prefix runs step 4: the candidate holding the longest prefix, when its share of the routing
// text is above cache_threshold.
func (d *decision) prefix() (int, Path) {
	if d.req.PromptChars == 0 {
		return -1, PathPrefixHit
	}
	i := d.longest(false)
	if i < 0 || float64(d.cands[i].Match)/float64(d.req.PromptChars) <= d.o.CacheThreshold {
		return -1, PathPrefixHit
	}
	return i, PathPrefixHit
}

// longest returns the candidate holding the longest prefix (of those in the band when inBand),
// of those tied the one where the request's LoRA adapter is warmest, then the least busy, or
// -1 when none holds any.
func (d *decision) longest(inBand bool) int {
	t := energy.Ranking{Rand: d.o.Rand}
	for i := range d.cands {
		if c := &d.cands[i]; c.Match > 0 && (!inBand || d.inBand(c)) {
			t.Offer(i, -float64(c.Match), c.Adapter, d.slowBusyness(c))
		}
	}
	return t.Best()
}

func busyness(c *Candidate) float64 {
	return energy.Busyness(int(c.Load), c.QueuedTokens)
}

// placement is c as the energy placer sees it.
func placement(c *Candidate) energy.Candidate {
	cpt := c.HeldCharsPerToken
	if !(cpt > 0) {
		cpt = DefaultCharsPerToken
	}
	return energy.Candidate{
		Profile:      c.Profile,
		InFlight:     int(c.Load),
		QueuedTokens: c.QueuedTokens,
		CachedTokens: int64(float64(c.HeldChars) / cpt),
	}
}

// leastBusy returns the least busy candidate of those idx names (all when idx is nil), as
// energy.Idlest ranks them.
func (d *decision) leastBusy(idx []int) int {
	var buf [16]energy.Candidate
	ec := buf[:0]
	if idx == nil {
		for i := range d.cands {
			ec = append(ec, placement(&d.cands[i]))
		}
		return energy.IdlestRand(ec, d.o.Rand)
	}
	for _, i := range idx {
		ec = append(ec, placement(&d.cands[i]))
	}
	if j := energy.IdlestRand(ec, d.o.Rand); j >= 0 {
		return idx[j]
	}
	return -1
}

// adapterTier appends to dst the candidates (those in the band when inBand) with the lowest
// adapter cost: all of them when the request names no adapter.
func (d *decision) adapterTier(dst []int, inBand bool) []int {
	lo := AdapterEvict + 1.0
	for i := range d.cands {
		if !inBand || d.inBand(&d.cands[i]) {
			lo = min(lo, d.cands[i].Adapter)
		}
	}
	for i := range d.cands {
		if (!inBand || d.inBand(&d.cands[i])) && d.cands[i].Adapter == lo {
			dst = append(dst, i)
		}
	}
	return dst
}

// warmInBand returns, for a request naming a LoRA adapter, the least busy of the candidates in
// the band where the adapter is warmest; -1 for any other request.
func (d *decision) warmInBand() int {
	if !d.req.Adapter {
		return -1
	}
	var buf [16]int
	tier := d.adapterTier(buf[:0], true)
	if len(tier) == 0 {
		return -1
	}
	return d.leastBusy(tier)
}

// place runs the fallback placement (step 5): among the candidates where the request's LoRA
// adapter is warmest, the configured placer's choice.
func (d *decision) place() int {
	var tbuf [16]int
	tier := d.adapterTier(tbuf[:0], false)
	var buf [16]energy.Candidate
	ec := buf[:0]
	for _, i := range tier {
		ec = append(ec, placement(&d.cands[i]))
	}
	expected := d.req.MaxTokens
	if expected <= 0 {
		expected = d.o.ExpectedTokens
	}
	placer := d.o.Placer
	if placer == nil {
		placer = &defaultPlacer
	}
	if d.o.SlotRank && d.byLoad(placer, tier) {
		return d.bySlots(tier, false)
	}
	i := placer.PlaceRand(ec, expected, d.o.Rand)
	if i < 0 {
		i = energy.IdlestRand(ec, d.o.Rand)
	}
	return tier[i]
}

var defaultPlacer energy.Placer // joule

// byLoad reports whether placer places the candidates idx names by their load: least_busy,
// or joule and carbon when none of them has an energy annotation.
func (d *decision) byLoad(placer *energy.Placer, idx []int) bool {
	switch placer.Strategy() {
	case energy.LeastBusy:
		return true
	case energy.Joule, energy.Carbon:
		for _, i := range idx {
			if pr := d.cands[i].Profile; pr != nil && (pr.EnergyPerToken > 0 || pr.CarbonIntensity > 0) {
				return false
			}
		}
		return true
	}
	return false
}

// Predict fills the predictions of cands for decision o at now (unix nanoseconds). Decide calls
// it; a caller may too, to price candidates it decides otherwise.
func Predict(o *Options, req *Request, cands []Candidate, now int64) {
	d := decision{o: o, req: req, now: now, cands: cands}
	d.predict()
}

func (d *decision) predict() {
	output := d.decodeOutput()
	for i := range d.cands {
		c := &d.cands[i]
		c.Cost.Uncached = d.uncached(c)
		c.Cost.Queued = d.queued(c)
		c.Cost.Speed = prefillSpeed(c)
		c.Cost.Slot = d.slotWait(c)
		c.Cost.TTFT = float64(c.Cost.Queued+c.Cost.Uncached)/c.Cost.Speed + c.Cost.Slot + c.Adapter*AdapterLoadSeconds
		c.Cost.Decode = d.decodeTime(c, output)
	}
	markSlower(d.cands)
}

// fresh reports whether c's engine has a reading that stands now.
func (d *decision) fresh(c *Candidate) bool { return c.ReadingUntil > 0 && d.now <= c.ReadingUntil }

// uncached is the match signal: the prompt's tokens the candidate does not hold.
func (d *decision) uncached(c *Candidate) int64 {
	cpt := d.req.CharsPerToken
	if !(cpt > 0) {
		cpt = DefaultCharsPerToken
	}
	held := int64(math.Round(float64(c.Match) / cpt))
	return max(0, d.req.PromptTokens-held)
}

// queued is the queue signal: the prefill tokens ahead of a request sent to c now, the larger
// of what the routers sent there and the engine's own waiting queue (each request counts once).
func (d *decision) queued(c *Candidate) int64 {
	waiting := int64(0)
	if d.fresh(c) && c.Waiting > 0 {
		waiting = int64(float64(c.Waiting) * c.MeanUncached)
	}
	return max(c.Prefill, waiting)
}

// prefillSpeed is the speed signal: learned from the engine's totals, else from single
// answers, else the upstream block's prior, else the default.
func prefillSpeed(c *Candidate) float64 {
	switch {
	case c.PrefillSpeed > 0:
		return c.PrefillSpeed
	case c.AnswerSpeed > 0:
		return c.AnswerSpeed
	case c.Profile != nil && c.Profile.PrefillTokensPerSecond > 0:
		return c.Profile.PrefillTokensPerSecond
	}
	return DefaultPrefillTokensPerSecond
}

// slotWait is the slot signal: the seconds a request sent to c now waits for a batch slot.
//
//	wait = (in_flight + 1 − slots) / slots × output / decode_speed
func (d *decision) slotWait(c *Candidate) float64 {
	if c.Slots <= 0 || !(c.DecodeSpeed > 0) || !d.fresh(c) {
		return 0
	}
	ahead := c.Load + 1 - c.Slots
	if ahead <= 0 {
		return 0
	}
	output := c.MeanOutput
	if !(output > 0) {
		output = float64(d.o.ExpectedTokens)
	}
	wait := float64(ahead) / float64(c.Slots) * output / c.DecodeSpeed
	return min(wait, maxSlotWaitSeconds)
}

// decodeTime is the decode signal: the seconds output tokens take on c at its learned decode
// speed; 0 where none is learned or without a fresh reading.
func (d *decision) decodeTime(c *Candidate, output float64) float64 {
	if !(c.DecodeSpeed > 0) || !(output > 0) || !d.fresh(c) {
		return 0
	}
	return output / c.DecodeSpeed
}

// decodeOutput is the output expected of the request for the decode signal (objective
// Completion only, else 0): the mean of the candidates' mean outputs when every one has one,
// else ExpectedTokens; at most MaxTokens.
func (d *decision) decodeOutput() float64 {
	if d.o.Rule != Cost || d.o.Objective != Completion {
		return 0
	}
	out, sum := float64(d.o.ExpectedTokens), 0.0
	for i := range d.cands {
		m := d.cands[i].MeanOutput
		if !(m > 0) {
			sum = 0
			break
		}
		sum += m
	}
	if sum > 0 {
		out = sum / float64(len(d.cands))
	}
	if d.req.MaxTokens > 0 {
		out = min(out, float64(d.req.MaxTokens))
	}
	return out
}

// markSlower sets each candidate's Slower: its decode time beyond the fastest candidate's and a
// tolerance of decodeTolerance of it.
func markSlower(cands []Candidate) {
	fastest := math.Inf(1)
	for i := range cands {
		if v := cands[i].Cost.Decode; v > 0 {
			fastest = min(fastest, v)
		}
	}
	for i := range cands {
		c := &cands[i]
		c.Cost.Slower = 0
		if v := c.Cost.Decode - fastest*(1+decodeTolerance); v > 0 {
			c.Cost.Slower = v
		}
	}
}
