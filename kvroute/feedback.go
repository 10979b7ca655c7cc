package kvroute

import (
	"io"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
)

func init() {
	caddy.RegisterModule(new(Feedback))
	httpcaddyfile.RegisterHandlerDirective("llm_feedback", parseFeedback)
	// The handlers that see answers run before reverse_proxy, in this order: llm_feedback
	// wraps the response first, so that it sees the answer of whatever runs inside it.
	// llm_disaggregate comes after llm_feedback (which then sees the decode leg's answer, the
	// one the client gets), before reverse_proxy (the decode pool). An order may only name a
	// standard directive: both go right before reverse_proxy, here, one after the other.
	httpcaddyfile.RegisterDirectiveOrder("llm_feedback", httpcaddyfile.Before, "reverse_proxy")
	httpcaddyfile.RegisterDirectiveOrder("llm_disaggregate", httpcaddyfile.Before, "reverse_proxy")
}

// Feedback is the handler `llm_feedback`: it reads each answer of a request that a
// kv_cache_aware policy routed as the answer passes to the client, and credits what the answer
// reports (prompt and cached tokens, the time to its first content) to the attempt the policy
// chose: per upstream, predicted against reported cached tokens; the learned prefill speed; a
// tree that stops claiming what an engine reported it no longer holds; the engine that stored a
// Responses answer. It never delays, buffers or changes a byte, and a request without a
// kv_cache_aware decision passes through.
//
//	llm_feedback [<matcher>]
type Feedback struct {
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (*Feedback) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.llm_feedback",
		New: func() caddy.Module { return new(Feedback) },
	}
}

// Provision sets the handler up.
func (f *Feedback) Provision(ctx caddy.Context) error {
	f.logger = ctx.Logger()
	registerMetrics(ctx.GetMetricsRegistry())
	return nil
}

// UnmarshalCaddyfile reads `llm_feedback [<matcher>]`; it takes no options.
func (f *Feedback) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Errf("llm_feedback takes no options, got %q", d.Val())
	}
	return nil
}

func parseFeedback(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	f := new(Feedback)
	err := f.UnmarshalCaddyfile(h.Dispenser)
	return f, err
}

// varFeedback marks, in the request's vars, a request whose answers llm_feedback reads: its
// decisions then record what they predicted (predict).
const varFeedback = "kvroute.feedback"

// ServeHTTP wraps the response of the handlers after it.
func (f *Feedback) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !hasVars(r) {
		return next.ServeHTTP(w, r)
	}
	if _, outer := caddyhttp.GetVar(r.Context(), varFeedback).(*feedbackWriter); outer {
		return next.ServeHTTP(w, r) // an llm_feedback around this one reads the answer already
	}
	fw := &feedbackWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, r: r}
	caddyhttp.SetVar(r.Context(), varFeedback, fw)
	defer fw.finish()
	err := next.ServeHTTP(fw, r)
	if err != nil {
		if lr, ok := caddyhttp.GetVar(r.Context(), varRequest).(*llmRequest); ok && lr != nil && lr.shed.Load() {
			// The policy answered 429 (the queue shed it: queue.go); Caddy's "no upstreams
			// available" behind it is no error to log or answer.
			return nil
		}
	}
	return err
}

// feedbackWriter passes every byte on as it comes and shows a copy to the observer. Flush,
// Hijack and the rest reach the writer underneath through Unwrap (http.ResponseController).
type feedbackWriter struct {
	caddyhttp.ResponseWriterWrapper
	r *http.Request

	started bool
	lr      *llmRequest
	a       *attempt // the attempt that answered
	obs     answerObserver
	firstAt time.Time // when the first content passed; zero until then
	// firstByte: the answer's first byte is its first token (a prefill leg's JSON answer: it
	// decodes one token).
	firstByte bool
}

func (w *feedbackWriter) WriteHeader(code int) {
	if !w.started && code >= 200 {
		w.start(code)
	}
	w.ResponseWriterWrapper.WriteHeader(code)
}

func (w *feedbackWriter) Write(p []byte) (int, error) {
	if !w.started {
		w.start(http.StatusOK)
	}
	if w.obs.kind == answerIgnored {
		return w.ResponseWriterWrapper.Write(p)
	}
	var at time.Time
	if w.firstAt.IsZero() {
		at = time.Now() // the bytes arrived now; writing them may wait on the client
	}
	n, err := w.ResponseWriterWrapper.Write(p)
	w.observe(p[:n], at)
	return n, err
}

