package kvroute

import (
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvroute/caddy-kvroute/energy"
	"github.com/kvroute/caddy-kvroute/kvroute/decide"
	"github.com/kvroute/caddy-kvroute/tree"
)

// candidate is one upstream that may take the request, as the state knows it; its facts for
// the decision are the decide.Candidate of the same index.
type candidate struct {
	up    *reverseproxy.Upstream
	st    *upstreamState
	prof  *energy.Profile
	load  int64          // requests in flight, as this router counts them (load.go)
	match int            // leading runes of the routing text it holds
	cost  costPrediction // what the decision predicted (after decide)
	// peersPrefill is the queued prefill tokens its peers last published there.
	peersPrefill int64
	// adapter is the request's LoRA adapter there in loads (decide.AdapterWarm...); lora: the
	// request names a LoRA adapter (fleet.go).
	adapter float64
	lora    bool
}

// Select picks the upstream for r in three steps (docs/design.md "The decision"):
//
//   - gather: one snapshot of the request and of each candidate (available upstreams that
//     serve the request's model), read from the shared state: load, match in the model's
//     tree, queued prefill, what the engines reported and taught, session binding;
//   - decide: kvroute/decide, pure functions over the snapshot, runs steps 1 (leaving out the
//     upstreams down, saturated or tried by an earlier attempt) to 5: the session, the
//     imbalance, the prefix and the fallback (decision thresholds), or one ranking by
//     predicted time to first token (decision cost);
//   - record: the choice counts in the loads, the routing text goes into the model's tree
//     under the chosen upstream, the session is bound, the decision counted and explained.
//
// Decisions of this router run one at a time from reading the loads to counting the choice
// (state.deciding), so each sees every decision made before it (load.go: the bound). Only
// what the decisions change is read under it (the loads, queued tokens and prefill), and the
// session step; the tree match and the facts no decision changes are read before, the
// recording after.
func (p *KVCacheAware) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	up := p.selectUpstream(pool, r, w)
	if p.reg != nil && p.reg.retired.Load() {
		p.state.afterRetired(p.reg)
	}
	if up != nil {
		// A vLLM P/D split prefills only once its decode engine is chosen (disaggregate.go).
		runDeferredPrefill(r)
	}
	return up
}

// selectUpstream is Select's decision: gather, decide, record.
func (p *KVCacheAware) selectUpstream(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	p.state.ready(p.reg)
	req := attemptFor(r, DefaultMaxBody)
	defer req.placed()
	if req.shed.Load() {
		return nil // answered 429 (queue.go): a retry of it does not queue again
	}
	p.state.noteRetry(r, req)
	// The tree match, the slow part, and every fact no decision changes are read before the
	// decisions' lock: what the engines reported and taught, what the trees hold, the prompt's
	// tokens (prepare). Under it, only what the decisions themselves change (gather).
	treeName := p.treeName(req.Model)
	held := p.matchText(treeName, req.Text)
	defer func() { held.release() }()
	g := gatheredPool.Get().(*gathered)
	defer g.release()
	p.prepare(g, pool, req, held)
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
	defer unlock() // a panic while deciding must not hold up every later decision

	ok := p.gather(g, pool, r, req)
	if ok && p.admit(g, pool, r, req) {
		// Every candidate is full: wait for a slot (queue.go), then decide on the state of
		// that moment.
		unlock()
		if !p.await(pool, r, w, req) {
			if req.shed.Load() {
				return nil
			}
			return leftUpstream(pool)
		}
		if req.slot != nil {
			// The slot it was handed is given back once its decision counts it (below), or
			// when this returns: a panic on the way must not keep it reserved for good.
			wq := p.state.wq
			defer func() {
				if req.slot != nil {
					wq.unreserve(req.slot)
					req.slot = nil
				}
			}()
		}
		// A reload while it waited: the live config decides it, over its pool (the slot
		// it was handed may be on an upstream the reload added).
		p, pool = liveFor(p, pool)
		held.release()
		held = p.matchText(treeName, req.Text)
		*g = gathered{}
		p.prepare(g, pool, req, held)
		if hook := testHookRedecide.Load(); hook != nil {
			(*hook)()
		}
		p.state.deciding.Lock()
		locked = true
		if req.slot != nil {
			p.state.wq.unreserve(req.slot)
			req.slot = nil
		}
		ok = p.gather(g, pool, r, req)
		ok = ok && !p.admit(g, pool, r, req)
	}
	if !ok {
		unlock()
		req.untrack()
		p.count(nil, req, pathNoCandidate)
		return nil
	}
	res := decide.Decide(&p.core, &g.snap)
	c := p.recordChoice(g, r, req, res)
	p.charge(r, req, g, res.Chosen)
	unlock()
	p.traceDecision(r, req, g, res)
	p.explain(w, req, c, int(res.Path))
	return p.commit(r, w, req, c, treeName, g.sess, int(res.Path))
}

