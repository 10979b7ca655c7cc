package kvroute

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvroute/caddy-kvroute/energy"
	"github.com/kvroute/caddy-kvroute/tree"
)

func init() {
	caddy.RegisterModule(new(KVCacheAware))
}

// Defaults of the policy's options.
const (
	DefaultCacheThreshold      = 0.1
	DefaultBalanceAbsThreshold = 4
	DefaultBalanceRelThreshold = 1.5
	DefaultEvictionInterval    = 120 * time.Second
	DefaultMaxTreeSize         = 64 << 20 // chars
	DefaultSessionHeader       = "X-Session-ID"
	DefaultExpectedTokens      = 256
	DefaultFallback            = "joule"
	DefaultOnImbalance         = "prefix_in_band"
)

// KVCacheAware is the load-balancing policy `kv_cache_aware`. It sends each LLM request to the
// upstream most likely to hold the request's prompt prefix in its KV cache, keeps sessions on
// their upstream, moves to the least busy upstream when load is imbalanced, and places cold
// requests where they cost the fewest joules. See Select for the decision, and DESIGN.md.
type KVCacheAware struct {
	// A request goes to the upstream holding its longest cached prefix when the matched share of
	// its routing text is above this ratio (0 to 1). Default: 0.1 (see the README for the sweep).
	CacheThreshold *float64 `json:"cache_threshold,omitempty"`
	// Load is imbalanced when max-min over the candidates' in-flight requests is above this
	// number AND max > min × balance_rel_threshold; the request then goes to the least busy
	// upstream. Defaults: 4 and 1.5 (see the README for the sweep behind them).
	BalanceAbsThreshold *int     `json:"balance_abs_threshold,omitempty"`
	BalanceRelThreshold *float64 `json:"balance_rel_threshold,omitempty"`
	// What "the least busy upstream" means when load is imbalanced: least_busy (the lowest
	// busyness) or prefix_in_band (the longest cached prefix among the upstreams whose load is
	// within the balance thresholds of the least loaded one). Default: prefix_in_band.
	OnImbalance string `json:"on_imbalance,omitempty"`
	// How often least recently used prefixes are evicted. Default: 120s. 0 in JSON means the
	// default; eviction also runs on insert whenever the trees cross max_tree_size.
	EvictionInterval caddy.Duration `json:"eviction_interval,omitempty"`
	// Chars stored in all prefix trees together (each stored char counted once, whichever
	// upstreams share it). Default: 64Mi chars.
	MaxTreeSize int64 `json:"max_tree_size,omitempty"`
	// Request header that carries a session id. Default: X-Session-ID.
	SessionHeader string `json:"session_header,omitempty"`
	// Cookie-based sessions; off unless set.
	SessionCookie *SessionCookie `json:"session_cookie,omitempty"`
	// A session binding unused for this long is dropped. Default: 30m.
	SessionTTL caddy.Duration `json:"session_ttl,omitempty"`
	// Bindings held at most (least recently used go first). Default: 100000.
	MaxSessions int `json:"max_sessions,omitempty"`
	// Output tokens assumed for energy placement when the request states none. Default: 256.
	ExpectedTokens int `json:"expected_tokens,omitempty"`
	// Placement of cold requests: joule, carbon, least_busy, round_robin or random. Default: joule.
	Fallback string `json:"fallback,omitempty"`
	// Accelerator and energy metadata of upstreams, keyed by dial address (host:port, as in the
	// reverse_proxy's upstream list). Absent fields are unknown.
	Upstreams map[string]energy.Profile `json:"upstreams,omitempty"`

	cacheThreshold float64
	absThreshold   int64
	relThreshold   float64
	inBand         bool
	placer         *energy.Placer
	cookie         *cookieCodec
	profiles       map[string]*energy.Profile
	static         []string // dial addresses of the reverse_proxy's static upstreams
	provisioned    time.Time

	state  *state
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (*KVCacheAware) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.kv_cache_aware",
		New: func() caddy.Module { return new(KVCacheAware) },
	}
}

