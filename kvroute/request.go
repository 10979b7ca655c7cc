package kvroute

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
)

// Bounds on client-controlled keys: a model or session id longer than this is replaced by a
// digest, so the memory a client can pin per key is fixed.
const (
	maxModelLen   = 256
	maxSessionLen = 128
)

// varRequest is the http.vars key under which the extracted request is cached for the rest of
// the request's life (matcher, policy, retries).
const varRequest = "kvroute.request"

// llmRequest is what kvroute knows about one HTTP request. It is created once per request (by
// the matcher or by the first Select) and lives in the request's vars.
type llmRequest struct {
	llmreq.Request
	err error // reading the body failed; the request routes without text

	// body is what was read of the request body (nil when it was not read), maxBody how
	// much: every attempt gets the body from it, and a retry re-derives the routing text.
	body    *llmreq.Body
	maxBody int64
	// heldBody is body's storage when requestFor read it (allocated with the request).
	heldBody llmreq.Body

	// pick is the upstream this request is counted against while in flight; a retry moves it.
	pick atomic.Pointer[upstreamState]
	// tokens is the prompt's estimated tokens, set when it is first placed.
	tokens atomic.Int64
	// prefill is its share of its pick's queued prefill (prefill.go).
	prefill atomic.Pointer[prefillShare]

	// attempt is the latest attempt, for its outcome (health.go).
	attempt atomic.Pointer[attempt]
	// leg is the leg the next attempt runs (feedback.go): llm_disaggregate sets it around the
	// legs it runs. bestMatch is the longest prefix any candidate of the latest decision held.
	leg       legKind
	bestMatch int
	// split is a vLLM P/D split's prefill leg, run once the decode pool placed the request
	// (llm_disaggregate: disaggregate.go).
	split *deferredPrefill

	// tried lists the dial addresses earlier attempts of this request went to. Select runs
	// again for every retry, one attempt at a time, so only Select touches it.
	tried    []string
	triedBuf [2]string // tried's storage for the first attempts

	// cookieID is the session id of a cookie this request is about to set (session_cookie,
	// no session yet): retries reuse it. cookieSet: the first attempt set it.
	cookieID  string
	cookieSet bool

	// firstAttempt is the storage of the first attempt (the request's attempts live as long
	// as it does): a retry's attempt is allocated apart.
	firstAttempt attempt
	// judgeBy and repl judge the last attempt when the request ends (watchEnd), under Caddy.
	judgeBy *state
	repl    *caddy.Replacer
	// The router-side queue (queue.go): queued tells whether it waited and how it left, slot
	// the slot it was handed (given back when it is decided), waited how long it waited; shed:
	// it was answered 429 (a retry of it is never queued again).
	queued uint8
	slot   *waiter
	waited time.Duration
	shed   atomic.Bool
	// fair is its charge in its tenant's tokens served (flow_control, queue.go). A prefill leg
	// (llm_disaggregate) is charged in legOf, the client's request it runs for, whose context
	// is legEnd: a request split in two is charged once.
	fair   fairCharge
	legOf  *llmRequest
	legEnd context.Context
}

// requestFor returns the request's extracted LLM request, reading at most maxBody bytes of the
// body the first time (the body is restored byte for byte). It caches the result in the
// request's vars, so the matcher and every Select of every retry share one extraction.
func requestFor(r *http.Request, maxBody int64) *llmRequest {
	// The vars map is looked up once (each lookup walks the request's chain of contexts);
	// its values are set as caddyhttp.SetVar sets them, none nil.
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	if v, ok := vars[varRequest].(*llmRequest); ok && v != nil {
		return v
	}
	lr := &llmRequest{maxBody: maxBody}
	if llmreq.Routable(r) {
		prefix, truncated, err := llmreq.ReadBodyInto(r, maxBody, &lr.heldBody)
		lr.body = llmreq.Held(r)
		lr.err = err
		if len(prefix) > 0 {
			lr.Request = extract(r, prefix, truncated || err != nil, maxBody)
		}
	}
	lr.Model = boundKey(lr.Model, maxModelLen)
	lr.Session = boundKey(lr.Session, maxSessionLen)
	if vars != nil {
		vars[varRequest] = lr
		setPlaceholders(vars, lr)
	}
	return lr
}

// attemptFor is requestFor for one attempt of the reverse proxy: Select runs once per attempt,
// with the request that attempt sends. When the plugin holds the whole body, the attempt gets
// a fresh reader of all of it, whatever earlier attempts read; when it does not, an attempt
// after one that sent bytes fails as Caddy's own unbuffered bodies do (llmreq.Body.Attempt).
// It also re-derives the routing text that the previous attempt let go of (placed).
func attemptFor(r *http.Request, maxBody int64) *llmRequest {
	lr := requestFor(r, maxBody)
	if lr.body == nil {
		return lr
	}
	lr.body.Attempt(r)
	if lr.Text == "" && lr.Runes > 0 {
		// A body longer than what is held drops its bytes once they are sent on: the retry
		// then routes without text (and its body fails anyway).
		if prefix, truncated := lr.body.Prefix(lr.maxBody); len(prefix) > 0 {
			lr.Text = extract(r, prefix, truncated || lr.err != nil, lr.maxBody).Text
		}
	}
	return lr
}

// placed lets go of the routing text once an attempt is placed: it can be several times
// max_body, and the request may stream for minutes. What the decision keeps (Runes, Model,
// Session) is small; a retry re-derives the text from the held body.
func (lr *llmRequest) placed() {
	if lr.body != nil {
		lr.Text = ""
	}
}

