package kvroute

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
	"github.com/kvroute/caddy-kvroute/kvroute/decide"
	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
)

// What kvroute learns from the engines' own totals (telemetry.Delta, one per scrape interval):
// each upstream's prefill and decode speed, each model's chars per token, and restarts.
const (
	// DefaultCharsPerToken is the chars of routing text per prompt token before a model's is
	// learned: English prose under the common BPE tokenizers.
	DefaultCharsPerToken = 4.0
	// DefaultPrefillTokensPerSecond is the prefill speed of an upstream with neither a learned
	// one nor prefill_tokens_per_second in its upstream block: a mid-range GPU on a 7-8B model.
	DefaultPrefillTokensPerSecond = 5000.0

	// speedWindow is how many interval samples a speed is the median of, and minSpeedSamples
	// how many it needs before it replaces the prior: one odd interval (a preemption, a
	// request that straddled two readings) moves a median of nine not at all.
	speedWindow     = decide.SpeedWindow
	minSpeedSamples = decide.MinSpeedSamples
	// A speed sample needs this much work behind it: a few tokens over a few microseconds of
	// rounding say nothing of the engine.
	minSampleTokens  = 32
	minSampleSeconds = 1e-3
	// Speeds outside these bounds are no engine's (tokens per second).
	minSpeed, maxSpeed = decide.MinSpeed, decide.MaxSpeed

	// A model's chars per token adds up every interval taken in since the model was first
	// sent (a tokenizer does not change), not a window of the latest: with several upstreams
	// feeding one model's window and requests in flight for longer than it (overloaded llm-d
	// on the Mooncake trace, tens of seconds), a window's chars, ended chars and tokens were
	// those of different requests, of sizes up to 100 times apart, and the figure swung from
	// −27% to +26%. Totals let a request counted by the router in one interval and by the
	// engine in another even out, and the requests in flight at the edges weigh ever less.
	// minCharsTokens and minCharsIntervals are how much it needs: a request whose chars and
	// tokens fall on different sides of an interval left out (one that sent two models) stays
	// in the totals, so they must be many times the largest request's (a 1,000-token one
	// over 2,000 made the figure 7% low).
	minCharsTokens    = decide.MinCharsTokens
	minCharsIntervals = decide.MinCharsIntervals
	// Chars per token outside these bounds are no tokenizer's on routing text.
	minCharsPerToken, maxCharsPerToken = decide.MinCharsPerToken, decide.MaxCharsPerToken
	// limitsChange: a model's chars per token that moved by more than this share from the one
	// the trees' bounds were computed with recomputes them.
	limitsChange = 0.02
	// maxCharsBias bounds the error of a published chars per token that the requests in flight
	// at the window's edges may cause (learnChars).
	maxCharsBias = decide.MaxCharsBias
	// maxLearnedModels bounds the models a chars per token is learned for (only listed ones:
	// learnChars).
	maxLearnedModels = 256
)

// sentCounts are what this router sent an upstream and its engine took in: requests, their
// routing-text chars and the chars it predicted the upstream held (the matched prefix), since
// the upstream appeared. A request counts at its decision, as the engine counts it when it
// starts (counting it when it ends would put the requests in flight in the engine's count and
// not the router's: 5% of a short run's); one the engine refused (a non-2xx: never prefilled,
// in none of its totals) or never got (a dial error) is taken back when its outcome is known.
type sentCounts struct {
	requests atomic.Int64
	chars    atomic.Int64
	matched  atomic.Int64
	// ended are the chars of the requests the engine served, counted as each ends: an engine
	// counts a request's prompt tokens somewhere between its decision and its end (ours at
	// its prefill, vLLM at its first token, llm-d's simulator at its end), so the engine's
	// count over a window lies between the chars sent and the chars ended in it.
	ended atomic.Int64
	// model is the model of the requests sent (a *string); mixed: more than one model since
	// the last interval, when no chars per token is learned from it.
	model atomic.Pointer[string]
	mixed atomic.Bool
	// partial counts the requests in flight whose routing text is only part of their prompt
	// (llmRequest.partialText): the engine counts tokens the router never read.
	// partialSeen: one started or ended since the last interval.
	partial     atomic.Int64
	partialSeen atomic.Bool
}

// partialIn counts a request with partial routing text in (d = 1) or out (-1).
func (c *sentCounts) partialIn(d int64) {
	c.partial.Add(d)
	c.partialSeen.Store(true)
}