// Provision applies defaults, joins the process-wide state and registers the metrics.
func (p *KVCacheAware) Provision(ctx caddy.Context) error {
	p.logger = ctx.Logger()
	p.provisioned = time.Now()
	p.cacheThreshold = valueOr(p.CacheThreshold, DefaultCacheThreshold)
	p.absThreshold = int64(valueOr(p.BalanceAbsThreshold, DefaultBalanceAbsThreshold))
	p.relThreshold = valueOr(p.BalanceRelThreshold, DefaultBalanceRelThreshold)
	if p.EvictionInterval == 0 {
		p.EvictionInterval = caddy.Duration(DefaultEvictionInterval)
	}
	if p.MaxTreeSize == 0 {
		p.MaxTreeSize = DefaultMaxTreeSize
	}
	if p.SessionHeader == "" {
		p.SessionHeader = DefaultSessionHeader
	}
	if p.SessionTTL == 0 {
		p.SessionTTL = caddy.Duration(defaultSessionTTL)
	}
	if p.MaxSessions == 0 {
		p.MaxSessions = defaultMaxSessions
	}
	if p.ExpectedTokens == 0 {
		p.ExpectedTokens = DefaultExpectedTokens
	}
	if p.Fallback == "" {
		p.Fallback = DefaultFallback
	}
	if p.OnImbalance == "" {
		p.OnImbalance = DefaultOnImbalance
	}
	if err := p.validate(); err != nil {
		return err
	}
	strategy, _ := energy.ParseStrategy(p.Fallback)
	p.placer = energy.NewPlacer(strategy)
	p.inBand = p.OnImbalance == "prefix_in_band"
	if p.SessionCookie != nil {
		repl := caddy.NewReplacer()
		name := p.SessionCookie.Name
		if name == "" {
			name = defaultCookieName
		}
		p.cookie = &cookieCodec{name: name, secret: []byte(repl.ReplaceKnown(p.SessionCookie.Secret, ""))}
	}
	p.profiles = make(map[string]*energy.Profile, len(p.Upstreams))
	for addr, prof := range p.Upstreams {
		p.profiles[addr] = &prof
	}

	// The reverse_proxy handler that loads this policy is its parent module; its static
	// upstreams tell which tenants leave when a reload removes them.
	for _, m := range ctx.Modules() {
		if h, ok := m.(*reverseproxy.Handler); ok {
			p.static = p.static[:0]
			for _, u := range h.Upstreams {
				p.static = append(p.static, u.Dial)
			}
		}
	}
	if len(p.static) > 0 {
		inPool := make(map[string]bool, len(p.static))
		for _, a := range p.static {
			inPool[a] = true
		}
		for addr := range p.Upstreams {
			if !inPool[addr] {
				p.logger.Info("upstream block names an address not in the static pool; kept for dynamic upstreams",
					zap.String("upstream", addr))
			}
		}
	}

	registerMetrics(ctx.GetMetricsRegistry())
	st, err := acquireState()
	if err != nil {
		return err
	}
	p.state = st
	st.register(p)
	return nil
}

