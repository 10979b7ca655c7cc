package kvroute

import (
	"sync"
	"time"
)

// Prefill work in flight, per upstream, in tokens: the uncached prompt tokens of the requests
// sent there that have not produced a first token. decision cost (cost.go) reads it as the
// queue a new request waits behind.
//
// A request stops counting at its first token (prefillDone, called by llm_feedback at the
// first content delta), when it ends (untrack), or when a retry moves it (track). Without
// llm_feedback no first token is ever reported: a request then counts as prefilled once the
// time the decision predicted for its first token has passed (its deadline). An upstream for
// which llm_feedback has reported a first token is trusted to report every one of a streamed
// request: those count until their first token or their end, however late. A request whose
// first token no answer can show (a non-streamed one: its answer comes after its whole decode)
// counts until its deadline wherever it went, or until its answer's headers come (llm_feedback:
// a non-streamed answer's headers come after its prefill), whichever is first.

// prefillShare is one request's share of its pick's queued prefill. It is allocated apart from
// the request: a queue entry that outlives its request (dropped at a later decision) then pins
// these few bytes, not the request's held body (up to max_body).
type prefillShare struct {
	mu       sync.Mutex
	on       *upstreamState // nil: counted nowhere
	tokens   int64
	deadline int64  // unix nanoseconds: the decision plus its predicted time to first token
	gen      uint32 // bumped on every attempt: a queue entry of an earlier attempt is stale
	// unseen: the attempt's first token will not be reported (a non-streamed request): it
	// counts until its deadline at most, on any upstream.
	unseen bool
}

// startPrefill counts the request's uncached tokens on u (moving them from an earlier
// attempt's pick), until ttft nanoseconds from now at the latest when u gets no feedback or
// the attempt's first token is unseen.
func (lr *llmRequest) startPrefill(u *upstreamState, uncached, ttft int64, unseen bool) {
	now := time.Now().UnixNano()
	p := lr.prefill.Load()
	if p == nil {
		// Select is the only writer, one attempt at a time: no other store can race this one.
		p = new(prefillShare)
		lr.prefill.Store(p)
	}
	p.mu.Lock()
	if p.on != nil {
		p.on.prefillTokens.Add(-p.tokens)
	}
	p.gen++
	p.on, p.tokens, p.deadline, p.unseen = u, max(0, uncached), now+max(0, ttft), unseen
	u.prefillTokens.Add(p.tokens)
	gen, deadline := p.gen, p.deadline
	p.mu.Unlock()
	u.prefillQ.push(pendingPrefill{share: p, gen: gen, deadline: deadline})
}

// endPrefill takes the request's uncached tokens out of its pick's queued prefill, once per
// attempt. fromFeedback: llm_feedback saw its first token (the upstream then reports them).
func (lr *llmRequest) endPrefill(fromFeedback bool) {
	p := lr.prefill.Load()
	if p == nil {
		return // never counted
	}
	p.mu.Lock()
	u := p.on
	if u != nil {
		u.prefillTokens.Add(-p.tokens)
		p.on = nil
	}
	p.mu.Unlock()
	if u != nil && fromFeedback && !u.firstTokens.Load() {
		u.firstTokens.Store(true)
	}
}

// expireIf ends the attempt gen's prefill when it is still counted on u and either past its
// deadline (expire, or its first token unseen) or not counted any more; it reports whether the
// queue entry can go.
func (p *prefillShare) expireIf(u *upstreamState, gen uint32, now int64, expire bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.on != u || p.gen != gen {
		return true // done, moved, or a later attempt's entry follows
	}
	if !(expire || p.unseen) || now < p.deadline {
		return false
	}
	u.prefillTokens.Add(-p.tokens)
	p.on = nil
	return true
}

// pendingPrefill is a queue entry: a request's attempt counted on the queue's upstream.
type pendingPrefill struct {
	share    *prefillShare
	gen      uint32
	deadline int64
}

// prefillQueue holds an upstream's counted requests in decision order, for the deadline
// estimate. Engines prefill in arrival order and a deadline is the decision time plus the
// queue ahead, so deadlines mostly grow along the queue: expiring from the front is enough.
type prefillQueue struct {
	mu   sync.Mutex
	q    []pendingPrefill
	head int
}

// maxCompactEvery bounds the entries a queue keeps beyond what it must: past it, a pass
// drops every finished entry (a request that ended behind one still prefilling).
const maxCompactEvery = 64

func (q *prefillQueue) push(e pendingPrefill) {
	q.mu.Lock()
	q.q = append(q.q, e)
	q.mu.Unlock()
}

// expirePrefill drops u's queue entries that are done and ends the prefill of the requests
// past their deadline: all of them without feedback, else those whose first token is unseen. It runs on the decision's path for every
// candidate: amortised, a few entries a call.
func (u *upstreamState) expirePrefill(now int64) {
	q := &u.prefillQ
	expire := !u.firstTokens.Load()
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.head < len(q.q) {
		e := q.q[q.head]
		if !e.share.expireIf(u, e.gen, now, expire) {
			break
		}
		q.q[q.head] = pendingPrefill{}
		q.head++
	}
	if q.head == len(q.q) {
		q.q, q.head = q.q[:0], 0
		return
	}
	if n := len(q.q) - q.head; n > maxCompactEvery && n > 2*int(u.inFlight.Load())+maxCompactEvery {
		kept := q.q[:0]
		for _, e := range q.q[q.head:] {
			if !e.share.expireIf(u, e.gen, now, expire) {
				kept = append(kept, e)
			}
		}
		clear(q.q[len(kept):])
		q.q, q.head = kept, 0
	}
}