// ReadFrom keeps the writer underneath's ReadFrom, observing what it reads.
func (w *feedbackWriter) ReadFrom(r io.Reader) (int64, error) {
	if !w.started {
		w.start(http.StatusOK)
	}
	if w.obs.kind == answerIgnored {
		return w.ResponseWriterWrapper.ReadFrom(r)
	}
	return w.ResponseWriterWrapper.ReadFrom(observedReader{r, w})
}

type observedReader struct {
	r io.Reader
	w *feedbackWriter
}

func (o observedReader) Read(p []byte) (int, error) {
	n, err := o.r.Read(p)
	var at time.Time
	if o.w.firstAt.IsZero() {
		at = time.Now()
	}
	o.w.observe(p[:n], at)
	return n, err
}

func (w *feedbackWriter) observe(p []byte, at time.Time) {
	if (w.obs.write(p) || w.firstByte && len(p) > 0) && w.firstAt.IsZero() {
		w.firstAt = at
		w.firstContent()
	}
}

// start decides, when the response's headers go out, whether and how the answer is read: only
// a successful answer to an attempt a kv_cache_aware decision made, in JSON or as events, not
// content-encoded.
func (w *feedbackWriter) start(code int) {
	w.started = true
	lr, _ := caddyhttp.GetVar(w.r.Context(), varRequest).(*llmRequest)
	if lr == nil {
		return
	}
	a := lr.attempt.Load()
	if a == nil || !a.pred.watched {
		return
	}
	w.lr, w.a = lr, a
	fb := &a.u.feedback
	h := w.ResponseWriterWrapper.Header()
	kind := answerIgnored
	switch ct := mediaType(h.Get("Content-Type")); {
	case code < 200 || code > 299:
		fb.notRead[notReadStatus].Add(1)
	case h.Get("Content-Encoding") != "" && h.Get("Content-Encoding") != "identity":
		fb.notRead[notReadEncoded].Add(1)
	case strings.EqualFold(ct, "text/event-stream"):
		kind = answerSSE
	case strings.EqualFold(ct, "application/x-ndjson"):
		kind = answerNDJSON
	case strings.EqualFold(ct, "application/json") || ct == "":
		kind = answerJSON
	default:
		fb.notRead[notReadType].Add(1)
	}
	if kind != answerIgnored {
		w.obs.begin(kind, lr.Format == llmreq.Responses)
	}
	switch {
	case kind == answerSSE || kind == answerNDJSON:
		// Its first content event (or line) is its first token (firstContent).
	case kind == answerJSON && a.pred.leg == legPrefill:
		w.firstByte = true
	default:
		// A non-streamed answer (or an error) marks no first token: its first byte comes after
		// its whole decode, and an answer's time to it is no time to first token. Its prefill
		// is over now at the latest.
		a.pred.settle(a.u)
		lr.endPrefill(false)
	}
}

// mediaType is a Content-Type without its parameters (mime.ParseMediaType allocates a map per
// answer).
func mediaType(ct string) string {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.TrimSpace(ct)
}

// firstContent: the attempt's first token passed (a streamed answer's first content event, a
// prefill leg's first byte). The request's uncached prefill work is done.
func (w *feedbackWriter) firstContent() {
	w.a.pred.settle(w.a.u)
	w.lr.prefillDone()
}

// finish credits the answer once the handlers after llm_feedback are done with it.
func (w *feedbackWriter) finish() {
	if w.a == nil {
		// No answer was read; the latest attempt (it got none, or it failed) stops counting as
		// one waiting for its first token.
		if lr, _ := caddyhttp.GetVar(w.r.Context(), varRequest).(*llmRequest); lr != nil {
			if a := lr.attempt.Load(); a != nil {
				a.pred.settle(a.u)
			}
		}
		return
	}
	w.a.pred.settle(w.a.u)
	if w.obs.kind == answerIgnored {
		return
	}
	u := w.obs.finish()
	if w.r.Context().Err() != nil && !u.ok {
		w.a.u.feedback.notRead[notReadCut].Add(1)
		return
	}
	w.a.pred.s.credit(w.r, w.lr, w.a, u, w.obs.gaveUps, w.firstAt)
}

// legKind tells which leg of a request an attempt is. A request runs as one leg, or, split by
// llm_disaggregate (issue 25), as a prefill leg on one engine and a decode leg on another: each
// leg is its own attempt, credited to its own engine, and a decode leg (its prompt came as KV
// blocks, not by prefill) never teaches prefill speed nor corrects the tree.
type legKind uint8

const (
	legWhole legKind = iota
	legPrefill
	legDecode
)