// validate checks the options; errors name the option.
func (p *KVCacheAware) validate() error {
	switch {
	case p.cacheThreshold < 0 || p.cacheThreshold > 1 || math.IsNaN(p.cacheThreshold):
		return fmt.Errorf("cache_threshold: must be between 0 and 1, got %v", p.cacheThreshold)
	case p.absThreshold < 0:
		return fmt.Errorf("balance_abs_threshold: must be >= 0, got %d", p.absThreshold)
	case p.relThreshold < 1 || math.IsNaN(p.relThreshold) || math.IsInf(p.relThreshold, 0):
		return fmt.Errorf("balance_rel_threshold: must be a finite number >= 1, got %v", p.relThreshold)
	case p.EvictionInterval < 0:
		return fmt.Errorf("eviction_interval: must be positive, got %v", time.Duration(p.EvictionInterval))
	case p.MaxTreeSize < 0:
		return fmt.Errorf("max_tree_size: must be positive, got %d", p.MaxTreeSize)
	case p.SessionTTL < 0:
		return fmt.Errorf("session_ttl: must be positive, got %v", time.Duration(p.SessionTTL))
	case p.MaxSessions < 0:
		return fmt.Errorf("max_sessions: must be positive, got %d", p.MaxSessions)
	case p.ExpectedTokens < 0:
		return fmt.Errorf("expected_tokens: must be positive, got %d", p.ExpectedTokens)
	case p.OnImbalance != "least_busy" && p.OnImbalance != "prefix_in_band":
		return fmt.Errorf("on_imbalance: must be least_busy or prefix_in_band, got %q", p.OnImbalance)
	}
	if _, err := energy.ParseStrategy(p.Fallback); err != nil {
		return fmt.Errorf("fallback: %w", err)
	}
	if c := p.SessionCookie; c != nil && c.Name != "" {
		if strings.ContainsAny(c.Name, " \t\r\n;,=\"") {
			return fmt.Errorf("session_cookie: invalid cookie name %q", c.Name)
		}
	}
	for addr, prof := range p.Upstreams {
		if err := prof.Validate(); err != nil {
			return fmt.Errorf("upstream %s: %w", addr, err)
		}
	}
	return nil
}

// Validate is called by Caddy after Provision.
func (p *KVCacheAware) Validate() error { return nil }

// Cleanup lets go of the shared state. Requests of the old config may still be streaming; the
// state lives on while any policy holds it.
func (p *KVCacheAware) Cleanup() error {
	if p.state == nil {
		return nil
	}
	p.state.unregister(p)
	_, err := states.Delete(stateKey)
	return err
}

// candidate is one upstream that may take the request.
type candidate struct {
	up    *reverseproxy.Upstream
	st    *upstreamState
	prof  *energy.Profile
	load  int64 // requests in flight, as this router counts them
	match int   // leading runes of the routing text it holds
}