// saturatedAt reports whether load reaches prof's max_concurrency (decide.Candidate.Saturated).
func saturatedAt(prof *energy.Profile, load int64) bool {
	c := decide.Candidate{Profile: prof, Load: load}
	return c.Saturated()
}

// testHookDecide, when set (tests only), is called by every decision after the tree match and
// before the choice: tests hold decisions there to make them run at once.
var testHookDecide atomic.Pointer[func()]

// testHookRedecide, when set (tests only), is called by the decision of a request that was
// handed a slot, before the decisions' lock.
var testHookRedecide atomic.Pointer[func()]

// gathered is one decision's snapshot: the candidates as the state knows them and the same
// candidates as the decision sees them, index for index, and the session step's lookup.
type gathered struct {
	cands    []candidate
	snap     decide.Snapshot
	estimate int64 // the prompt's tokens
	sess     sessionStep
	// The candidates' storage, reused from decision to decision (gatheredPool): a decision
	// allocates none for up to 16 candidates.
	ubuf [16]candidate
	dbuf [16]decide.Candidate
}

var gatheredPool = sync.Pool{New: func() any { return new(gathered) }}

// release hands g back to gatheredPool, holding no upstream, profile or session.
func (g *gathered) release() {
	*g = gathered{}
	gatheredPool.Put(g)
}

// prepare reads, before the decisions' lock, what of the snapshot no decision of this router
// changes: the candidates (available upstreams serving the request's model, step 1 before the
// decision's leaving out) with whether each is down or tried, what the trees hold of the
// prompt, what each engine reported and taught, the peers' queued prefill; and the request's
// facts. What a decision changes (the loads, the queued tokens and prefill: recordChoice counts
// the choice in them) is read under the lock, by gather.
func (p *KVCacheAware) prepare(g *gathered, pool reverseproxy.UpstreamPool, req *llmRequest, held heldMatch) {
	g.cands = p.candidates(g.ubuf[:0], pool, req.Model, time.Now().UnixNano())
	held.assign(g.cands)
	dc := g.dbuf[:0]
	for i := range g.cands {
		c := &g.cands[i]
		dc = append(dc, decide.Candidate{
			Key: i, Profile: c.prof, Adapter: c.adapter,
			Down:  c.st.health.down.Load(),
			Tried: slices.Contains(req.tried, c.up.Dial),
		})
		p.facts(&dc[i], c)
	}
	g.snap.Candidates = dc
	g.estimate = p.state.tokensOf(req.Model, int64(req.Runes))
	g.snap.Request = decide.Request{
		PromptChars:   req.Runes,
		PromptTokens:  g.estimate,
		CharsPerToken: p.state.charsPerToken(req.Model),
		MaxTokens:     req.MaxTokens,
	}
}