// prediction is what a decision predicted for its attempt, recorded when it commits.
type prediction struct {
	s       *state
	start   time.Time
	leg     legKind
	tree    string
	matched int     // runes of the routing text the chosen upstream held when the decision matched: before it inserted the prompt
	best    int     // the most any candidate held
	runes   int     // of the routing text
	cpt     float64 // the model's chars per token then
	whole   bool    // the routing text is the whole prompt (not cut at max_body)
	// ahead is how many earlier attempts on the same upstream were still waiting for their first
	// token when this one was decided: one of them may have put the prefix this one matched in
	// the tree without its engine having computed it yet.
	ahead   int64
	watched bool // llm_feedback reads the request's answers
	settled atomic.Bool
}

// settle takes the attempt out of the upstream's count of attempts waiting for their first
// token, once.
func (p *prediction) settle(u *upstreamState) {
	if p.watched && p.settled.CompareAndSwap(false, true) {
		u.feedback.awaiting.Add(-1)
	}
}

// recordPrediction records on a, the attempt just committed to c, what the decision predicted. Only a
// request llm_feedback watches is recorded; a retry's new attempt settles the one before it.
func (p *KVCacheAware) recordPrediction(r *http.Request, req *llmRequest, a *attempt, c *candidate, treeName string) {
	if _, ok := caddyhttp.GetVar(r.Context(), varFeedback).(*feedbackWriter); !ok {
		return
	}
	if old := req.attempt.Load(); old != nil {
		old.pred.settle(old.u)
	}
	fb := &c.st.feedback
	pr := &a.pred
	pr.s, pr.start, pr.leg, pr.tree = p.state, time.Now(), req.leg, treeName
	pr.matched, pr.best, pr.runes, pr.cpt = c.match, max(req.bestMatch, c.match), req.Runes, p.state.charsPerToken(req.Model)
	pr.watched, pr.whole = true, !req.partialText()
	pr.ahead = fb.awaiting.Add(1) - 1
	if given := a.pred.best - a.pred.matched; given > 0 {
		fb.givenUp.add(float64(given) / a.pred.cpt)
	}
}

// bestMatch is the longest prefix any candidate holds.
func bestMatch(cands []candidate) int {
	m := 0
	for i := range cands {
		m = max(m, cands[i].match)
	}
	return m
}

// Why an answer was not read.
const (
	notReadStatus  = iota // not a 2xx
	notReadEncoded        // content-encoded by the engine
	notReadType           // neither JSON nor events
	notReadCut            // the client went away before any usage came
	numNotRead
)

var notReadNames = [numNotRead]string{"status", "encoded", "content_type", "cut"}

// feedbackState is what an upstream's answers taught, for the metrics and GET /kvroute/.
type feedbackState struct {
	awaiting atomic.Int64 // attempts decided and not yet at their first token (watched only)

	answers    atomic.Uint64 // answers read
	withUsage  atomic.Uint64 // of which a usage object was read
	withCached atomic.Uint64 // of which it reported cached tokens
	lies       atomic.Uint64 // usage objects that cannot be true (ignored)
	gaveUp     atomic.Uint64 // documents given up (malformed, over the bound, cut mid-event)
	notRead    [numNotRead]atomic.Uint64

	predicted, reported atomicFloat // cached tokens, over the answers that reported them
	givenUp             atomicFloat // tokens of prefix given up for balance, at decision time

	// Misses: answers with fewer cached tokens than predicted, by more than a KV block. Each is
	// counted once it was acted on: corrected (the tree trimmed), or unconfirmed (left alone: an
	// earlier attempt on the upstream was still in prefill).
	corrected, unconfirmed atomic.Uint64
	// credited counts the answers whose crediting is over: tests wait for it.
	credited atomic.Uint64
	trimmed  atomic.Int64 // chars the tree stopped claiming for it
	// share scales the upstream's tree bound (float64 bits; 0 means 1): misses shrink it
	// toward what its engine holds, hits let it grow back.
	share   atomic.Uint64
	applied atomic.Uint64 // the share the bound in force was computed with (bits; 0 means 1)
	// respIDs counts the Responses ids bound to it.
	respIDs atomic.Uint64
}

// misses is how many answers reported fewer cached tokens than the tree predicted.
func (f *feedbackState) misses() uint64 { return f.corrected.Load() + f.unconfirmed.Load() }

func (f *feedbackState) appliedShare() float64 {
	if b := f.applied.Load(); b != 0 {
		return math.Float64frombits(b)
	}
	return 1
}

// shareOf is the share of its tree bound the upstream keeps (1 until its answers say less).
func (s *state) shareOf(addr string) float64 {
	if v, ok := s.upstreams.Load(addr); ok {
		return v.(*upstreamState).feedback.shareNow()
	}
	return 1
}

