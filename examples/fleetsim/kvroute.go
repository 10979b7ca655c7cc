package fleetsim

import (
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
	"github.com/kvroute/caddy-kvroute/kvroute/decide"
	"github.com/kvroute/caddy-kvroute/kvroute/flow"
	"github.com/kvroute/caddy-kvroute/tree"
)

// kvroute's decisions in the simulator: kvRouter runs kvroute's decision core (kvroute/decide)
// over snapshots gathered as kvroute's Select gathers them in Caddy (kvroute/select.go), from
// what a Caddy with kvroute's defaults, telemetry and llm_feedback would know at the same
// moment:
//
//   - its own prefix tree per model (package tree, the one kvroute uses), the engines as
//     tenants; the routing text is inserted under the chosen engine at each decision; each
//     engine's share bounded by 1.5 × its reported KV capacity at the chars per token learned
//     (kvroute's tenantBound), the forest by max_tree_size; a restart seen in the readings drops
//     the engine's share;
//   - its own requests in flight per engine, their estimated prompt tokens and their uncached
//     tokens until the first token (kvroute/prefill.go; before an engine's first reported
//     first token, until the predicted deadline);
//   - every telemetry interval, each engine's reading as kvroute reads vLLM's /metrics: running
//     and waiting (the external load: the engine's count beyond the router's, the smaller of two
//     readings, only while the engine's started-request count shows traffic from elsewhere; the
//     waiting queue), the KV capacity (the tree bound), and the interval's totals (prefill and
//     decode speed samples, chars per token, slots and mean output: decide.Slots);
//   - each answer's usage (cached tokens) and first-token time: the prefill speed of single
//     answers, and the end of the request's prefill;
//   - the session id, when the scenario sends one: bound, kept, skipped or followed as
//     kvroute's session step does (header sessions, 30 min TTL).
//
// The estimators are kvroute's own, those its learn.go feeds: decide.Speed (prefill speed from
// the totals, decode speed, prefill speed from single answers), decide.CharsPerToken and
// decide.Slots, and decide.Outside for the evidence of traffic from elsewhere. What feeds them
// (an interval's totals read as kvroute reads vLLM's counters, which intervals and answers
// count, the external load: learn.go's learnFrom and learnAnswer, telemetry.go's observe)
// reads Caddy's state in package kvroute: it is ported here, constant for constant. Left out: upstream blocks
// (profiles, priors, max_concurrency), LoRA adapter state (the simulated engines export no
// adapter list: every request is priced as naming none), a cluster, health, retries, and
// llm_feedback's tree shares (kvroute scales a bound by how well it predicted hits; here 1).
type kvRouter struct {
	opts   decide.Options
	ids    []string
	forest *tree.Forest
	match  tree.Match
	up     []kvUpstream
	cbuf   []decide.Candidate
	track  map[int]*kvTrack // per request routed and not done
	sess   map[kvSessionKey]*kvBinding
	chars  map[string]*kvChars // per model: chars per token
	evict  time.Duration       // the last periodic eviction
	// Late binding (queueTimeout > 0): the requests held at the router while every engine's
	// batch is full, in kvroute's queue (kvroute/flow: arrival order per model), each until a
	// slot frees or it has waited queueTimeout; held says requests were held since the last
	// readings (the learned slots are kept: decide.Slots.ObserveHeld).
	queueTimeout time.Duration
	queue        *flow.Queue
	items        map[int]*flow.Item
	held         bool
	// misordered counts dispatches out of the queue's order (a test asserts none).
	misordered int
	holdMargin int64 // EXPERIMENT
	// fc is flow control (kv_flow; nil: none): late binding with priority bands and tenants
	// (kvflow.go).
	fc *flowControl
	// last is the latest decision's path and chosen engine (for diagnostics).
	last struct {
		path   decide.Path
		engine int
		cands  []decide.Candidate // the decision's candidates, valid until the next decision
		req    decide.Request
	}
}