// Select picks the upstream for r. The decision, in order:
//
//  1. Candidates: available upstreams that serve the request's model; those at max_concurrency
//     are left out unless all are, and on a retry so are those earlier attempts went to, unless
//     all are. None: nil (Caddy retries, then answers 503).
//  2. Session: a session bound to a candidate goes there. A binding to an upstream that left,
//     is unavailable or no longer serves the model is dropped.
//  3. Imbalance: when max-min > balance_abs_threshold and max > min×balance_rel_threshold over
//     the candidates' loads, the least busy candidate.
//  4. Prefix: the candidate holding the longest prefix of the routing text, when the matched
//     share is above cache_threshold (a prefix shorter than one KV block is no match).
//  5. Fallback: the configured placement (joule by default).
//  6. Record: the routing text goes into the model's tree under the chosen upstream, the
//     session is bound, the decision counted, and the session cookie set when configured.
//
// Load is the router's own count of requests in flight (Caddy's NumRequests only moves after
// Select returns, so concurrent decisions would all see the old value).
func (p *KVCacheAware) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	req := attemptFor(r, DefaultMaxBody)
	defer req.placed()
	st := p.state
	now := time.Now()

	// 1. Candidates.
	var buf [16]candidate
	cands := p.candidates(buf[:0], pool, req.Model)
	cands = untried(cands, req.tried)
	if len(cands) == 0 {
		st.untrack(req)
		p.record(nil, req, pathNoCandidate, 0)
		return nil
	}

	m := matchPool.Get().(*tree.Match)
	defer matchPool.Put(m)
	m.Runes, m.Tenants = 0, m.Tenants[:0]
	treeName := p.treeName(req.Model)
	if req.Text != "" {
		if t := st.forest.Get(treeName); t != nil {
			t.Match(req.Text, m)
			for _, tm := range m.Tenants {
				if tm.Runes < minMatchRunes {
					break // longest first: the rest are shorter still
				}
				for i := range cands {
					if cands[i].up.Dial == tm.Tenant && cands[i].match == 0 {
						cands[i].match = tm.Runes
					}
				}
			}
		}
	}

	chosen, path := -1, pathFallback
	keepBinding := false

	// 2. Session.
	sid, newCookie := p.sessionID(r, req)
	if sid != "" {
		if addr, ok := st.sessions.get(sid, now); ok {
			if i := indexOf(cands, addr); i >= 0 {
				chosen, path = i, pathSession
			} else if slices.Contains(req.tried, addr) {
				// An earlier attempt of this request failed there: the session moves to where
				// this attempt goes (its latest turn will be cached there).
			} else if p.saturatedInPool(pool, addr, req.Model) {
				keepBinding = true // skipped for this request only
			} else {
				st.sessions.forget(sid)
			}
		}
	}

	// 3. Imbalance.
	if chosen < 0 && p.imbalanced(cands) {
		path = pathImbalance
		if p.inBand {
			chosen = p.longestInBand(cands)
		} else {
			chosen = leastBusy(cands)
		}
	}

	// 4. Prefix.
	if chosen < 0 && req.Runes > 0 {
		if i := longestMatch(cands); i >= 0 && float64(cands[i].match)/float64(req.Runes) > p.cacheThreshold {
			chosen, path = i, pathPrefixHit
		}
	}

	// 5. Fallback.
	if chosen < 0 {
		chosen, path = p.place(cands, req), pathFallback
	}

	// 6. Record.
	c := &cands[chosen]
	if req.Text != "" {
		st.forest.Tree(treeName).Insert(req.Text, c.up.Dial)
	}
	if sid != "" && !keepBinding {
		st.sessions.bind(sid, c.up.Dial, now)
	}
	if newCookie && w != nil {
		p.cookie.set(w, r, sid)
	}
	st.track(r, req, c.st)
	req.tried = append(req.tried, c.up.Dial)
	c.st.lastUsed.Store(now.UnixNano())
	p.record(c, req, path, c.match)
	return c.up
}

var matchPool = sync.Pool{New: func() any { return new(tree.Match) }}

// minMatchRunes is the shortest shared prefix that counts as a match: one KV block of 16 tokens
// (vLLM's and SGLang's default page size) at 4 chars per token. A shorter one caches nothing on
// the upstream, and the routing text's role markers alone ("user", a separator) would otherwise
// make every short prompt a partial match everywhere.
const minMatchRunes = 64

// candidates appends to dst the upstreams of pool that may take a request for model (step 1).
func (p *KVCacheAware) candidates(dst []candidate, pool reverseproxy.UpstreamPool, model string) []candidate {
	saturated := 0
	for _, up := range pool {
		if up == nil || !up.Available() {
			continue
		}
		prof := p.profiles[up.Dial]
		if model != "" && prof != nil && !prof.Serves(model) {
			continue
		}
		st := p.state.upstream(up.Dial)
		load := max(st.inFlight.Load(), int64(up.NumRequests()))
		dst = append(dst, candidate{up: up, st: st, prof: prof, load: load})
		if prof != nil && prof.MaxConcurrency > 0 && load >= int64(prof.MaxConcurrency) {
			saturated++
		}
	}
	if saturated == 0 || saturated == len(dst) {
		return dst
	}
	kept := dst[:0]
	for _, c := range dst {
		if c.prof == nil || c.prof.MaxConcurrency <= 0 || c.load < int64(c.prof.MaxConcurrency) {
			kept = append(kept, c)
		}
	}
	return kept
}

