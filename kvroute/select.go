package kvroute

import (
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvroute/caddy-kvroute/energy"
	"github.com/kvroute/caddy-kvroute/tree"
)

// candidate is one upstream that may take the request.
type candidate struct {
	up    *reverseproxy.Upstream
	st    *upstreamState
	prof  *energy.Profile
	load  int64          // requests in flight, as this router counts them
	match int            // leading runes of the routing text it holds
	cost  costPrediction // decision cost only (cost.go)
	// adapter is adapterCost: 0 unless the request names a LoRA adapter not warm there;
	// lora: the request names a LoRA adapter (fleet.go).
	adapter float64
	lora    bool
}

// Select picks the upstream for r. The decision, in order (docs/design.md):
//
//  1. Candidates: available upstreams that serve the request's model; those the policy holds
//     to be down (health.go), then those at max_concurrency, are left out unless all are, and
//     on a retry so are those earlier attempts went to, unless all are. None: nil (Caddy
//     answers 502, or retries when configured to).
//  2. Session: a session bound to a candidate whose load is within the balance band goes there.
//     A bound upstream out of band is skipped for this request and the binding kept; one that is
//     unavailable or no longer serves the model is dropped; one merely not in this pool is kept;
//     on a retry, one an earlier attempt went to (it failed) gives the session to this attempt.
//  3. Imbalance: when max-min > balance_abs_threshold and max > min×balance_rel_threshold over
//     the candidates' loads, on_imbalance decides: prefix_in_band (default) the longest cached
//     prefix among the candidates in the band, least_busy the least busy candidate.
//  4. Prefix: the candidate holding the longest prefix of the routing text, when the matched
//     share is above cache_threshold (a prefix shorter than one KV block is no match).
//  5. Fallback: the configured placement (joule by default).
//  6. Record: the routing text goes into the model's tree under the chosen upstream, the
//     session is bound, the decision counted, and the session cookie set when configured.
//
// With decision cost (cost.go, docs/decision.md), every candidate gets a predicted time to
// first token after step 1; step 2 keeps a session while its upstream is in the band and its
// prediction within ttft_slack of the best move's, a move priced at what it forfeits
// (moveBound), and steps 3 to 5 are one ranking by it (byCost).
//
// Load is defined in load.go. Steps 1 to 5 read the loads, and the choice counts in them
// before the next decision reads them: decisions of this router run one at a time from
// reading the loads to counting the choice (state.deciding), so each sees every decision made
// before it, those running at once included. The tree match before and the recording after
// run outside. The band therefore holds as if decisions came one after another: the upstream a
// session, a prefix or the fallback goes to has, counting every earlier decision, a load within
// the band of the least loaded candidate (docs/design.md: the bound).
func (p *KVCacheAware) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	p.state.ready(p.reg)
	req := attemptFor(r, DefaultMaxBody)
	defer req.placed()
	p.state.noteRetry(r, req)
	// The tree match, the slow part, runs before the decisions' lock; the candidates take
	// their matches from it (steps 2 to 4 rank by them).
	treeName := p.treeName(req.Model)
	held := p.matchText(treeName, req.Text)
	defer held.release()
	estimate := p.state.tokensOf(req.Model, int64(req.Runes)) // the prompt's tokens, for the queue
	if hook := testHookDecide.Load(); hook != nil {
		(*hook)()
	}
	p.state.deciding.Lock()
	locked := true
	unlock := func() {
		if locked {
			locked = false
			p.state.deciding.Unlock()
		}
	}
	defer unlock() // a panic in steps 1 to 5 must not hold up every later decision

	// 1. Candidates.
	var buf [16]candidate
	cands := untried(p.candidates(buf[:0], pool, req.Model), req.tried)
	if len(cands) == 0 {
		unlock()
		req.untrack()
		p.count(nil, req, pathNoCandidate)
		return nil
	}
	held.assign(cands)
	band := p.bandOf(cands)
	cost := p.opts.decision == decisionCost
	if cost {
		p.predict(cands, costInputs{prompt: estimate, charsPerToken: p.state.charsPerToken(req.Model), now: time.Now().UnixNano(), output: p.decodeOutput(cands, req)})
		band.cost, band.best, band.slack = true, bestTTFT(cands, band), p.opts.ttftSlack
	}

	// 2. Session. A Responses follow-up goes first to the engine that stored the response it
	// names (responses.go), whatever the balance.
	sess := p.session(r, req, pool, cands, band)
	chosen, path := sess.chosen, pathSession
	if i := p.followUp(req, cands); i >= 0 {
		chosen = i
	}

	// 3 to 5, decision cost: the ranking by predicted TTFT.
	if chosen < 0 && cost {
		chosen, path = p.byCost(cands, req, band)
	}

	// 3. Imbalance.
	if chosen < 0 {
		chosen, path = p.imbalance(cands, band)
	}

	// 4. Prefix.
	if chosen < 0 {
		chosen, path = p.prefix(cands, req)
	}

	// 5. Fallback.
	if chosen < 0 {
		chosen, path = p.place(cands, req), pathFallback
	}

	// 6. Record: the choice counts in the loads before the next decision reads them.
	c := &cands[chosen]
	if !cost {
		p.predictOne(cands[chosen:chosen+1], req, estimate)
	}
	uncached := c.cost.uncached
	if req.leg == legDecode {
		// Its prompt arrives as KV blocks from the prefill engine (llm_disaggregate): it
		// queues no prefill there.
		uncached = 0
	}
	req.track(r, c.st, estimate, uncached, int64(c.cost.ttft*1e9))
	if cost {
		p.state.recent.record(req.Model, cands, chosen, path)
	}
	unlock()
	req.bestMatch = bestMatch(cands) // what the choice gave up for balance (feedback.go)
	p.explain(w, req, c, path)
	return p.commit(r, w, req, c, treeName, sess, path)
}