// Constants of kvroute (kvroute/options.go, telemetry.go, learn.go, prefill.go, state.go).
const (
	kvMaxTreeSize       = 64 << 20 // DefaultMaxTreeSize, chars
	kvEvictionInterval  = 120 * time.Second
	kvSessionTTL        = 30 * time.Minute
	kvTelemetryInterval = time.Second // DefaultTelemetryInterval: the first reading's
	kvReadingLifetime   = 3           // intervals a reading's external load counts
	kvMinSampleTokens   = 32
	kvMinSampleSeconds  = 1e-3
	kvLimitsChange      = 0.02
	kvTenantSlack       = 1.5
)

// kvUpstream is what the router knows of one engine (kvroute's upstreamState and upstreamLearn).
type kvUpstream struct {
	inFlight, queuedTokens, prefillTokens int64
	firstTokens                           bool // a first token was reported: prefill ends only then
	pending                               []*kvTrack

	// What was sent (sentCounts) and the previous interval's figures.
	sent      [3]int64 // requests, chars, matched chars
	ended     int64
	model     string
	modelSet  bool
	mixed     bool
	lastSent  [3]int64
	lastEnded int64
	lastRaw   int64

	// The latest reading (engineView) and the previous one's counters.
	hasPrev  bool
	prev     engine.Reading
	prevAt   time.Duration
	hasView  bool
	until    int64
	external int64
	raw      int64
	waiting  int64
	outside  bool
	capacity int64 // KV capacity in tokens (0: none reported)

	// Learned.
	prefill, decode, answers     decide.Speed
	answerSpeed                  float64
	learned                      bool // a reading was taken in (learnedFigures set)
	prefillSpeed, decodeSpeed    float64
	prefillLearned, decodeLearnd bool
	slots                        decide.Slots
	slotCount                    int64
	meanOutput                   float64
	evidence                     decide.Outside
	abandonedAt                  int64
}

// kvTrack is one request in flight: what it counts where (kvroute's llmRequest and
// prefillShare).
type kvTrack struct {
	engine    int
	estimate  int64
	uncached  int64
	counted   bool // its uncached tokens count in the engine's prefill
	deadline  int64
	chars     int64
	matched   int64
	routed    time.Duration
	predicted float64
}

type kvSessionKey struct{ model, id string }

type kvBinding struct {
	engine  int
	expires time.Duration
}

// kvChars is a model's chars per token (modelChars).
type kvChars struct {
	est         decide.CharsPerToken
	value, used float64
}

// kvDelta is one interval's totals, as kvroute's telemetry.Delta reads vLLM's counters.
type kvDelta struct {
	restart                                bool
	prompt, hits, computed, generated      float64
	prefillSeconds, decodeSeconds, started float64
}

// newKVRouter returns kvroute's decision with its default options and rule.
func newKVRouter(rule decide.Rule, name string, seed uint64) *kvRouter {
	o := decide.DefaultOptions()
	o.Rule = rule
	h := fnv.New64a()
	h.Write([]byte(name))
	o.Rand = rand.New(rand.NewPCG(seed, h.Sum64()))
	return &kvRouter{opts: o}
}

func (k *kvRouter) Start(engines []EngineInfo) {
	k.ids = make([]string, len(engines))
	for i, e := range engines {
		k.ids[i] = e.ID
	}
	k.up = make([]kvUpstream, len(engines))
	k.forest = tree.NewForest(tree.Limits{MaxChars: kvMaxTreeSize})
	k.forest.Inline()
	k.track = map[int]*kvTrack{}
	k.sess = map[kvSessionKey]*kvBinding{}
	k.chars = map[string]*kvChars{}
	k.queue = flow.New(flow.Config{})
	if k.fc != nil {
		k.queue = flow.New(flow.Config{Bands: len(k.fc.bands), MaxQueued: k.fc.maxQueued})
		k.fc.charged = map[int]float64{}
	}
	k.items = map[int]*flow.Item{}
}

// WakeAt is when a request the router answered Wait must be offered again even if no slot
// frees: when it has waited queueTimeout.
func (k *kvRouter) WakeAt(req *Request) time.Duration {
	if k.fc != nil {
		return req.Arrival + k.fc.bands[k.fc.band(req.Priority)].timeout
	}
	if k.queueTimeout <= 0 {
		return 0
	}
	return req.Arrival + k.queueTimeout
}