// untried leaves out the upstreams that earlier attempts of this request went to, unless that
// would leave none: Caddy retries when an attempt fails (a refused connection, lb_retry_match),
// and the prefix, the session and the energy placement would otherwise all point back at the
// upstream that just failed.
func untried(cands []candidate, tried []string) []candidate {
	fresh := 0
	for i := range cands {
		if !slices.Contains(tried, cands[i].up.Dial) {
			fresh++
		}
	}
	if fresh == 0 || fresh == len(cands) {
		return cands
	}
	kept := cands[:0]
	for _, c := range cands {
		if !slices.Contains(tried, c.up.Dial) {
			kept = append(kept, c)
		}
	}
	return kept
}

// saturatedInPool reports whether addr is in the pool, available and serving model, but was
// left out of the candidates for being at max_concurrency: its session binding stays.
func (p *KVCacheAware) saturatedInPool(pool reverseproxy.UpstreamPool, addr, model string) bool {
	for _, up := range pool {
		if up == nil || up.Dial != addr {
			continue
		}
		prof := p.profiles[addr]
		return up.Available() && (model == "" || prof == nil || prof.Serves(model))
	}
	return false
}

// sessionID returns the request's session id: the header, else a valid session cookie, else
// the body's prompt_cache_key. With session_cookie configured and no session id at all, it
// makes a new cookie session (newCookie).
func (p *KVCacheAware) sessionID(r *http.Request, req *llmRequest) (sid string, newCookie bool) {
	if v := r.Header.Get(p.SessionHeader); v != "" {
		return boundKey(v, maxSessionLen), false
	}
	if p.cookie != nil {
		if id, ok := p.cookie.fromRequest(r); ok {
			return id, false
		}
	}
	if req.Session != "" {
		return req.Session, false
	}
	if p.cookie != nil {
		if req.cookieID == "" { // a retry keeps the session (and the cookie) of the first attempt
			req.cookieID, _ = p.cookie.newID()
			return req.cookieID, true
		}
		return req.cookieID, false
	}
	return "", false
}

// imbalanced reports whether the candidates' loads differ by more than both thresholds.
func (p *KVCacheAware) imbalanced(cands []candidate) bool {
	lo, hi := cands[0].load, cands[0].load
	for _, c := range cands[1:] {
		lo, hi = min(lo, c.load), max(hi, c.load)
	}
	return hi-lo > p.absThreshold && float64(hi) > float64(lo)*p.relThreshold
}

// longestInBand returns the candidate with the longest cached prefix among those whose load is
// within the balance thresholds of the least loaded candidate; the least busy candidate when
// none of them holds any prefix.
func (p *KVCacheAware) longestInBand(cands []candidate) int {
	lo := cands[0].load
	for _, c := range cands[1:] {
		lo = min(lo, c.load)
	}
	inBand := func(c *candidate) bool {
		return c.match > 0 && (c.load-lo <= p.absThreshold || float64(c.load) <= float64(lo)*p.relThreshold)
	}
	if i := best(cands, inBand, longerThenIdler); i >= 0 {
		return i
	}
	return leastBusy(cands)
}

// longestMatch returns the candidate holding the longest prefix, the least busy of those tied,
// or -1 when none holds any.
func longestMatch(cands []candidate) int {
	return best(cands, func(c *candidate) bool { return c.match > 0 }, longerThenIdler)
}

// leastBusy returns the candidate with the lowest busyness.
func leastBusy(cands []candidate) int {
	return best(cands, func(*candidate) bool { return true }, idler)
}

// best returns the eligible candidate that rank puts first (rank(a, b) > 0: a is better),
// choosing uniformly at random among those tied, never the first by default; -1 when none is
// eligible.
func best(cands []candidate, eligible func(*candidate) bool, rank func(a, b *candidate) int) int {
	b, ties := -1, 0
	for i := range cands {
		c := &cands[i]
		if !eligible(c) {
			continue
		}
		d := 1
		if b >= 0 {
			d = rank(c, &cands[b])
		}
		switch {
		case d > 0:
			b, ties = i, 1
		case d == 0:
			ties++
			if rand.IntN(ties) == 0 {
				b = i
			}
		}
	}
	return b
}