// testHookDecide, when set (tests only), is called by every decision after the tree match and
// before the choice: tests hold decisions there to make them run at once.
var testHookDecide atomic.Pointer[func()]

// candidates appends to dst the upstreams of pool that may take a request for model (step 1).
func (p *KVCacheAware) candidates(dst []candidate, pool reverseproxy.UpstreamPool, model string) []candidate {
	now := time.Now().UnixNano()
	for _, up := range pool {
		if up == nil || !up.Available() {
			continue
		}
		prof := p.profiles[up.Dial]
		if model != "" && prof != nil && !prof.Serves(model) {
			continue
		}
		st := p.state.upstream(up.Dial)
		st.seeHost(up.Host)
		if !p.state.isStatic(up.Dial) {
			p.state.seeDynamic(st, now)
		}
		load := p.state.load(st, now)
		dst = append(dst, candidate{up: up, st: st, prof: prof, load: load})
	}
	// The engines' model lists (fleet.go) leave out those that do not serve the model.
	dst = p.state.served(dst, model)
	// Each filter leaves out candidates unless it would leave out all of them: then Caddy's
	// own view of the pool decides.
	dst = leaveOut(dst, func(c *candidate) bool { return c.st.health.down.Load() })
	return leaveOut(dst, func(c *candidate) bool { return saturatedAt(c.prof, c.load) })
}

func saturatedAt(prof *energy.Profile, load int64) bool {
	return prof != nil && prof.MaxConcurrency > 0 && load >= int64(prof.MaxConcurrency)
}

// untried leaves out the upstreams that earlier attempts of this request went to, unless that
// would leave none: Caddy retries when an attempt fails (a refused connection, lb_retry_match),
// and the prefix, the session and the energy placement would otherwise all point back at the
// upstream that just failed.
func untried(cands []candidate, tried []string) []candidate {
	if len(tried) == 0 {
		return cands
	}
	return leaveOut(cands, func(c *candidate) bool { return slices.Contains(tried, c.up.Dial) })
}