// sent counts one decision for u (the request path: atomics only).
func (c *sentCounts) sent(model string, chars, matched int) {
	c.requests.Add(1)
	c.chars.Add(int64(chars))
	c.matched.Add(int64(matched))
	if m := c.model.Load(); m == nil || *m != model {
		if m != nil {
			c.mixed.Store(true)
		}
		m := model // escapes only here, when the model changes: not on every request
		c.model.Store(&m)
	}
}

// unsent takes back a request sent that the engine did not take in (health.go, judge). The
// model's mixed flag stays: it was sent.
func (c *sentCounts) unsent(chars, matched int) {
	c.requests.Add(-1)
	c.chars.Add(-int64(chars))
	c.matched.Add(-int64(matched))
}

// upstreamLearn is what an upstream's engine taught: owned by the upstream's scrape goroutine
// (observe), published through figures for the request path and the admin API.
type upstreamLearn struct {
	sent sentCounts

	mu        sync.Mutex
	prefill   decide.Speed // the latest speed samples, at most speedWindow
	decode    decide.Speed
	lastSent  [3]int64 // sent.requests, chars and matched at the previous interval
	lastEnded int64    // sent.ended at the previous interval
	lastRaw   int64    // the engine's load beyond this router's at the previous reading
	// lastPartial: a request with partial routing text ran in the previous interval.
	lastPartial bool
	slots       slotLearn

	// answers are prefill speed samples from single answers (llm_feedback: learnAnswer), and
	// answerSpeed their median (float64 bits; 0 until there are minSpeedSamples of them).
	answers     decide.Speed
	answerSpeed atomic.Uint64

	// The engine's own request count against this router's (outsideTraffic): started minus
	// sent since the baseline, the highest excess that was evidence, whether the engine counts
	// the requests it starts at all, and when the latest evidence was seen (unix nanoseconds).
	outside decide.Outside
	// abandonedAt is when a request sent there last ended without an answer (unix
	// nanoseconds; the request path's): its engine may still run it.
	abandonedAt atomic.Int64

	figures atomic.Pointer[learnedFigures]
	// restartedAt is when the engine's latest restart was seen, here or by the peer that reads
	// it (unix nanoseconds; 0: none).
	restartedAt atomic.Int64
	// peer is what the cluster replica that reads the engine learned (adoptLearned); shared
	// what this replica published last (shareLearned, the scrape goroutine's).
	peer   atomic.Pointer[cluster.EngineLearned]
	shared cluster.EngineLearned
	// Totals of the engine's deltas, for the metrics (float64 bits).
	engPrompt, engQueries, engHits, routed, predicted atomicFloat
	restarts, anomalies                               atomic.Uint64
}

// learnedFigures are an upstream's learned figures as of its latest interval.
type learnedFigures struct {
	Engine  string `json:"engine,omitempty"`
	Exports string `json:"exports"` // the totals its engine exports (telemetry.CounterFields)
	// PrefillTokensPerSecond: uncached prompt tokens per second of prefill, per request;
	// Learned says whether it is the engine's (else the prior: the upstream block's
	// prefill_tokens_per_second, else the default).
	PrefillTokensPerSecond float64 `json:"prefill_tokens_per_second"`
	PrefillLearned         bool    `json:"prefill_learned"`
	// PrefillFromAnswers is the prefill speed single answers taught (llm_feedback): their
	// tokens not cached over their time to first content (llama.cpp: its own prefill time).
	// It stands in for PrefillTokensPerSecond until the engine's totals teach one.
	PrefillFromAnswers    float64 `json:"prefill_tokens_per_second_from_answers,omitempty"`
	DecodeTokensPerSecond float64 `json:"decode_tokens_per_second,omitempty"`
	DecodeLearned         bool    `json:"decode_learned"`
	// Slots is the requests the engine runs at once, learned from its gauges (slots.go; 0
	// until learned); MeanOutputTokens its mean output per request (0 until learned).
	Slots            int64   `json:"slots,omitempty"`
	MeanOutputTokens float64 `json:"mean_output_tokens,omitempty"`
	// FromPeer: the speeds are those the cluster replica that reads the engine learned.
	FromPeer bool `json:"from_peer,omitempty"`
	// EngineHitRatio is the engine's own prefix-cache hit ratio over the latest interval that
	// queried its cache; PredictedHitRatio what the router predicted for what it sent there
	// in that interval (matched chars over routing chars).
	EngineHitRatio    *float64 `json:"engine_hit_ratio,omitempty"`
	PredictedHitRatio *float64 `json:"predicted_hit_ratio,omitempty"`
	Model             string   `json:"model,omitempty"` // of the requests sent, when one
	Restarts          uint64   `json:"restarts"`
	Anomalies         uint64   `json:"anomalies"`
}