// full reports whether engine i's batch slots are all taken as the router knows them: its
// load (requests in flight, its own and the engine's external ones) reaches the slots
// learned, while its reading stands. An engine whose slots are not learned is never full.
func (k *kvRouter) full(i int, at int64) bool { return k.fullBy(i, at, 0) }

// fullBy is full with extra more requests allowed.
func (k *kvRouter) fullBy(i int, at int64, extra int64) bool {
	u := &k.up[i]
	if !u.learned || u.slotCount <= 0 || !u.hasView || at > u.until {
		return false
	}
	return u.inFlight+u.externalLoad(at) >= u.slotCount+k.holdMargin+extra
}

// admit is late binding: whether req goes to an engine now, or waits at the router (it then
// holds a place in the queue). A request waits while every engine is full, or while requests
// of its model that came before it wait; it goes when a slot frees, in the queue's order, or
// when it has waited queueTimeout (then as without late binding).
func (k *kvRouter) admit(now time.Duration, req *Request) bool {
	if k.fc != nil {
		panic("fleetsim: admit with flow control (admitFlow)")
	}
	if k.queueTimeout <= 0 {
		return true
	}
	at := int64(now)
	it := k.items[req.ID]
	if it != nil && now-req.Arrival >= k.queueTimeout {
		k.queue.Remove(it)
		delete(k.items, req.ID)
		return true
	}
	free := false
	for i := range k.up {
		if !k.full(i, at) {
			free = true
			break
		}
	}
	if it == nil {
		if free && k.queue.LenModel(req.Model) == 0 {
			return true
		}
		it = &flow.Item{Model: req.Model, Value: req.ID}
		k.queue.Push(it)
		k.items[req.ID] = it
		k.held = true
		return false
	}
	if !free {
		return false
	}
	// Every engine serves every model here: a free slot makes every model ready, and the
	// simulator offers the waiting requests in arrival order, so the queue's next is req.
	if next := k.queue.Next(func(string) bool { return true }); next != it {
		k.misordered++
		if next != nil {
			k.queue.Push(next)
		}
		k.queue.Remove(it)
	}
	delete(k.items, req.ID)
	return true
}

// charsPerToken is model's learned chars per token, else the default.
func (k *kvRouter) charsPerToken(model string) float64 {
	if c := k.chars[model]; c != nil && c.value > 0 {
		return c.value
	}
	return decide.DefaultCharsPerToken
}

// upstreamCharsPerToken is the chars per token of the model engine i was sent: the default
// while it was sent none or several.
func (k *kvRouter) upstreamCharsPerToken(i int) float64 {
	if !k.up[i].modelSet {
		return decide.DefaultCharsPerToken
	}
	return k.charsPerToken(k.up[i].model)
}

func (k *kvRouter) tokensOf(model string, chars int64) int64 {
	if chars <= 0 {
		return 0
	}
	return max(1, int64(math.Round(float64(chars)/k.charsPerToken(model))))
}