// leaveOut removes the candidates out reports, unless it reports every one of them (then all
// stay). out is asked once per candidate, so a flag that changes meanwhile (an upstream going
// down) cannot make it remove them all.
func leaveOut(cands []candidate, out func(*candidate) bool) []candidate {
	var buf [16]bool
	flags := buf[:0]
	n := 0
	for i := range cands {
		o := out(&cands[i])
		flags = append(flags, o)
		if o {
			n++
		}
	}
	if n == 0 || n == len(cands) {
		return cands
	}
	kept := cands[:0]
	for i := range cands {
		if !flags[i] {
			kept = append(kept, cands[i])
		}
	}
	return kept
}

var matchPool = sync.Pool{New: func() any { return new(tree.Match) }}

// minMatchRunes is the shortest shared prefix that counts as a match: one KV block of 16 tokens
// (vLLM's and SGLang's default page size) at 4 chars per token. A shorter one caches nothing on
// the upstream, and the routing text's role markers alone ("user", a separator) would otherwise
// make every short prompt a partial match everywhere.
const minMatchRunes = 64

// heldMatch is what the tree holds of a routing text: the upstreams holding a prefix of it and
// how long. It is taken before the decision's lock (matching is the slow part of a decision)
// and handed back to matchPool when the decision is done.
type heldMatch struct{ m *tree.Match }

// matchText matches text against the model's tree.
func (p *KVCacheAware) matchText(treeName, text string) heldMatch {
	if text == "" {
		return heldMatch{}
	}
	t := p.state.forest.Get(treeName)
	if t == nil {
		return heldMatch{}
	}
	m := matchPool.Get().(*tree.Match)
	m.Runes, m.Tenants = 0, m.Tenants[:0]
	t.Match(text, m)
	return heldMatch{m}
}

// assign sets each candidate's match: the leading runes of the routing text that the tree says
// it holds. Steps 2 to 4 rank by it.
func (h heldMatch) assign(cands []candidate) {
	if h.m == nil {
		return
	}
	for _, tm := range h.m.Tenants {
		if tm.Runes < minMatchRunes {
			break // longest first: the rest are shorter still
		}
		if i := indexOf(cands, tm.Tenant); i >= 0 && cands[i].match == 0 {
			cands[i].match = tm.Runes
		}
	}
}

func (h heldMatch) release() {
	if h.m != nil {
		matchPool.Put(h.m)
	}
}

// band is the candidates' balance band: the loads within the balance thresholds of the least
// loaded candidate. The session step and prefix_in_band keep to it.
type band struct {
	lo, hi   int64
	abs      int64
	rel      float64
	overflow bool // the loads are imbalanced: max-min beyond both thresholds
	// With decision cost: best is the lowest predicted TTFT in the band, slack ttft_slack.
	cost        bool
	best, slack float64
}

func (p *KVCacheAware) bandOf(cands []candidate) band {
	b := band{lo: cands[0].load, hi: cands[0].load, abs: p.opts.absThreshold, rel: p.opts.relThreshold}
	for _, c := range cands[1:] {
		b.lo, b.hi = min(b.lo, c.load), max(b.hi, c.load)
	}
	b.overflow = !b.holds(b.hi)
	return b
}

// holds reports whether load is within the band.
func (b band) holds(load int64) bool {
	return load-b.lo <= b.abs || float64(load) <= float64(b.lo)*b.rel
}

// keeps reports whether a session bound to cands[i] stays there: its load is within the band
// and, with decision cost, its predicted TTFT within ttft_slack of the best place to move the
// request to, counting what the move forfeits (keepsWarm).
func (b band) keeps(cands []candidate, i int) bool {
	c := &cands[i]
	return b.holds(c.load) && (!b.cost || keepsWarm(cands, b, c))
}