type atomicFloat struct{ bits atomic.Uint64 }

func (f *atomicFloat) add(v float64) {
	for {
		old := f.bits.Load()
		if f.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

func (f *atomicFloat) load() float64 { return math.Float64frombits(f.bits.Load()) }

// modelChars is a model's chars per token: the totals of the intervals taken in (routing
// chars, engine prompt tokens), and the figure they make (float64 bits; 0 until learned).
type modelChars struct {
	mu    sync.Mutex
	est   decide.CharsPerToken // the totals of the intervals taken in
	value atomic.Uint64
	used  atomic.Uint64 // the value the trees' bounds were last computed with
	// touched is when an interval was last taken in (unix nanoseconds): the entry that learned
	// nothing for the longest gives way when the table is full.
	touched atomic.Int64
}

// charsPerToken is the chars of routing text per prompt token for model: learned, else
// DefaultCharsPerToken.
func (s *state) charsPerToken(model string) float64 {
	if v, ok := s.learnedChars.Load(model); ok {
		if c := math.Float64frombits(v.(*modelChars).value.Load()); c > 0 {
			return c
		}
	}
	return DefaultCharsPerToken
}

// upstreamCharsPerToken is the chars per token of the model an upstream was sent (its KV
// bound, its cached tokens): the default while it was sent none or several.
func (s *state) upstreamCharsPerToken(addr string) float64 {
	v, ok := s.upstreams.Load(addr)
	if !ok {
		return DefaultCharsPerToken
	}
	m := v.(*upstreamState).learn.sent.model.Load()
	if m == nil {
		return DefaultCharsPerToken
	}
	return s.charsPerToken(*m)
}

// tokensOf estimates the tokens of chars of routing text for model (at least 1 for any text).
func (s *state) tokensOf(model string, chars int64) int64 {
	if chars <= 0 {
		return 0
	}
	return max(1, int64(math.Round(float64(chars)/s.charsPerToken(model))))
}

// learnFrom takes in one scrape's delta (from the upstream's scrape goroutine, via observe).
func (s *state) learnFrom(u *upstreamState, cur *telemetry.Snapshot) {
	l := &u.learn
	d := cur.Delta
	prior := s.prefillPrior(cur.Key)
	l.mu.Lock()
	defer l.mu.Unlock()
	sent := [3]int64{l.sent.requests.Load(), l.sent.chars.Load(), l.sent.matched.Load()}
	dSent := [3]int64{sent[0] - l.lastSent[0], sent[1] - l.lastSent[1], sent[2] - l.lastSent[2]}
	first := l.figures.Load() == nil
	l.lastSent = sent
	ended := l.sent.ended.Load()
	dEnded := ended - l.lastEnded
	l.lastEnded = ended
	mixed := l.sent.mixed.Swap(false)
	// A request whose routing text is part of its prompt (cut at max_body) ran in this interval:
	// its engine counted tokens of text the router never read (two 10 MB prompts took a
	// learned 7 chars per token to 2.9). The interval after it too: the engine may count at
	// the request's end, just before this reading, and the router see its end just after.
	partial := l.sent.partialSeen.Swap(false) || l.sent.partial.Load() > 0
	afterPartial := l.lastPartial
	l.lastPartial = partial
	raw, outside := int64(0), true
	if e := u.engine.Load(); e != nil {
		raw, outside = e.raw, e.outside
	}
	// Only while the engine's counts show traffic from elsewhere: leaving out the intervals in
	// which its gauges alone showed more than this router's requests left out chars whose
	// tokens it counted in the next interval, kept (−10% to +26% on overloaded llm-d).
	external := outside && (raw > 0 || l.lastRaw > 0)
	l.lastRaw = raw
	f := learnedFigures{Engine: string(cur.Reading.Engine), Exports: cur.Reading.Counters.Known.String()}
	if old := l.figures.Load(); old != nil {
		f.EngineHitRatio, f.PredictedHitRatio = old.EngineHitRatio, old.PredictedHitRatio
	}
	if d != nil && d.Anomalies != 0 {
		l.anomalies.Add(1)
	}
	if d != nil && d.Restart {
		l.restartedAt.Store(time.Now().UnixNano())
		l.restarts.Add(1)
		l.prefill.Reset()
		l.decode.Reset()
		l.answers.Reset()
		l.slots.reset()
		l.answerSpeed.Store(0)
		s.engineRestarted(cur.Key)
	}
	if d != nil && !d.Restart && !first {
		if d.Known.Has(telemetry.HasComputedTokens|telemetry.HasPrefillTime) &&
			d.ComputedTokens >= minSampleTokens && d.PrefillSeconds >= minSampleSeconds {
			l.prefill.Observe(d.ComputedTokens / d.PrefillSeconds)
		}
		if d.Known.Has(telemetry.HasGenerationTokens|telemetry.HasDecodeTime) &&
			d.GenerationTokens >= minSampleTokens && d.DecodeSeconds >= minSampleSeconds {
			l.decode.Observe(d.GenerationTokens / d.DecodeSeconds)
		}
		l.slots.observeOutput(d)
		if d.Known.Has(telemetry.HasPromptTokens) {
			l.engPrompt.add(d.PromptTokens)
		}
		if r, ok := d.HitRatio(); ok {
			l.engQueries.add(d.CacheQueries)
			l.engHits.add(d.CacheHits)
			f.EngineHitRatio = &r
			if dSent[1] > 0 {
				p := min(1, max(0, float64(dSent[2])/float64(dSent[1])))
				f.PredictedHitRatio = &p
			}
		}
		if m := l.sent.model.Load(); m != nil && !mixed && !external && !partial && !afterPartial {
			s.learnChars(u.addr, *m, d, dSent, dEnded)
		}
	}
	l.routed.add(float64(dSent[1]))
	l.predicted.add(float64(dSent[2]))
	f.PrefillTokensPerSecond, f.PrefillLearned = prior, false
	if v, ok := l.prefill.Value(); ok {
		f.PrefillTokensPerSecond, f.PrefillLearned = v, true
	}
	if v, ok := l.decode.Value(); ok {
		f.DecodeTokensPerSecond, f.DecodeLearned = v, true
	}
	at := cur.Reading.At.UnixNano()
	l.slots.observe(&cur.Reading, at, s.wq.holding())
	f.Slots, f.MeanOutputTokens = l.slots.figures(at)
	if p := l.peer.Load(); p != nil && !f.PrefillLearned && !f.DecodeLearned && time.Since(p.At) < peerLearnedLifetime {
		// A replica that adopts the owner's readings gets no totals, so learns nothing.
		f.PrefillTokensPerSecond, f.PrefillLearned = p.PrefillTokensPerSecond, p.PrefillTokensPerSecond > 0
		if !f.PrefillLearned {
			f.PrefillTokensPerSecond = prior
		}
		f.DecodeTokensPerSecond, f.DecodeLearned = p.DecodeTokensPerSecond, p.DecodeTokensPerSecond > 0
		f.FromPeer = true
	}
	if m := l.sent.model.Load(); m != nil && !mixed {
		f.Model = *m
	}
	f.Restarts, f.Anomalies = l.restarts.Load(), l.anomalies.Load()
	l.figures.Store(&f)
	capacityFreed() // the engine's load or slots moved: a waiting request may go
}

// Outside traffic, from the engine's own counts (outsideTraffic).
const (
	// outsideTolerance is how many more requests than this router sent the engine may count
	// as started before that is evidence of traffic from elsewhere: a request the router took
	// back (a retry after the engine had started it) must not be enough.
	outsideTolerance = decide.OutsideTolerance
	// outsideMemory is how many intervals evidence keeps the external term on: traffic from
	// elsewhere starts requests every interval or so, and the gauges still show the ones that
	// run long after their start.
	outsideMemory = decide.OutsideMemory
)

// outsideTraffic reports whether the engine may lately hold requests this router does not
// count as its own in flight: the gauges alone (running + waiting beyond this router's count)
// cannot tell such requests from the moment between the engine's answer and this router's
// count, a spike of one reading that left out the chars per token's intervals it fell in.
//
// Two kinds: requests from elsewhere, and requests this router gave up on (their client left,
// or the upstream failed) that the engine still runs: llm-d's simulator does not notice a
// closed connection and runs even the queued ones (overloaded, with its clients' deadlines
// passing, its gauges showed up to 31 more than the router's). The second is a request sent
// there ending without an answer within outsideMemory intervals. The first shows in an engine
// that counts the requests it starts (its TTFT histogram, else its prefill-time histogram): of
// this router's requests it starts at most those it was sent, so started − sent, summed from a
// baseline at which the requests in flight are counted as not started yet, stays at or below
// 0; evidence is that sum rising more than outsideTolerance above its highest earlier evidence
// (0 at first). Without such a count (llama.cpp, TGI, SGLang without its histograms), in a
// cluster (the peers' requests start there too) and for a peer's reading (no delta), the
// gauges are taken as they are: the answer is true.
func (s *state) outsideTraffic(u *upstreamState, cur *telemetry.Snapshot, interval time.Duration) bool {
	if cur.FromPeer || s.node() != nil {
		return true
	}
	l := &u.learn
	l.mu.Lock()
	defer l.mu.Unlock()
	d := cur.Delta
	started, kind := 0.0, decide.StartsBaseline
	if d != nil && !d.Restart {
		kind = decide.StartsUncounted
		switch {
		case d.Known.Has(telemetry.HasTTFT) && d.TTFT != nil:
			started, kind = d.TTFT.Count, decide.StartsCounted
		case d.Known.Has(telemetry.HasPrefillTime):
			started, kind = d.PrefillRequests, decide.StartsCounted
		}
	}
	// A request this router gave up on (its client left, its upstream failed) may still run
	// there, uncounted here: an engine that does not notice a closed connection (llm-d's
	// simulator) runs even its queued ones. Its gauges then show real work.
	return l.outside.Observe(cur.Reading.At.UnixNano(), int64(interval), l.sent.requests.Load(), u.own(), started, kind, l.abandonedAt.Load())
}

// learnChars adds an interval's routing chars and engine prompt tokens to model's chars per
// token. The caller passes only intervals where this router is likely the engine's only source
// (no cluster, no traffic from elsewhere, one model sent); intervals in which it sent nothing
// count too, or the tokens of requests sent just before a reading would be lost and the figure
// biased up. The figure is published only while the engine, over the intervals taken in,
// started no more requests than this router sent it (its TTFT or prefill-time count, where
// exported).
//
// The engine counts each request between its decision and its end: over the intervals its
// tokens are those of the chars sent, less or more the requests in flight at the edges (all of
// a short run's: 16 clients in 300 requests are 5%). The chars taken are the midpoint of the
// chars sent and the chars ended, and the figure is published only while these
// differ by at most 1.8 × maxCharsBias of it: its error is then within maxCharsBias, whichever
// moment the engine counts at (half the gap, over the chars sent or ended).
//
// A model gets its place in the table (maxLearnedModels) only when the engine at addr, which
// exports its prompt-token totals, lists it (its /v1/models, or its upstream block's models):
// model names come from clients, and one no engine lists never learns a figure. When the table
// is full, the entry that learned nothing for the longest gives way.
func (s *state) learnChars(addr, model string, d *telemetry.Delta, dSent [3]int64, dEnded int64) {
	tokens := 0.0
	switch {
	case d.Known.Has(telemetry.HasPromptTokens):
		tokens = d.PromptTokens
	case d.Known.Has(telemetry.HasCacheQueries):
		// vLLM-like engines without a prompt total (llm-d's simulator before a request
		// finished) look every prompt token up in the prefix cache once.
		tokens = d.CacheQueries
	default:
		return // llama.cpp counts only the tokens it computed
	}
	if s.node() != nil || (tokens <= 0 && dSent[1] <= 0 && dEnded <= 0) {
		return
	}
	started := -1.0
	switch {
	case d.Known.Has(telemetry.HasTTFT):
		started = d.TTFT.Count
	case d.Known.Has(telemetry.HasPrefillTime):
		started = d.PrefillRequests
	}
	v, ok := s.learnedChars.Load(model)
	if !ok {
		// Model names come from clients: only a model the engine lists, and a bounded number
		// of them. (From its first interval on, even one whose tokens the engine has not
		// counted yet: left out, those chars would come back as tokens without chars.)
		// Requests that name no model share the one tree named "": one entry, never junk.
		if model != "" && !s.listedModel(addr, model) {
			return
		}
		if s.nLearnedChars.Load() >= maxLearnedModels && !s.evictUnlearned() {
			return
		}
		// touched is set before the entry is visible: a concurrent eviction (each upstream's
		// reader learns on its own goroutine) never takes a new entry for the oldest.
		fresh := &modelChars{}
		fresh.touched.Store(time.Now().UnixNano())
		var loaded bool
		if v, loaded = s.learnedChars.LoadOrStore(model, fresh); !loaded {
			s.nLearnedChars.Add(1)
		}
	}
	mc := v.(*modelChars)
	mc.touched.Store(time.Now().UnixNano())
	mc.mu.Lock()
	c, ok := mc.est.Add(decide.CharsInterval{Chars: float64(dSent[1]), Ended: float64(dEnded), Tokens: tokens,
		Sent: float64(dSent[0]), Started: started})
	mc.mu.Unlock()
	if !ok {
		return
	}
	mc.value.Store(math.Float64bits(c))
	if used := math.Float64frombits(mc.used.Load()); used == 0 || math.Abs(c-used) > limitsChange*used {
		mc.used.Store(math.Float64bits(c))
		s.mu.Lock()
		s.forest.SetLimits(s.limitsLocked(s.options.maxTreeSize))
		s.mu.Unlock()
	}
}

// listedModel reports whether the engine at addr serves model by name: its upstream block's
// models, else its latest /v1/models.
func (s *state) listedModel(addr, model string) bool {
	if prof, ok := s.profile(addr); ok && len(prof.Models) > 0 {
		return slices.Contains(prof.Models, model)
	}
	_, ok := s.modelList(addr).Find(model)
	return ok
}

// evictUnlearned removes, from the full table of learned models, the entry that has learned no
// figure and was taken in least recently; false when every entry learned one.
func (s *state) evictUnlearned() bool {
	var oldest string
	var at int64
	var victim *modelChars
	s.learnedChars.Range(func(k, v any) bool {
		mc := v.(*modelChars)
		if mc.value.Load() == 0 && (victim == nil || mc.touched.Load() < at) {
			oldest, at, victim = k.(string), mc.touched.Load(), mc
		}
		return true
	})
	if victim == nil || !s.learnedChars.CompareAndDelete(oldest, victim) {
		return false
	}
	s.nLearnedChars.Add(-1)
	return true
}

// Sharing learned figures in a cluster (cluster.EngineLearned).
const (
	// peerLearnedLifetime: a peer's figures stand this long after it learned them (its owner
	// republishes them at least every learnedRefresh while it reads the engine).
	peerLearnedLifetime = time.Minute
	learnedRefresh      = 10 * time.Second
	// peerRestartWindow: a restart a peer saw longer ago than this drops no share here (a
	// replica that joins later learns of it without forgetting what came after).
	peerRestartWindow = time.Minute
)

// shareLearned publishes what this replica learned of an engine it owns (from the target's
// goroutine, after observe): when a speed moved by more than limitsChange, on a new restart, and
// every learnedRefresh.
func (s *state) shareLearned(cur *telemetry.Snapshot) {
	n := s.node()
	if n == nil || cur.Outcome != telemetry.OutcomeOK || cur.FromPeer || !n.Owns(cur.Key) {
		return
	}
	v, ok := s.upstreams.Load(cur.Key)
	if !ok {
		return
	}
	l := &v.(*upstreamState).learn
	f := l.figures.Load()
	if f == nil || f.FromPeer {
		return
	}
	e := cluster.EngineLearned{Upstream: cur.Key, At: cur.Reading.At}
	if f.PrefillLearned {
		e.PrefillTokensPerSecond = f.PrefillTokensPerSecond
	}
	if f.DecodeLearned {
		e.DecodeTokensPerSecond = f.DecodeTokensPerSecond
	}
	if at := l.restartedAt.Load(); at > 0 {
		e.RestartedAt = time.Unix(0, at)
	}
	if e.PrefillTokensPerSecond == 0 && e.DecodeTokensPerSecond == 0 && e.RestartedAt.IsZero() {
		return
	}
	moved := func(a, b float64) bool { return math.Abs(a-b) > limitsChange*math.Max(a, b) }
	last := l.shared
	if !last.At.IsZero() && e.At.Sub(last.At) < learnedRefresh && e.RestartedAt.Equal(last.RestartedAt) &&
		!moved(e.PrefillTokensPerSecond, last.PrefillTokensPerSecond) && !moved(e.DecodeTokensPerSecond, last.DecodeTokensPerSecond) {
		return
	}
	l.shared = e
	n.PublishLearned(e)
}

// adoptLearned takes in what the peer that reads an engine learned (the cluster's Handler): its
// speeds stand in for this replica's while it learns none itself, and a restart it saw drops the
// engine's share of this replica's trees too, once.
func (s *state) adoptLearned(e cluster.EngineLearned) {
	v, ok := s.upstreams.Load(e.Upstream)
	if !ok {
		return
	}
	u := v.(*upstreamState)
	l := &u.learn
	l.peer.Store(&e)
	if e.RestartedAt.IsZero() || time.Since(e.RestartedAt) > peerRestartWindow {
		return
	}
	at := e.RestartedAt.UnixNano()
	// The same restart seen here already, or relayed with a clock offset: within a second.
	if prev := l.restartedAt.Load(); at <= prev+int64(time.Second) {
		return
	}
	l.restartedAt.Store(at)
	l.restarts.Add(1)
	l.forgetSlots()
	s.engineRestarted(e.Upstream)
}

// forgetSlots drops the slot count and mean output learned for the upstream's engine (a
// restart a peer saw, its reader gone): the engine may come back with other settings, and a
// stale figure would price a wait that is not there.
func (l *upstreamLearn) forgetSlots() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.slots.reset()
	if f := l.figures.Load(); f != nil && (f.Slots != 0 || f.MeanOutputTokens != 0) {
		g := *f
		g.Slots, g.MeanOutputTokens = 0, 0
		l.figures.Store(&g)
	}
}

// engineRestarted drops the upstream's share of every tree: its engine came back with an
// empty cache. Its session bindings stay: the next turn of each goes there and warms it.
func (s *state) engineRestarted(addr string) {
	chars := s.forest.TenantChars(addr)
	s.forest.RemoveTenant(addr)
	metricRestarts.WithLabelValues(addr).Inc()
	s.log().Info("telemetry: the upstream's engine restarted; its share of the prefix trees is dropped",
		zap.String("upstream", addr), zap.Int64("dropped_chars", chars))
}

// prefillPrior is the upstream's prefill speed before one is learned: the newest live
// config's prefill_tokens_per_second for it, else DefaultPrefillTokensPerSecond.
func (s *state) prefillPrior(addr string) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var newest *registration
	v := 0.0
	for q := range s.regs {
		if prof, ok := q.profiles[addr]; ok && prof.PrefillTokensPerSecond > 0 && (newest == nil || q.provisioned.After(newest.provisioned)) {
			newest, v = q, prof.PrefillTokensPerSecond
		}
	}
	if v > 0 {
		return v
	}
	return DefaultPrefillTokensPerSecond
}