// Route is kvroute's Select: gather, decide, record.
func (k *kvRouter) Route(now time.Duration, req *Request) int {
	if k.fc != nil {
		if a := k.admitFlow(now, req); a != admitted {
			return a
		}
	} else if !k.admit(now, req) {
		return Wait
	}
	at := int64(now)
	if now-k.evict >= kvEvictionInterval {
		k.forest.Evict()
		k.evict = now
	}
	// The tree match.
	k.match.Runes, k.match.Tenants = 0, k.match.Tenants[:0]
	if t := k.forest.Get(req.Model); t != nil && req.Text != "" {
		t.Match(req.Text, &k.match)
	}
	// Gather.
	dc := k.cbuf[:0]
	// With flow control the request goes to an engine with a free slot (admitFlow let it go
	// because there is one): the full engines are left out of the decision (with a spread,
	// only those full beyond it).
	leave := k.fc != nil && k.anyFree(at)
	for i := range k.up {
		if leave && k.fullBy(i, at, k.fc.spread) {
			continue
		}
		u := &k.up[i]
		dc = append(dc, decide.Candidate{Key: i, Load: u.inFlight + u.externalLoad(at)})
	}
	dc = decide.Filter(dc)
	for _, tm := range k.match.Tenants {
		if tm.Runes < decide.MinMatchRunes {
			break
		}
		if c := candidateOf(dc, slices.Index(k.ids, tm.Tenant)); c != nil && c.Match == 0 {
			c.Match = tm.Runes
		}
	}
	for i := range dc {
		k.facts(&dc[i], dc[i].Key, at)
	}
	estimate := k.tokensOf(req.Model, int64(req.Chars))
	snap := decide.Snapshot{Now: at, Candidates: dc, Request: decide.Request{
		PromptChars:   req.Chars,
		PromptTokens:  estimate,
		CharsPerToken: k.charsPerToken(req.Model),
		MaxTokens:     req.Output,
	}}
	// The session step's lookup.
	var skey kvSessionKey
	if req.Session != "" {
		skey = kvSessionKey{req.Model, req.Session}
		if b := k.sess[skey]; b != nil {
			if b.expires <= now {
				delete(k.sess, skey)
			} else if c := candidateOf(dc, b.engine); c != nil {
				b.expires = now + kvSessionTTL
				c.Session = true
			}
		}
	}
	// Decide.
	res := decide.Decide(&k.opts, &snap)
	k.cbuf = dc[:0]
	// Record.
	c := &dc[res.Chosen]
	i := c.Key
	u := &k.up[i]
	tr := &kvTrack{engine: i, estimate: estimate, uncached: max(0, c.Cost.Uncached), chars: int64(req.Chars),
		matched: int64(c.Match), routed: now, predicted: c.Cost.TTFT}
	tr.deadline = at + max(0, int64(c.Cost.TTFT*1e9))
	tr.counted = true
	u.inFlight++
	u.queuedTokens += estimate
	u.prefillTokens += tr.uncached
	u.pending = append(u.pending, tr)
	k.track[req.ID] = tr
	if req.Text != "" {
		k.forest.Tree(req.Model).Insert(req.Text, k.ids[i])
	}
	if req.Session != "" && res.Session != decide.SessionSkipped {
		k.sess[skey] = &kvBinding{engine: i, expires: now + kvSessionTTL}
	}
	u.sent[0]++
	u.sent[1] += int64(req.Chars)
	u.sent[2] += int64(c.Match)
	if u.modelSet && u.model != req.Model {
		u.mixed = true
	}
	u.model, u.modelSet = req.Model, true
	k.last.path, k.last.engine, k.last.cands, k.last.req = res.Path, i, dc, snap.Request
	if k.fc != nil {
		expected := c.MeanOutput
		if !(expected > 0) {
			expected = float64(k.opts.ExpectedTokens)
		}
		k.fc.charge(k.queue, req, estimate, expected)
	}
	return i
}

// candidateOf returns engine i's candidate in dc, nil when it was left out.
func candidateOf(dc []decide.Candidate, i int) *decide.Candidate {
	if i >= 0 && i < len(dc) && dc[i].Key == i {
		return &dc[i]
	}
	for j := range dc {
		if dc[j].Key == i {
			return &dc[j]
		}
	}
	return nil
}

// facts fills the decision's view of engine i at now (kvroute's facts and engineFacts).
func (k *kvRouter) facts(d *decide.Candidate, i int, now int64) {
	u := &k.up[i]
	d.HeldChars = k.forest.TenantChars(k.ids[i])
	d.HeldCharsPerToken = k.upstreamCharsPerToken(i)
	d.QueuedTokens = u.queuedTokens
	u.expirePrefill(now)
	d.Prefill = max(0, u.prefillTokens)
	if u.hasView {
		d.Waiting, d.ReadingUntil = u.waiting, u.until
		if u.waiting > 0 {
			d.MeanUncached = u.meanUncachedTokens()
		}
	}
	d.AnswerSpeed = u.answerSpeed
	if u.learned {
		if u.prefillLearned {
			d.PrefillSpeed = u.prefillSpeed
		}
		if u.decodeLearnd {
			d.DecodeSpeed = u.decodeSpeed
		}
		d.Slots, d.MeanOutput = u.slotCount, u.meanOutput
	}
}