// applyShares puts the upstream's new share in force: the bounds are stored at once, and the
// eviction they call for runs in the background (never on a request).
func (s *state) applyShares(u *upstreamState, share float64) {
	u.feedback.applied.Store(math.Float64bits(share))
	s.mu.Lock()
	s.forest.StoreLimits(s.limitsLocked(s.options.maxTreeSize))
	s.mu.Unlock()
	s.resyncLater()
}

// Tree correction.
const (
	// kvBlockTokens is a KV block (vLLM's and SGLang's default page): a miss smaller than one
	// is rounding, not a stale tree.
	kvBlockTokens = 16
	// trimBudget bounds the tree nodes one answer may change.
	trimBudget = 64
	// A miss multiplies the upstream's share by shrinkFactor, down to minShare; a hit by
	// growFactor, up to 1.
	shrinkFactor, growFactor, minShare = 0.9, 1.02, 0.25
)

func (f *feedbackState) shareNow() float64 {
	if b := f.share.Load(); b != 0 {
		return math.Float64frombits(b)
	}
	return 1
}

// credit takes in what one answer reported.
func (s *state) credit(r *http.Request, lr *llmRequest, a *attempt, u usage, gaveUps int, firstAt time.Time) {
	fb := &a.u.feedback
	defer fb.credited.Add(1)
	p := &a.pred
	fb.answers.Add(1)
	fb.gaveUp.Add(uint64(gaveUps))
	if u.lies {
		fb.lies.Add(1)
	}
	if u.respID != "" && p.leg != legPrefill {
		s.bindResponse(u.respID, a.u.addr)
		fb.respIDs.Add(1)
	}
	if !u.ok {
		return
	}
	s.settleTokens(lr, u)
	fb.withUsage.Add(1)
	if p.leg != legDecode {
		s.learnAnswer(a.u, coldPrefill(p, u, firstAt.Sub(p.start), !firstAt.IsZero()), firstAt.Sub(p.start), !firstAt.IsZero())
	}
	if !u.cachedKnown {
		return
	}
	fb.withCached.Add(1)
	// The answer counts this prompt's tokens: its own chars per token turns the runes the tree
	// matched into the engine's tokens, where the model's average (or the default 4) can be off
	// by a fifth on one prompt, hundreds of tokens on a long prefix. Not when the routing text
	// is only part of the prompt: its runes over all the prompt's tokens would be too few.
	cpt := p.cpt
	if u.prompt >= 1 && p.runes > 0 && p.whole {
		cpt = min(maxCharsPerToken, max(minCharsPerToken, float64(p.runes)/u.prompt))
	}
	predicted := float64(p.matched) / cpt
	fb.predicted.add(predicted)
	fb.reported.add(u.cached)
	if p.leg == legDecode || p.matched < minMatchRunes {
		return
	}
	// Engines cache whole blocks: what the tree matched counts down to its last whole block.
	if math.Floor(predicted/kvBlockTokens)*kvBlockTokens-u.cached <= kvBlockTokens {
		s.reshare(a.u, growFactor)
		return
	}
	if p.ahead > 0 {
		fb.unconfirmed.Add(1)
		return
	}
	defer fb.corrected.Add(1)
	// The engine computed everything beyond what it had cached: the tree stops claiming, for
	// this upstream, the other prompts that hung off the part it lost.
	if text := lr.routingText(r); text != "" {
		keep := int(u.cached * cpt)
		if t := s.forest.Get(p.tree); t != nil {
			n := t.Trim(text, a.u.addr, keep, trimBudget)
			fb.trimmed.Add(n)
		}
	}
	s.reshare(a.u, shrinkFactor)
}

// reshare scales the upstream's share of the trees by factor, within [minShare, 1], and puts
// the bound in force when it moved by more than limitsChange.
func (s *state) reshare(u *upstreamState, factor float64) {
	fb := &u.feedback
	for {
		old := fb.share.Load()
		cur := fb.shareNow()
		next := min(1, max(minShare, cur*factor))
		if next == cur {
			return
		}
		if fb.share.CompareAndSwap(old, math.Float64bits(next)) {
			if math.Abs(next-fb.appliedShare()) > limitsChange {
				s.applyShares(u, next)
			}
			return
		}
	}
}

// routingText re-derives the request's routing text from the held body (the decision let go of
// it: placed); "" when the body was not held whole.
func (lr *llmRequest) routingText(r *http.Request) string {
	if lr.body == nil {
		return ""
	}
	prefix, truncated := lr.body.Prefix(lr.maxBody)
	if len(prefix) == 0 {
		return ""
	}
	return extract(r, prefix, truncated || lr.err != nil, lr.maxBody).Text
}