// learnedStatus is an upstream's learned figures for the admin API; before any interval, the
// priors.
func (s *state) learnedStatus(addr string) *learnedFigures {
	v, ok := s.upstreams.Load(addr)
	if !ok {
		return &learnedFigures{PrefillTokensPerSecond: s.prefillPrior(addr)}
	}
	l := &v.(*upstreamState).learn
	f := l.figures.Load()
	answers := math.Float64frombits(l.answerSpeed.Load())
	switch {
	case f != nil && (answers == 0 || f.PrefillLearned):
		if answers > 0 {
			g := *f
			g.PrefillFromAnswers = answers
			return &g
		}
		return f
	case f == nil:
		f = &learnedFigures{PrefillTokensPerSecond: s.prefillPrior(addr)}
	default:
		g := *f
		f = &g
	}
	if answers > 0 {
		f.PrefillFromAnswers = answers
		f.PrefillTokensPerSecond = answers
	}
	return f
}

// learnAnswer takes in one answer's prefill (llm_feedback): llama.cpp's own prefill time when
// it reports it, else its tokens not cached over the time from the attempt to its first content
// (which includes the engine's queue, so a median of several, like the interval samples). Only
// a streamed answer (or a prefill leg's, one token long) has a first content (hasTTFT): a
// non-streamed answer's first byte comes after its whole decode, and its time would make the
// speed uncached tokens over prefill and decode (1,958 tokens/s measured for a true 100,000). A
// decode leg never comes here: its prompt arrived as KV blocks.
func (s *state) learnAnswer(u *upstreamState, us usage, ttft time.Duration, hasTTFT bool) {
	var v float64
	switch uncached := us.prompt - us.cached; {
	case us.prefillMS > 0 && us.computed >= minSampleTokens:
		v = us.computed / (us.prefillMS / 1000)
	case hasTTFT && us.cachedKnown && ttft.Seconds() >= minSampleSeconds && uncached >= minSampleTokens:
		v = uncached / ttft.Seconds()
	default:
		return
	}
	l := &u.learn
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answers.Observe(v)
	if m, ok := l.answers.Value(); ok {
		l.answerSpeed.Store(math.Float64bits(m))
	}
}