func (u *kvUpstream) externalLoad(now int64) int64 {
	if u.hasView && now <= u.until {
		return u.external
	}
	return 0
}

func (u *kvUpstream) meanUncachedTokens() float64 {
	if u.sent[0] <= 0 {
		return 0
	}
	return max(0, float64(u.sent[1]-u.sent[2])/float64(u.sent[0])/decide.DefaultCharsPerToken)
}

// expirePrefill drops the requests whose prefill ended and, until the engine reported a first
// token, ends the prefill of those past their predicted deadline (kvroute's expirePrefill).
func (u *kvUpstream) expirePrefill(now int64) {
	expire := !u.firstTokens
	n := 0
	for n < len(u.pending) {
		t := u.pending[n]
		if t.counted && (!expire || now < t.deadline) {
			break
		}
		if t.counted {
			u.prefillTokens -= t.uncached
			t.counted = false
		}
		n++
	}
	if n > 0 {
		u.pending = append(u.pending[:0], u.pending[n:]...)
	}
}

// endPrefill takes a request's uncached tokens out of its engine's prefill, once.
func (k *kvRouter) endPrefill(t *kvTrack, fromFeedback bool) {
	u := &k.up[t.engine]
	if t.counted {
		u.prefillTokens -= t.uncached
		t.counted = false
	}
	if fromFeedback {
		u.firstTokens = true
	}
}

func (k *kvRouter) FirstToken(_ time.Duration, req *Request, _ int) {
	if t := k.track[req.ID]; t != nil {
		k.endPrefill(t, true)
	}
}

func (k *kvRouter) Done(now time.Duration, req *Request, i int, us Usage) {
	t := k.track[req.ID]
	if t == nil {
		return
	}
	delete(k.track, req.ID)
	if k.fc != nil {
		k.fc.correct(k.queue, req, us)
	}
	u := &k.up[i]
	u.inFlight--
	u.queuedTokens -= t.estimate
	k.endPrefill(t, false)
	if us.Aborted {
		// An error answer: the engine's totals never count it (sentCounts.unsent), and it may
		// have run work the router no longer counts (abandonedAt).
		u.sent[0]--
		u.sent[1] -= t.chars
		u.sent[2] -= t.matched
		u.abandonedAt = int64(now)
		return
	}
	u.ended += t.chars
	// learnAnswer: the answer's uncached tokens over its time to first content.
	uncached := float64(us.PromptTokens - us.CachedTokens)
	ttft := (us.FirstToken - t.routed).Seconds()
	if ttft >= kvMinSampleSeconds && uncached >= kvMinSampleTokens {
		u.answers.Observe(uncached / ttft)
		if m, ok := u.answers.Value(); ok {
			u.answerSpeed = m
		}
	}
}

// Reading takes in one telemetry reading of engine i (kvroute's observe and learnFrom).
func (k *kvRouter) Reading(now time.Duration, i int, r engine.Reading) {
	u := &k.up[i]
	at := int64(now)
	interval := kvTelemetryInterval
	var d *kvDelta
	if u.hasPrev {
		if now > u.prevAt {
			interval = now - u.prevAt
		}
		d = deltaOf(&u.prev, &r)
	}
	outside := k.outsideTraffic(u, d, at, interval)
	raw := max(0, int64(r.Running+r.Waiting)-u.inFlight)
	ext := int64(0)
	if outside && u.hasView && at <= u.until {
		ext = min(raw, u.raw)
	}
	u.hasView = true
	u.until = at + int64(kvReadingLifetime)*int64(interval)
	u.external, u.raw, u.waiting, u.outside = ext, raw, int64(max(0, r.Waiting)), outside
	if capacity := int64(r.CapacityBlocks) * int64(r.BlockTokens); capacity > 0 && capacity != u.capacity {
		u.capacity = capacity
		k.setLimits()
	}
	k.learnFrom(i, d, &r, at)
	u.prev, u.prevAt, u.hasPrev = r, now, true
	if i == len(k.up)-1 {
		k.held = k.queue.Len() > 0
	}
}