// gather completes the snapshot under the decisions' lock (state.deciding) with what the
// decisions change: each candidate's load (so that each decision sees every decision made
// before it: load.go, the bound), then step 1's leaving out, then the kept candidates' queued
// tokens and prefill (recordChoice counts the choice in both); then the session step's lookup
// and a Responses follow-up, on the kept candidates. False when no upstream of pool may take
// the request.
func (p *KVCacheAware) gather(g *gathered, pool reverseproxy.UpstreamPool, r *http.Request, req *llmRequest) bool {
	now := time.Now().UnixNano()
	dc := g.snap.Candidates
	for i := range g.cands {
		c := &g.cands[i]
		c.load = p.state.load(c.st, now)
		dc[i].Load = c.load
	}
	// Step 1's leaving out is the decision's; the state's candidates follow it.
	dc = decide.Filter(dc)
	for i := range dc {
		g.cands[i] = g.cands[dc[i].Key]
		dc[i].Key = i
	}
	g.cands = g.cands[:len(dc)]
	g.snap.Candidates = dc
	if len(dc) == 0 {
		return false
	}
	for i := range g.cands {
		st := g.cands[i].st
		dc[i].QueuedTokens = st.queuedTokens.Load()
		st.expirePrefill(now)
		dc[i].Prefill = max(0, st.prefillTokens.Load()) + g.cands[i].peersPrefill
	}
	g.snap.Now = now
	g.snap.Request.Adapter = g.cands[0].lora
	g.sess = p.session(r, req, pool, g.cands, dc)
	if i := p.followUp(req, g.cands); i >= 0 {
		dc[i].StoredResponse = true
	}
	return true
}

// facts fills what of d, the decision's view of candidate c, no decision of this router
// changes: its match, what the trees hold under it, what its engine reported and taught; and
// c's peers' queued prefill there.
func (p *KVCacheAware) facts(d *decide.Candidate, c *candidate) {
	d.Match = c.match
	d.HeldChars = p.state.forest.TenantChars(c.up.Dial)
	d.HeldCharsPerToken = p.state.upstreamCharsPerToken(c.up.Dial)
	c.peersPrefill = p.state.peersPrefill(c.up.Dial)
	engineFacts(d, c.st)
}

// engineFacts fills what u's engine reported and taught: its waiting queue and how long its
// reading stands, its speeds, slots and mean output.
func engineFacts(d *decide.Candidate, u *upstreamState) {
	if e := u.engine.Load(); e != nil {
		d.Waiting, d.ReadingUntil = e.waiting, e.until
		if e.waiting > 0 {
			d.MeanUncached = u.meanUncachedTokens()
		}
	}
	d.AnswerSpeed = math.Float64frombits(u.learn.answerSpeed.Load())
	if f := u.learn.figures.Load(); f != nil {
		if f.PrefillLearned {
			d.PrefillSpeed = f.PrefillTokensPerSecond
		}
		if f.DecodeLearned {
			d.DecodeSpeed = f.DecodeTokensPerSecond
		}
		d.Slots, d.MeanOutput = f.Slots, f.MeanOutputTokens
	}
}

// recordChoice counts the choice of res in the loads (before the next decision reads them:
// state.deciding is held) and returns the chosen candidate.
func (p *KVCacheAware) recordChoice(g *gathered, r *http.Request, req *llmRequest, res decide.Result) *candidate {
	dc := g.snap.Candidates
	for i := range g.cands {
		g.cands[i].cost = predictionOf(&dc[i].Cost)
	}
	if res.Session == decide.SessionSkipped {
		p.skipSession(&g.sess, req)
	}
	c := &g.cands[res.Chosen]
	uncached := c.cost.uncached
	if req.leg == legDecode {
		// Its prompt arrives as KV blocks from the prefill engine (llm_disaggregate): it
		// queues no prefill there.
		uncached = 0
	}
	req.track(r, c.st, g.estimate, uncached, int64(c.cost.ttft*1e9))
	if p.opts.decision == decisionCost {
		p.state.recent.record(req.Model, g.cands, res.Chosen, int(res.Path))
	}
	req.bestMatch = bestMatch(g.cands) // what the choice gave up for balance (feedback.go)
	return c
}