var metricRestarts = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: ns, Subsystem: sub, Name: "engine_restarts_total",
	Help: "Restarts of the upstream's engine seen in its telemetry (a total that went back, or a new process start time); each drops its share of the prefix trees.",
}, []string{"upstream"})

// learnCollector exports the learned figures at scrape time.
type learnCollector struct{}

var (
	descPrefillSpeed = prometheus.NewDesc(ns+"_"+sub+"_prefill_tokens_per_second",
		"The upstream's prefill speed, uncached prompt tokens per second per request: learned from its engine's totals, else the prior.", []string{"upstream"}, nil)
	descDecodeSpeed = prometheus.NewDesc(ns+"_"+sub+"_decode_tokens_per_second",
		"The upstream's decode speed per request, learned from its engine's totals (absent until learned).", []string{"upstream"}, nil)
	descCharsPerToken = prometheus.NewDesc(ns+"_"+sub+"_chars_per_token",
		"Chars of routing text per prompt token, learned per model from the engines' prompt-token totals (absent until learned: 4 is used).", []string{"model"}, nil)
	descEnginePrompt = prometheus.NewDesc(ns+"_"+sub+"_engine_prompt_tokens_total",
		"Prompt tokens the upstream's engine counted, added up from its telemetry intervals.", []string{"upstream"}, nil)
	descEngineQueries = prometheus.NewDesc(ns+"_"+sub+"_engine_cache_queries_total",
		"Prompt tokens the upstream's engine looked up in its prefix cache, from its telemetry intervals.", []string{"upstream"}, nil)
	descEngineHits = prometheus.NewDesc(ns+"_"+sub+"_engine_cache_hits_total",
		"Prompt tokens the upstream's engine found in its prefix cache, from its telemetry intervals: over engine_cache_queries_total, its own hit ratio.", []string{"upstream"}, nil)
	descRouted = prometheus.NewDesc(ns+"_"+sub+"_routed_chars_total",
		"Chars of routing text this router sent the upstream, less those of requests its engine refused (a non-2xx) or never got.", []string{"upstream"}, nil)
	descPredicted = prometheus.NewDesc(ns+"_"+sub+"_predicted_cached_chars_total",
		"Chars of the routing text sent the upstream (routed_chars_total) that the router predicted it held: over routed_chars_total, the predicted hit ratio.", []string{"upstream"}, nil)
	descAnomalies = prometheus.NewDesc(ns+"_"+sub+"_telemetry_anomalies_total",
		"Telemetry intervals of the upstream left partly or wholly out (a total that wobbled back, a family gone, another model, an absurd rate, changed buckets).", []string{"upstream"}, nil)
)