// deltaOf is the interval's totals between two readings; a process start time that moved or a
// total that went back is a restart.
func deltaOf(p, c *engine.Reading) *kvDelta {
	if c.Started != p.Started || c.PrefixQueries < p.PrefixQueries || c.PrefixHits < p.PrefixHits ||
		c.GenerationTokens < p.GenerationTokens || c.TTFTCount < p.TTFTCount || c.PrefillSum < p.PrefillSum ||
		c.DecodeSum < p.DecodeSum {
		return &kvDelta{restart: true}
	}
	d := &kvDelta{
		prompt:         float64(c.PrefixQueries - p.PrefixQueries), // vLLM's prompt_tokens_total
		hits:           float64(c.PrefixHits - p.PrefixHits),
		generated:      float64(c.GenerationTokens - p.GenerationTokens),
		prefillSeconds: (c.PrefillSum - p.PrefillSum).Seconds(),
		decodeSeconds:  (c.DecodeSum - p.DecodeSum).Seconds(),
		started:        float64(c.TTFTCount - p.TTFTCount),
	}
	// Without a computed count, the prompt tokens not found in the cache (telemetry.Delta).
	if d.hits <= d.prompt {
		d.computed = d.prompt - d.hits
	}
	return d
}

// outsideTraffic is kvroute's: whether the engine may lately hold requests this router does
// not count, from its started-request count against the requests sent (decide.Outside).
func (k *kvRouter) outsideTraffic(u *kvUpstream, d *kvDelta, now int64, interval time.Duration) bool {
	started, kind := 0.0, decide.StartsBaseline
	if d != nil && !d.restart {
		started, kind = d.started, decide.StartsCounted
	}
	return u.evidence.Observe(now, int64(interval), u.sent[0], u.inFlight, started, kind, u.abandonedAt)
}

// learnFrom takes in one interval (kvroute's learnFrom).
func (k *kvRouter) learnFrom(i int, d *kvDelta, r *engine.Reading, at int64) {
	u := &k.up[i]
	sent := u.sent
	dSent := [3]int64{sent[0] - u.lastSent[0], sent[1] - u.lastSent[1], sent[2] - u.lastSent[2]}
	first := !u.learned
	u.lastSent = sent
	dEnded := u.ended - u.lastEnded
	u.lastEnded = u.ended
	mixed := u.mixed
	u.mixed = false
	external := u.outside && (u.raw > 0 || u.lastRaw > 0)
	u.lastRaw = u.raw
	if d != nil && d.restart {
		u.prefill.Reset()
		u.decode.Reset()
		u.answers.Reset()
		u.slots.Reset()
		u.answerSpeed = 0
		k.forest.RemoveTenant(k.ids[i])
	}
	if d != nil && !d.restart && !first {
		if d.computed >= kvMinSampleTokens && d.prefillSeconds >= kvMinSampleSeconds {
			u.prefill.Observe(d.computed / d.prefillSeconds)
		}
		if d.generated >= kvMinSampleTokens && d.decodeSeconds >= kvMinSampleSeconds {
			u.decode.Observe(d.generated / d.decodeSeconds)
		}
		u.slots.ObserveOutput(d.generated, d.started)
		if u.modelSet && !mixed && !external {
			k.learnChars(u.model, d, dSent, dEnded)
		}
	}
	u.prefillSpeed, u.prefillLearned = decide.DefaultPrefillTokensPerSecond, false
	if v, ok := u.prefill.Value(); ok {
		u.prefillSpeed, u.prefillLearned = v, true
	}
	u.decodeSpeed, u.decodeLearnd = 0, false
	if v, ok := u.decode.Value(); ok {
		u.decodeSpeed, u.decodeLearnd = v, true
	}
	if k.held && r.Waiting <= 0 {
		u.slots.ObserveHeld(int64(r.Running), at)
	} else {
		u.slots.ObserveGauges(int64(r.Running), int64(r.Waiting), at)
	}
	u.slotCount, u.meanOutput = u.slots.Figures(at)
	u.learned = true
}