// heldElsewhere reports whether a candidate in the band holds at least one KV block
// (minMatchRunes) more of the routing text than cands[i].
func heldElsewhere(cands []candidate, i int, b band) bool {
	w := longest(cands, func(c *candidate) bool { return b.holds(c.load) })
	return w >= 0 && cands[w].match >= cands[i].match+minMatchRunes
}

// sessionStep is what the session step found.
type sessionStep struct {
	id     string // "" when the request has no session
	key    string // what the stores bind it under (state.sessionKey: a digest with a cluster)
	source sessionSource
	keep   bool // the binding stays as it is (its upstream was skipped for this request)
	chosen int  // the candidate the session goes to, or -1
}

// sessionSource tells where a session id came from.
type sessionSource uint8

const (
	fromHeader sessionSource = iota
	fromCookie
	fromBody
	issued // a new cookie id made for this request: bound in the pending space
)

// session runs step 2.
func (p *KVCacheAware) session(r *http.Request, req *llmRequest, pool reverseproxy.UpstreamPool, cands []candidate, b band) sessionStep {
	s := sessionStep{chosen: -1}
	s.id, s.source = p.sessionID(r, req)
	if s.id == "" {
		return s
	}
	s.key = p.state.sessionKey(s.id)
	if req.leg == legPrefill {
		// A split request's session is bound in each pool apart (llm_disaggregate): the prefill
		// pool's binding must not move the decode pool's.
		s.key = "prefill\x00" + s.key
	}
	store := p.state.sessions
	if s.source == issued {
		store = p.state.pending
	}
	addr, ok := store.get(req.Model, s.key, time.Now())
	if !ok && s.source == fromCookie {
		// The client presents an id issued earlier: its first binding waits in pending.
		store = p.state.pending
		addr, ok = store.get(req.Model, s.key, time.Now())
	}
	if !ok {
		return s
	}
	switch i := indexOf(cands, addr); {
	case slices.Contains(req.tried, addr):
		// An earlier attempt of this request went there and failed (Caddy retries only a failed
		// attempt: no response, or one lb_retry_match rejects): the session moves to where this
		// attempt goes (its latest turn will be cached there), and on with each retry.
	case i >= 0 && b.cost && heldElsewhere(cands, i, b):
		// decision cost: another candidate in the band holds at least a KV block more of the
		// prompt than the session's upstream (a turn went there): the request is warm there,
		// byCost prices it, and the binding follows it. Going back would prefill the turns
		// held there again and leave their copy to take cache (measured: docs/benchmarks.md
		// "Issue 23").
	case i >= 0 && b.keeps(cands, i):
		s.chosen = i
	case i < 0 && p.state.listedElsewhere(addr, req.Model, cands):
		// Its engine's model list leaves it out (fleet.go): it does not serve the model.
		store.forgetBinding(req.Model, s.key)
	case i >= 0 || p.keepsBinding(pool, addr, req.Model):
		// Skipped for this request only: out of band (beyond the TTFT bound), saturated, or
		// another site's upstream.
		if s.source == fromCookie && store == p.state.pending {
			// The client presented its cookie back: the binding it earned leaves pending as it
			// is, not rebound to where this one request goes.
			p.state.sessions.bind(req.Model, s.key, addr, time.Now())
			store.forgetBinding(req.Model, s.key)
		}
		s.keep = s.source != issued
	default:
		store.forgetBinding(req.Model, s.key)
	}
	return s
}

// keepsBinding reports whether a binding to addr, which is not among the candidates, stays:
// addr is not in this request's pool but is in another policy's (another site's upstream), or
// it is in the pool, available, not down and serving model, and was left out for being at
// max_concurrency. An upstream in no live pool has left the config.
func (p *KVCacheAware) keepsBinding(pool reverseproxy.UpstreamPool, addr, model string) bool {
	for _, up := range pool {
		if up == nil || up.Dial != addr {
			continue
		}
		prof := p.profiles[addr]
		return up.Available() && !p.state.isDown(addr) && (model == "" || prof == nil || prof.Serves(model))
	}
	return p.state.isStatic(addr)
}