func (*learnCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPrefillSpeed, descDecodeSpeed, descCharsPerToken, descEnginePrompt,
		descEngineQueries, descEngineHits, descRouted, descPredicted, descAnomalies} {
		ch <- d
	}
	metricRestarts.Describe(ch)
}

func (*learnCollector) Collect(ch chan<- prometheus.Metric) {
	metricRestarts.Collect(ch)
	s := currentState()
	if s == nil {
		return
	}
	s.learnedChars.Range(func(k, v any) bool {
		if c := math.Float64frombits(v.(*modelChars).value.Load()); c > 0 {
			ch <- prometheus.MustNewConstMetric(descCharsPerToken, prometheus.GaugeValue, c, k.(string))
		}
		return true
	})
	for _, addr := range s.upstreamAddrs() {
		v, ok := s.upstreams.Load(addr)
		if !ok {
			continue
		}
		l := &v.(*upstreamState).learn
		f := s.learnedStatus(addr)
		ch <- prometheus.MustNewConstMetric(descPrefillSpeed, prometheus.GaugeValue, f.PrefillTokensPerSecond, addr)
		if f.DecodeLearned {
			ch <- prometheus.MustNewConstMetric(descDecodeSpeed, prometheus.GaugeValue, f.DecodeTokensPerSecond, addr)
		}
		ch <- prometheus.MustNewConstMetric(descRouted, prometheus.CounterValue, float64(l.sent.chars.Load()), addr)
		ch <- prometheus.MustNewConstMetric(descPredicted, prometheus.CounterValue, float64(l.sent.matched.Load()), addr)
		if l.figures.Load() == nil {
			continue // not read
		}
		ch <- prometheus.MustNewConstMetric(descEnginePrompt, prometheus.CounterValue, l.engPrompt.load(), addr)
		ch <- prometheus.MustNewConstMetric(descEngineQueries, prometheus.CounterValue, l.engQueries.load(), addr)
		ch <- prometheus.MustNewConstMetric(descEngineHits, prometheus.CounterValue, l.engHits.load(), addr)
		ch <- prometheus.MustNewConstMetric(descAnomalies, prometheus.CounterValue, float64(l.anomalies.Load()), addr)
	}
}

// learnedCharsMap is every learned chars per token, by model.
func (s *state) learnedCharsMap() map[string]float64 {
	out := map[string]float64{}
	s.learnedChars.Range(func(k, v any) bool {
		if c := math.Float64frombits(v.(*modelChars).value.Load()); c > 0 {
			out[k.(string)] = c
		}
		return true
	})
	return out
}