// learnChars is kvroute's: a model's chars per token from the totals of the intervals taken
// in, published once they are large enough and the chars sent and ended agree.
func (k *kvRouter) learnChars(model string, d *kvDelta, dSent [3]int64, dEnded int64) {
	tokens := d.prompt
	if tokens <= 0 && dSent[1] <= 0 && dEnded <= 0 {
		return
	}
	mc := k.chars[model]
	if mc == nil {
		mc = &kvChars{}
		k.chars[model] = mc
	}
	c, ok := mc.est.Add(decide.CharsInterval{Chars: float64(dSent[1]), Ended: float64(dEnded), Tokens: tokens,
		Sent: float64(dSent[0]), Started: d.started})
	if !ok {
		return
	}
	mc.value = c
	if mc.used == 0 || math.Abs(c-mc.used) > kvLimitsChange*mc.used {
		mc.used = c
		k.setLimits()
	}
}

// setLimits bounds the forest and each engine's share: 1.5 × its KV capacity in chars
// (kvroute's limitsLocked and tenantBound), evicting at once.
func (k *kvRouter) setLimits() {
	l := tree.Limits{MaxChars: kvMaxTreeSize}
	for i := range k.up {
		if c := k.up[i].capacity; c > 0 {
			if l.TenantMaxChars == nil {
				l.TenantMaxChars = map[string]int64{}
			}
			l.TenantMaxChars[k.ids[i]] = int64(float64(c) * k.upstreamCharsPerToken(i) * kvTenantSlack)
		}
	}
	k.forest.SetLimits(l)
}

// KVPolicies are kvroute's decisions as policies: kv_cache_aware (def, kvroute's default
// decision: decide.DefaultRule), kv_thresholds and kv_cost (objective latency), each with
// kvroute's default options, changed by tune when given (an experiment).
func KVPolicies(def decide.Rule, tune ...func(*KVSettings)) []Policy {
	mk := func(name string, rule decide.Rule) Policy {
		// kv_cache_aware draws from the same stream as the policy of its decision: the two
		// make the same choices.
		stream := "kv_" + RuleName(rule)
		return Policy{name, func(seed uint64) Router {
			k := newKVRouter(rule, stream, seed)
			k.tune(tune...)
			return k
		}}
	}
	return []Policy{mk("kv_cache_aware", def), mk("kv_thresholds", decide.Thresholds), mk("kv_cost", decide.Cost)}
}

// KVSettings are what an experiment may change in kvroute's policies: the decision's
// options and late binding's queue_timeout (0: off).
type KVSettings struct {
	Options      decide.Options
	QueueTimeout time.Duration
	HoldMargin   int64 // EXPERIMENT
	// FlowSpread is kv_flow's placement spread (flowControl.spread; an experiment).
	FlowSpread int64
}

func (k *kvRouter) tune(tune ...func(*KVSettings)) {
	st := KVSettings{Options: k.opts, QueueTimeout: k.queueTimeout, HoldMargin: k.holdMargin}
	for _, t := range tune {
		t(&st)
	}
	k.opts, k.queueTimeout, k.holdMargin = st.Options, st.QueueTimeout, st.HoldMargin
}

// RuleName is the card's name of a decision ("thresholds", "cost").
func RuleName(r decide.Rule) string {
	if r == decide.Cost {
		return "cost"
	}
	return "thresholds"
}

// ParseRule is RuleName's inverse; "" is decide.DefaultRule.
func ParseRule(s string) (decide.Rule, bool) {
	switch s {
	case "":
		return decide.DefaultRule, true
	case "thresholds":
		return decide.Thresholds, true
	case "cost":
		return decide.Cost, true
	}
	return 0, false
}
