package kvroute

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"sync/atomic"
	"unicode/utf8"

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

	// pick is the upstream this request is counted against while in flight; a retry moves it.
	pick atomic.Pointer[upstreamState]

	// attempt is the upstream of the latest attempt, for the request's outcome (health.go).
	attempt atomic.Pointer[upstreamState]

	// tried lists the dial addresses earlier attempts of this request went to. Select runs
	// again for every retry, one attempt at a time, so only Select touches it.
	tried []string

	// cookieID is the session id of a cookie this request is about to set (session_cookie,
	// no session yet): retries reuse it. cookieSet: the first attempt set it.
	cookieID  string
	cookieSet bool
}

// requestFor returns the request's extracted LLM request, reading at most maxBody bytes of the
// body the first time (the body is restored byte for byte). It caches the result in the
// request's vars, so the matcher and every Select of every retry share one extraction.
func requestFor(r *http.Request, maxBody int64) *llmRequest {
	if v, ok := caddyhttp.GetVar(r.Context(), varRequest).(*llmRequest); ok && v != nil {
		return v
	}
	lr := new(llmRequest)
	if r.Body != nil && r.Body != http.NoBody {
		prefix, truncated, err := llmreq.ReadBody(r, maxBody)
		lr.err = err
		if len(prefix) > 0 {
			lr.Request = llmreq.Parse(prefix, truncated || err != nil)
		}
	}
	lr.Model = boundKey(lr.Model, maxModelLen)
	lr.Session = boundKey(lr.Session, maxSessionLen)
	if hasVars(r) {
		caddyhttp.SetVar(r.Context(), varRequest, lr)
		setPlaceholders(r, lr)
	}
	return lr
}

// hasVars reports whether the request carries Caddy's vars map (requests made outside a Caddy
// server, as in unit tests, do not).
func hasVars(r *http.Request) bool {
	_, ok := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	return ok
}

func setPlaceholders(r *http.Request, lr *llmRequest) {
	ctx := r.Context()
	caddyhttp.SetVar(ctx, "llm.model", lr.Model)
	caddyhttp.SetVar(ctx, "llm.session", lr.Session)
	caddyhttp.SetVar(ctx, "llm.prompt_chars", strconv.Itoa(lr.Runes))
	caddyhttp.SetVar(ctx, "llm.max_tokens", strconv.Itoa(lr.MaxTokens))
	caddyhttp.SetVar(ctx, "llm.stream", strconv.FormatBool(lr.Stream))
	caddyhttp.SetVar(ctx, "llm.format", lr.Format.String())
}

// boundKey returns s, or a digest of it when s is longer than max bytes or is not valid UTF-8.
func boundKey(s string, max int) string {
	if len(s) <= max && utf8.ValidString(s) {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// promptTokens estimates the prompt's tokens: chars / 4.
func (lr *llmRequest) promptTokens() int64 {
	return int64(lr.Runes+3) / 4
}

// track counts the request as in flight on u until the request ends; a retry moves it from the
// previous pick.
func (lr *llmRequest) track(r *http.Request, u *upstreamState) {
	tokens := lr.promptTokens()
	u.inFlight.Add(1)
	u.queuedTokens.Add(tokens)
	if old := lr.pick.Swap(u); old != nil {
		old.inFlight.Add(-1)
		old.queuedTokens.Add(-tokens)
	} else {
		context.AfterFunc(r.Context(), lr.untrack)
	}
	if r.Context().Err() != nil {
		lr.untrack() // the request ended while it was being placed
	}
}

// untrack stops counting the request as in flight.
func (lr *llmRequest) untrack() {
	if u := lr.pick.Swap(nil); u != nil {
		u.inFlight.Add(-1)
		u.queuedTokens.Add(-lr.promptTokens())
	}
}