// longerThenIdler ranks the longer cached prefix first, then the less busy.
func longerThenIdler(a, b *candidate) int {
	if a.match != b.match {
		return cmp.Compare(a.match, b.match)
	}
	return idler(a, b)
}

// idler ranks the less busy first.
func idler(a, b *candidate) int {
	return cmp.Compare(busyness(b), busyness(a))
}

func busyness(c *candidate) float64 {
	return energy.Busyness(int(c.load), c.st.queuedTokens.Load())
}

// place runs the configured fallback placement (step 5).
func (p *KVCacheAware) place(cands []candidate, req *llmRequest) int {
	var buf [16]energy.Candidate
	ec := buf[:0]
	for i := range cands {
		ec = append(ec, energy.Candidate{
			Profile:      cands[i].prof,
			InFlight:     int(cands[i].load),
			QueuedTokens: cands[i].st.queuedTokens.Load(),
			CachedTokens: p.state.forest.TenantChars(cands[i].up.Dial) / 4,
		})
	}
	expected := req.MaxTokens
	if expected <= 0 {
		expected = p.ExpectedTokens
	}
	if i := p.placer.Place(ec, expected); i >= 0 {
		return i
	}
	return leastBusy(cands)
}

// treeName returns the tree a request for model uses: the model's own ("" without a model).
// Model names come from clients: before a model new to the forest gets its tree, the least
// recently used trees go so that at most maxTrees remain, and junk names age out instead of
// sending every later model to one shared tree.
func (p *KVCacheAware) treeName(model string) string {
	if f := p.state.forest; f.Get(model) == nil && f.Len() >= maxTrees {
		f.MakeRoom(maxTrees)
	}
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

// track counts req as in flight on u until the request ends; a retry moves it from the
// previous pick.
func (s *state) track(r *http.Request, req *llmRequest, u *upstreamState) {
	tokens := req.promptTokens()
	u.inFlight.Add(1)
	u.queuedTokens.Add(tokens)
	old := req.pick.Swap(u)
	if old != nil {
		old.inFlight.Add(-1)
		old.queuedTokens.Add(-tokens)
	} else {
		context.AfterFunc(r.Context(), func() { s.untrack(req) })
	}
	if r.Context().Err() != nil {
		s.untrack(req) // the request ended while it was being placed
	}
}

// untrack stops counting req as in flight.
func (s *state) untrack(req *llmRequest) {
	if u := req.pick.Swap(nil); u != nil {
		u.inFlight.Add(-1)
		u.queuedTokens.Add(-req.promptTokens())
	}
}

// record counts a decision in the upstream's counters and the metrics, and logs it.
func (p *KVCacheAware) record(c *candidate, req *llmRequest, path int, matched int) {
	ratio := 0.0
	if req.Runes > 0 {
		ratio = float64(matched) / float64(req.Runes)
	}
	metrics.decisions[path].Inc()
	addr := ""
	if c != nil {
		addr = c.up.Dial
		c.st.decisions[path].Add(1)
		if req.Runes > 0 {
			metrics.matchRatio.Observe(ratio)
		}
		if matched > 0 && (path == pathSession || path == pathPrefixHit || path == pathImbalance) {
			avoided := int64(matched) / 4
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

func valueOr[T any](v *T, def T) T {
	if v == nil {
		return def
	}
	return *v
}

// Interface guards.
var (
	_ reverseproxy.Selector = (*KVCacheAware)(nil)
	_ caddy.Provisioner     = (*KVCacheAware)(nil)
	_ caddy.Validator       = (*KVCacheAware)(nil)
	_ caddy.CleanerUpper    = (*KVCacheAware)(nil)
)