// candidates appends to dst the upstreams of pool that may take a request for model: those
// available that serve it (step 1 before the decision's leaving out), seen at now. Their loads
// are read under the decisions' lock (gather).
func (p *KVCacheAware) candidates(dst []candidate, pool reverseproxy.UpstreamPool, model string, now int64) []candidate {
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
		dst = append(dst, candidate{up: up, st: st, prof: prof})
	}
	// The engines' model lists (fleet.go) leave out those that do not serve the model.
	return p.state.served(dst, model)
}

var matchPool = sync.Pool{New: func() any { return new(tree.Match) }}

// minMatchRunes is the shortest shared prefix that counts as a match: one KV block of 16 tokens
// (vLLM's and SGLang's default page size) at 4 chars per token. A shorter one caches nothing on
// the upstream, and the routing text's role markers alone ("user", a separator) would otherwise
// make every short prompt a partial match everywhere.
const minMatchRunes = decide.MinMatchRunes

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

// sessionStep is what the session step found.
type sessionStep struct {
	id     string // "" when the request has no session
	key    string // what the stores bind it under (state.sessionKey: a digest with a cluster)
	source sessionSource
	keep   bool // the binding stays as it is (its upstream was skipped for this request)
	store  *sessionStore
	addr   string // the upstream it is bound to ("": none)
}

// sessionSource tells where a session id came from.
type sessionSource uint8

const (
	fromHeader sessionSource = iota
	fromCookie
	fromBody
	issued // a new cookie id made for this request: bound in the pending space
)

// session looks the request's session up (step 2's gathering): a binding to a candidate is
// marked on it for the decision (decide settles it: skipSession); one to an upstream that is
// not a candidate is kept or dropped here.
func (p *KVCacheAware) session(r *http.Request, req *llmRequest, pool reverseproxy.UpstreamPool, cands []candidate, dc []decide.Candidate) sessionStep {
	var s sessionStep
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
	s.store, s.addr = store, addr
	switch i := indexOf(cands, addr); {
	case slices.Contains(req.tried, addr):
		// An earlier attempt of this request went there and failed (Caddy retries only a failed
		// attempt: no response, or one lb_retry_match rejects): the session moves to where this
		// attempt goes (its latest turn will be cached there), and on with each retry.
	case i >= 0:
		// The decision keeps it there, skips it for this request (out of band, beyond the TTFT
		// bound: skipSession), or, with decision cost, lets the binding follow the request to
		// another candidate in the band that holds a KV block more of the prompt (a turn went
		// there: going back would prefill the turns held there again; docs/benchmarks.md
		// "Issue 23").
		dc[i].Session = true
	case p.state.listedElsewhere(addr, req.Model, cands):
		// Its engine's model list leaves it out (fleet.go): it does not serve the model.
		store.forgetBinding(req.Model, s.key)
	case p.keepsBinding(pool, addr, req.Model):
		// Skipped for this request only: saturated, down with others up, or another site's
		// upstream.
		p.skipSession(&s, req)
	default:
		store.forgetBinding(req.Model, s.key)
	}
	return s
}

// skipSession keeps the session's binding as it is while this request goes elsewhere.
func (p *KVCacheAware) skipSession(s *sessionStep, req *llmRequest) {
	if s.source == fromCookie && s.store == p.state.pending {
		// The client presented its cookie back: the binding it earned leaves pending as it
		// is, not rebound to where this one request goes.
		p.state.sessions.bind(req.Model, s.key, s.addr, time.Now())
		s.store.forgetBinding(req.Model, s.key)
	}
	s.keep = s.source != issued
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
	if v := r.Header.Get(p.opts.sessionKey); v != "" {
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
	first := len(req.tried) == 0
	a := &req.firstAttempt
	if !first {
		a = new(attempt)
	}
	a = newAttempt(r, c.st, a)
	a.model, a.chars, a.matched = req.Model, req.Runes, c.match
	p.recordPrediction(r, req, a, c, treeName)
	req.attempt.Store(a)
	if first {
		p.state.watchEnd(r, req)
	}
	if req.tried == nil {
		req.tried = req.triedBuf[:0]
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
	// A decision's line is traceDecision's; only a request no upstream could take gets this.
	if c != nil {
		return
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