// extract parses the first bytes of the request's body as the API its path and headers name,
// decoding a gzip or deflate body first (at most maxBody decoded bytes; the body forwarded is
// the one the client sent). An encoding it cannot decode leaves the request without routing
// text.
func extract(r *http.Request, prefix []byte, truncated bool, maxBody int64) llmreq.Request {
	body, truncated, err := llmreq.Decode(prefix, truncated, r.Header.Get("Content-Encoding"), maxBody)
	if err != nil {
		return llmreq.Request{}
	}
	return llmreq.ParseAs(body, truncated, llmreq.Hint(r))
}

// hasVars reports whether the request carries Caddy's vars map (requests made outside a Caddy
// server, as in unit tests, do not).
func hasVars(r *http.Request) bool {
	_, ok := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	return ok
}

func setPlaceholders(vars map[string]any, lr *llmRequest) {
	vars["llm.model"] = lr.Model
	vars["llm.session"] = lr.Session
	vars["llm.prompt_chars"] = intVar(lr.Runes)
	vars["llm.max_tokens"] = intVar(lr.MaxTokens)
	vars["llm.stream"] = boolVars[b2i(lr.Stream)]
	vars["llm.format"] = formatVar(lr.Format)
}

// The placeholders' common values, made into interface values once: a var set per request
// would otherwise allocate each.
var (
	boolVars  = [2]any{"false", "true"}
	smallInts = func() (v [1024]any) {
		for i := range v {
			v[i] = strconv.Itoa(i)
		}
		return v
	}()
	formatVars = func() (v [256]any) {
		for i := range v {
			v[i] = llmreq.Format(i).String()
		}
		return v
	}()
)

// intVar is n as a placeholder value: its decimal string.
func intVar(n int) any {
	if n >= 0 && n < len(smallInts) {
		return smallInts[n]
	}
	return strconv.Itoa(n)
}

func formatVar(f llmreq.Format) any { return formatVars[f] }

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// boundKey returns s, or a digest of it when s is longer than max bytes or is not valid UTF-8.
func boundKey(s string, max int) string {
	if len(s) <= max && utf8.ValidString(s) {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// promptTokens is the prompt's tokens as estimated when the request was first placed (the
// model's chars per token then): untrack takes back what track added, whatever was learned
// meanwhile.
func (lr *llmRequest) promptTokens() int64 {
	return lr.tokens.Load()
}

// track counts the request as in flight on u until the request ends (watchEnd: the first
// attempt's commit registers the end); a retry moves it from the previous pick. uncached is the prompt's tokens the decision predicted u must prefill, ttft
// (nanoseconds) how long it predicted that takes: the request counts in u's queued prefill
// until its first token (prefillDone) or, when no answer will show its first token (without
// llm_feedback, or a non-streamed request), until ttft has passed.
func (lr *llmRequest) track(r *http.Request, u *upstreamState, estimate, uncached, ttft int64) {
	if lr.pick.Load() == nil && lr.tokens.Load() == 0 {
		lr.tokens.Store(estimate)
	}
	tokens := lr.promptTokens()
	u.inFlight.Add(1)
	u.queuedTokens.Add(tokens)
	lr.startPrefill(u, uncached, ttft, !lr.firstTokenSeen())
	partial := lr.partialText()
	if partial {
		u.learn.sent.partialIn(1)
	}
	if old := lr.pick.Swap(u); old != nil {
		old.inFlight.Add(-1)
		old.queuedTokens.Add(-tokens)
		if partial {
			old.learn.sent.partialIn(-1)
		}
	}
	loadChanged()
	if r.Context().Err() != nil {
		lr.untrack() // the request ended while it was being placed
	}
}

// firstTokenSeen reports whether an answer can show the attempt's first token to llm_feedback:
// a streamed one (its first content event), or a prefill leg's (llm_disaggregate asks for one
// token: its answer comes at its prefill's end). Whether llm_feedback reads the answer at all
// is the upstream's firstTokens.
func (lr *llmRequest) firstTokenSeen() bool {
	return lr.Stream || lr.leg == legPrefill
}

// partialText reports whether the routing text may be only part of the prompt: the body was
// cut at max_body (or its reading failed). Its engine counts all the prompt's tokens: no chars
// per token is learned while it runs (learnFrom).
func (lr *llmRequest) partialText() bool {
	return lr.Truncated || lr.err != nil
}

// watchEnd registers, at the request's first decision, what its end does: stop counting it in
// flight (untrack) and, under Caddy, judge its last attempt (judgeEnd, unless a retry's Select
// did). One context.AfterFunc per request does both: each costs its allocations and a
// goroutine when the request ends.
func (s *state) watchEnd(r *http.Request, lr *llmRequest) {
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		lr.judgeBy, lr.repl = s, repl // not served by Caddy (unit tests): nothing to judge
	}
	context.AfterFunc(r.Context(), lr.ended)
}

// ended is what the request's end does (watchEnd).
func (lr *llmRequest) ended() {
	lr.settleUnanswered()
	lr.untrack()
	if lr.judgeBy != nil {
		lr.judgeBy.judgeEnd(lr.repl, lr)
	}
}

// untrack stops counting the request as in flight.
func (lr *llmRequest) untrack() {
	lr.endPrefill(false)
	if u := lr.pick.Swap(nil); u != nil {
		u.inFlight.Add(-1)
		u.queuedTokens.Add(-lr.promptTokens())
		if lr.partialText() {
			u.learn.sent.partialIn(-1)
		}
		loadChanged()
		capacityFreed()
	}
}

// prefillDone tells that the request's current attempt produced its first token (llm_feedback
// calls it at the first content delta): its uncached tokens leave its pick's queued prefill.
// Calling it again, or after the request ended, does nothing.
func (lr *llmRequest) prefillDone() {
	lr.endPrefill(true)
}