// sessionID returns the request's session id and where it came from: the header, else a valid
// session cookie, else the body's prompt_cache_key. With session_cookie configured and no
// session id at all, it issues a new cookie id; a retry keeps the id of the first attempt.
func (p *KVCacheAware) sessionID(r *http.Request, req *llmRequest) (string, sessionSource) {
	if v := r.Header.Get(p.opts.sessionHeader); v != "" {
		return boundKey(v, maxSessionLen), fromHeader
	}
	if p.cookie != nil {
		if id, ok := p.cookie.fromRequest(r); ok {
			return id, fromCookie
		}
	}
	if req.Session != "" {
		return req.Session, fromBody
	}
	if p.cookie == nil {
		return "", fromHeader
	}
	if req.cookieID == "" {
		req.cookieID, _ = p.cookie.newID()
	}
	return req.cookieID, issued
}

// imbalance runs step 3: when the loads are imbalanced, on_imbalance picks among the
// candidates.
func (p *KVCacheAware) imbalance(cands []candidate, b band) (int, int) {
	if !b.overflow {
		return -1, pathImbalance
	}
	if p.inBand {
		if i := longest(cands, func(c *candidate) bool { return b.holds(c.load) }); i >= 0 {
			return i, pathImbalance
		}
		if i := p.warmInBand(cands, b); i >= 0 {
			return i, pathImbalance
		}
	}
	return p.leastBusy(cands), pathImbalance
}

// prefix runs step 4: the candidate holding the longest prefix, when its share of the routing
// text is above cache_threshold.
func (p *KVCacheAware) prefix(cands []candidate, req *llmRequest) (int, int) {
	if req.Runes == 0 {
		return -1, pathPrefixHit
	}
	i := longest(cands, func(*candidate) bool { return true })
	if i < 0 || float64(cands[i].match)/float64(req.Runes) <= p.opts.cacheThreshold {
		return -1, pathPrefixHit
	}
	return i, pathPrefixHit
}

// longest returns the eligible candidate holding the longest prefix, of those tied the one
// where the request's LoRA adapter is warmest (adapterCost), then the least busy, or -1 when
// none holds any.
func longest(cands []candidate, eligible func(*candidate) bool) int {
	var t energy.Ranking
	for i := range cands {
		if c := &cands[i]; c.match > 0 && eligible(c) {
			t.Offer(i, -float64(c.match), adapterCost(c), busyness(c))
		}
	}
	return t.Best()
}

func busyness(c *candidate) float64 {
	return energy.Busyness(int(c.load), c.st.queuedTokens.Load())
}

// placement returns the candidates as the energy placer sees them.
func (p *KVCacheAware) placement(dst []energy.Candidate, cands []candidate) []energy.Candidate {
	for i := range cands {
		dst = append(dst, energy.Candidate{
			Profile:      cands[i].prof,
			InFlight:     int(cands[i].load),
			QueuedTokens: cands[i].st.queuedTokens.Load(),
			CachedTokens: int64(float64(p.state.forest.TenantChars(cands[i].up.Dial)) / p.state.upstreamCharsPerToken(cands[i].up.Dial)),
		})
	}
	return dst
}

// leastBusy returns the least busy candidate, as energy.Idlest ranks them.
func (p *KVCacheAware) leastBusy(cands []candidate) int {
	var buf [16]energy.Candidate
	return energy.Idlest(p.placement(buf[:0], cands))
}

// place runs the configured fallback placement (step 5). A request for a LoRA adapter is
// placed among the candidates where it is warmest (adapterCost): warm, else a free slot.
func (p *KVCacheAware) place(cands []candidate, req *llmRequest) int {
	var tbuf [16]candidate
	tier := bestAdapterTier(tbuf[:0], cands)
	var buf [16]energy.Candidate
	ec := p.placement(buf[:0], tier)
	expected := req.MaxTokens
	if expected <= 0 {
		expected = p.opts.expectedTokens
	}
	i := p.placer.Place(ec, expected)
	if i < 0 {
		i = energy.Idlest(ec)
	}
	return indexOf(cands, tier[i].up.Dial)
}

// commit runs step 6 (the request already counts in c's load: Select tracked it) and returns
// the chosen upstream.
func (p *KVCacheAware) commit(r *http.Request, w http.ResponseWriter, req *llmRequest, c *candidate, treeName string, sess sessionStep, path int) *reverseproxy.Upstream {
	now := time.Now()
	if req.Text != "" {
		p.state.forest.Tree(treeName).Insert(req.Text, c.up.Dial)
	}
	bindKey, boundAt := "", time.Time{}
	switch {
	case sess.source == issued:
		if w != nil && !req.cookieSet {
			p.cookie.set(w, r, sess.id)
			req.cookieSet = true
		}
		p.state.pending.bind(req.Model, sess.key, c.up.Dial, now)
	case sess.id != "" && !sess.keep:
		boundAt = p.state.sessions.bind(req.Model, sess.key, c.up.Dial, now)
		if sess.source == fromCookie {
			p.state.pending.forgetBinding(req.Model, sess.key)
		}
		bindKey = sess.key
	}
	// Peers learn what this replica just learned (pending cookie ids stay local: a client
	// that keeps no cookies must not fill every replica's store).
	p.state.share(req.Model, c.up.Dial, req.Text, bindKey, boundAt)
	a := newAttempt(r, c.st)
	a.model, a.chars, a.matched = req.Model, req.Runes, c.match
	p.recordPrediction(r, req, a, c, treeName)
	req.attempt.Store(a)
	if len(req.tried) == 0 {
		p.state.watchOutcome(r, req)
	}
	req.tried = append(req.tried, c.up.Dial)
	c.st.lastUsed.Store(now.UnixNano())
	if c.lora {
		p.state.adapterSent(c.st, req.Model, true)
	}
	p.count(c, req, path)
	return c.up
}

// treeName returns the tree a request for model uses: the model's own ("" without a model).
// Model names come from clients: before a model new to the forest gets its tree, the least
// recently used trees go so that at most maxTrees remain, and junk names age out instead of
// sending every later model to one shared tree.
func (p *KVCacheAware) treeName(model string) string {
	p.state.makeRoomFor(model)
	return model
}

func indexOf(cands []candidate, addr string) int {
	for i := range cands {
		if cands[i].up.Dial == addr {
			return i
		}
	}
	return -1
}

// count counts a decision in the upstream's counters and the metrics, and logs it.
func (p *KVCacheAware) count(c *candidate, req *llmRequest, path int) {
	matched := 0
	if c != nil {
		matched = c.match
	}
	ratio := 0.0
	if req.Runes > 0 {
		ratio = float64(matched) / float64(req.Runes)
	}
	metrics.decisions[path].Inc()
	addr := ""
	if c != nil {
		addr = c.up.Dial
		c.st.decisions[path].Add(1)
		c.st.learn.sent.sent(req.Model, req.Runes, matched)
		if req.Runes > 0 {
			metrics.matchRatio.Observe(ratio)
		}
		if matched > 0 && (path == pathSession || path == pathPrefixHit || path == pathImbalance) {
			avoided := p.state.tokensOf(req.Model, int64(matched))
			metrics.tokensAvoided.Add(float64(avoided))
			if c.prof != nil {
				metrics.joulesSaved.Add(float64(energy.SavedJoules(c.prof, avoided)))
			}
		}
	}
	if ce := p.logger.Check(zapcore.DebugLevel, "decision"); ce != nil {
		ce.Write(
			zap.String("path", pathNames[path]),
			zap.String("upstream", addr),
			zap.Float64("match_ratio", ratio),
			zap.String("model", req.Model),
			zap.Int("prompt_chars", req.Runes),
			zap.String("format", req.Format.String()),
		)
	}
}
