// Package engine is a model of one LLM inference engine in virtual time, after vLLM's scheduler:
// continuous batching of at most MaxNumSeqs sequences, a per-step token budget with chunked
// prefill, a step time made of a fixed part, a part per prefill token and a part per sequence in
// the batch, and a block-level automatic prefix cache with LRU eviction of unreferenced blocks.
//
// The model is pure: it never reads a clock, starts no goroutine and does no I/O. The caller
// owns time. It submits requests with Submit and calls Advance at the time Advance last asked
// for (the end of the running step), or at once after a Submit to an idle engine; Advance ends
// the step that was running, reports what it produced (first tokens, finished requests) and
// starts the next one. The fleet simulator (examples/fleetsim) drives it on a virtual clock; a
// real-time server can drive it on a timer.
//
// Times are time.Duration since an origin the caller chooses (the start of a simulation).
package engine

import (
	"fmt"
	"time"
)

// Config describes one engine. Zero fields take the defaults below.
type Config struct {
	// MaxNumSeqs is the most sequences in a batch (vLLM's max_num_seqs): a request waits
	// while MaxNumSeqs others run.
	MaxNumSeqs int
	// MaxBatchTokens is the step's token budget (vLLM's max_num_batched_tokens): each running
	// decode takes one token of it, and prefills take what is left, a long prompt in chunks
	// over several steps.
	MaxBatchTokens int
	// BlockTokens is the KV cache block size in tokens.
	BlockTokens int
	// CapacityBlocks is the KV cache size in blocks: running requests' blocks and cached
	// blocks share it. Negative means unlimited.
	CapacityBlocks int
	// MaxLoras is how many distinct LoRA adapters a batch may hold (vLLM's max_loras); a
	// waiting request whose adapter would exceed it is passed over until one leaves.
	// Negative means unlimited.
	MaxLoras int
	// A step lasts StepFixed + PerPrefillToken × prefill tokens in the step + PerSeq ×
	// sequences scheduled in the step. Zero takes the default, negative means none (a real-time
	// engine that simulates no time at all, for tests).
	StepFixed       time.Duration
	PerPrefillToken time.Duration
	PerSeq          time.Duration
	// NoPrefixCache turns the prefix cache off (vLLM's --no-enable-prefix-caching): blocks are
	// still held while a request runs, but no prompt ever hits.
	NoPrefixCache bool
}

// Defaults of Config: an 8B model on one large GPU, roughly (25k prefill tokens/s at a full
// budget, a decode step of about 5 ms for 16 sequences).
const (
	DefaultMaxNumSeqs      = 16
	DefaultMaxBatchTokens  = 2048
	DefaultBlockTokens     = 16
	DefaultCapacityBlocks  = 65536
	DefaultMaxLoras        = 4
	DefaultStepFixed       = 3 * time.Millisecond
	DefaultPerPrefillToken = 40 * time.Microsecond
	DefaultPerSeq          = 150 * time.Microsecond
)

func (c Config) withDefaults() Config {
	if c.MaxNumSeqs <= 0 {
		c.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if c.MaxBatchTokens <= 0 {
		c.MaxBatchTokens = DefaultMaxBatchTokens
	}
	if c.BlockTokens <= 0 {
		c.BlockTokens = DefaultBlockTokens
	}
	if c.CapacityBlocks == 0 {
		c.CapacityBlocks = DefaultCapacityBlocks
	}
	if c.MaxLoras == 0 {
		c.MaxLoras = DefaultMaxLoras
	}
	c.StepFixed = orDefault(c.StepFixed, DefaultStepFixed)
	c.PerPrefillToken = orDefault(c.PerPrefillToken, DefaultPerPrefillToken)
	c.PerSeq = orDefault(c.PerSeq, DefaultPerSeq)
	return c
}

// orDefault maps zero to def and a negative duration to none.
func orDefault(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}

// StepTime is the duration of a step that prefills prefillTokens tokens with seqs sequences in
// the batch.
func (c Config) StepTime(prefillTokens, seqs int) time.Duration {
	return c.StepFixed + time.Duration(prefillTokens)*c.PerPrefillToken + time.Duration(seqs)*c.PerSeq
}

// Request is one request as the engine sees it.
type Request struct {
	ID uint64
	// Tokens is the prompt's length in tokens.
	Tokens int
	// Hashes are the chained hashes of the prompt's full blocks (block i's hash stands for
	// tokens 0 to (i+1)×BlockTokens): two prompts share a block exactly when they share the
	// prefix up to its end. A LoRA adapter is part of the hash, as in vLLM.
	Hashes []uint64
	// Output is the number of tokens to generate (at least 1).
	Output int
	// Adapter is the LoRA adapter, "" for the base model.
	Adapter string
	// Remote: the prompt's KV was computed by another engine and transferred here (a decode
	// engine of prefill/decode disaggregation). Once admitted, the request computes only its
	// prompt's last token (which samples its first output token) and caches the prompt's
	// blocks as if it had computed them. The transfer's time is the caller's, before Submit.
	Remote bool
}

// Event is what a step produced for one request.
type Event struct {
	Req  *Request
	Kind EventKind
	// Cached is the prompt tokens found in the prefix cache when the request was admitted.
	Cached int
	// Admitted is when the request left the waiting queue for the batch.
	Admitted time.Duration
}

// EventKind says what happened to a request.
type EventKind uint8

const (
	// FirstToken: the step finished the prompt's prefill and sampled the first output token.
	FirstToken EventKind = iota + 1
	// Finished: the last output token was generated (a request with one output token has a
	// FirstToken and a Finished event from the same step).
	Finished
	// Aborted: the engine dropped the request (a restart, or a prompt larger than the cache).
	Aborted
)

func (k EventKind) String() string {
	switch k {
	case FirstToken:
		return "first-token"
	case Finished:
		return "finished"
	case Aborted:
		return "aborted"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Reading is what the engine publishes on its metrics endpoint: gauges and counters since it
// started (a restart resets the counters and moves Started).
type Reading struct {
	Running, Waiting int
	// KVUsage is the fraction of the cache's blocks in use by running requests (vLLM's
	// kv_cache_usage_perc); cached but unreferenced blocks are free.
	KVUsage        float64
	CapacityBlocks int
	BlockTokens    int
	// CachedBlocks is the blocks the prefix cache's index holds, in use or not.
	CachedBlocks int
	Started      time.Duration
	// Counters.
	PromptTokens     uint64
	GenerationTokens uint64
	PrefixQueries    uint64 // prompt tokens looked up in the prefix cache
	PrefixHits       uint64 // of which found
	Finished         uint64
	Preempted        uint64
	// TTFTSum and TTFTCount are the time-to-first-token histogram's sum and count (time from
	// Submit to the first token).
	TTFTSum   time.Duration
	TTFTCount uint64
	// PrefillSum is the time requests spent from admission to first token.
	PrefillSum time.Duration
	// DecodeSum is the time requests spent from first token to their last (vLLM's
	// request_decode_time_seconds sum), counted as each finishes.
	DecodeSum time.Duration
	Evictions uint64
}

// seq is a request in the engine.
type seq struct {
	req       *Request
	submitted time.Duration
	admitted  time.Duration
	cached    int // tokens hit at admission
	computed  int // prompt tokens computed (cached ones included)
	generated int
	hashed    int           // leading prompt blocks held in the cache's index
	private   int           // blocks held outside the index (uncomputed, partial, output)
	sched     int           // tokens scheduled in the running step
	first     time.Duration // when its first token came
}

// Engine is one engine's state. It is not safe for concurrent use.
type Engine struct {
	cfg     Config
	waiting []*seq
	running []*seq
	cache   blockCache
	private int // blocks held by running requests outside the cache's index

	stepping bool
	stepEnd  time.Duration
	reading  Reading
	adapters map[string]int // adapter -> running sequences using it
}

// New returns an idle engine started at time now.
func New(cfg Config, now time.Duration) *Engine {
	cfg = cfg.withDefaults()
	e := &Engine{cfg: cfg, adapters: make(map[string]int)}
	e.cache.init()
	e.reading.Started = now
	return e
}

// Config returns the engine's configuration, defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Busy reports whether a step is running; StepEnd says until when.
func (e *Engine) Busy() bool { return e.stepping }

// StepEnd is when the running step ends.
func (e *Engine) StepEnd() time.Duration { return e.stepEnd }

// Submit queues r at time now. When the engine was idle (Busy is false), the caller calls
// Advance(now) to start a step.
func (e *Engine) Submit(r *Request, now time.Duration) {
	r.Output = max(r.Output, 1)
	r.Tokens = max(r.Tokens, 1)
	e.waiting = append(e.waiting, &seq{req: r, submitted: now})
}

// Reading returns the engine's figures at this moment.
func (e *Engine) Reading() Reading {
	r := e.reading
	r.Running = len(e.running)
	r.Waiting = len(e.waiting)
	r.CapacityBlocks = e.cfg.CapacityBlocks
	r.BlockTokens = e.cfg.BlockTokens
	r.Evictions = e.cache.evictions
	r.CachedBlocks = e.cache.size()
	if e.cfg.CapacityBlocks > 0 {
		r.KVUsage = float64(e.cache.referenced+e.private) / float64(e.cfg.CapacityBlocks)
	}
	return r
}

// Lookup returns the prompt tokens of r the cache holds now (its leading cached blocks, never
// the whole prompt: the last token is always computed, as in vLLM). It changes nothing.
func (e *Engine) Lookup(r *Request) int {
	return e.lookupBlocks(r) * e.cfg.BlockTokens
}

func (e *Engine) lookupBlocks(r *Request) int {
	if e.cfg.NoPrefixCache {
		return 0
	}
	limit := min(len(r.Hashes), (r.Tokens-1)/e.cfg.BlockTokens)
	n := 0
	for n < limit && e.cache.has(r.Hashes[n]) {
		n++
	}
	return n
}

// Restart empties the engine at time now, as a process restart does: the cache, the queues
// and the counters. The requests it held are returned as Aborted events.
func (e *Engine) Restart(now time.Duration) []Event {
	var evs []Event
	for _, s := range e.running {
		evs = append(evs, Event{Req: s.req, Kind: Aborted, Cached: s.cached, Admitted: s.admitted})
	}
	for _, s := range e.waiting {
		evs = append(evs, Event{Req: s.req, Kind: Aborted})
	}
	*e = *New(e.cfg, now)
	return evs
}

// blocksFor returns the blocks a request holds once it has generated its whole output.
func (e *Engine) blocksFor(r *Request) int {
	bt := e.cfg.BlockTokens
	return (r.Tokens + r.Output + bt - 1) / bt
}

// Advance ends the step that ends at now, if one is running, and starts the next one if there
// is work. It returns what the ended step produced (and requests dropped for not fitting), and
// whether a new step is running (until StepEnd). The caller calls Advance again at StepEnd, and
// after a Submit to an idle engine.
func (e *Engine) Advance(now time.Duration) (events []Event, busy bool) {
	if e.stepping {
		if now < e.stepEnd {
			return nil, true
		}
		events = e.finishStep(now)
		e.stepping = false
	}
	events = e.schedule(now, events)
	return events, e.stepping
}

// finishStep applies the tokens of the running step.
func (e *Engine) finishStep(now time.Duration) []Event {
	var events []Event
	bt := e.cfg.BlockTokens
	kept := e.running[:0]
	for _, s := range e.running {
		r := s.req
		if s.computed < r.Tokens {
			s.computed += s.sched
			e.reading.PromptTokens += uint64(s.sched)
			// Register the prompt's full blocks computed so far, as vLLM caches each full
			// block once computed. A block another request computed meanwhile is shared.
			full := min(s.computed/bt, len(r.Hashes))
			if e.cfg.NoPrefixCache {
				full = s.hashed
			}
			for s.hashed < full {
				e.cache.add(r.Hashes[s.hashed])
				s.private--
				e.private--
				s.hashed++
			}
			if s.computed >= r.Tokens {
				s.generated = 1
				e.reading.GenerationTokens++
				e.reading.TTFTSum += now - s.submitted
				e.reading.TTFTCount++
				e.reading.PrefillSum += now - s.admitted
				s.first = now
				events = append(events, Event{Req: r, Kind: FirstToken, Cached: s.cached, Admitted: s.admitted})
			}
		} else {
			s.generated++
			e.reading.GenerationTokens++
		}
		s.sched = 0
		if s.generated >= r.Output {
			events = append(events, Event{Req: r, Kind: Finished, Cached: s.cached, Admitted: s.admitted})
			e.release(s)
			e.reading.Finished++
			e.reading.DecodeSum += now - s.first
			continue
		}
		kept = append(kept, s)
	}
	clear(e.running[len(kept):])
	e.running = kept
	return events
}

// release frees a finished request's blocks: cached ones become evictable, tail first, so that
// the tail of a prefix goes before its head (vLLM frees blocks in reverse order).
func (e *Engine) release(s *seq) {
	for i := s.hashed - 1; i >= 0; i-- {
		e.cache.release(s.req.Hashes[i])
	}
	e.private -= s.private
	s.private = 0
	if a := s.req.Adapter; a != "" {
		if e.adapters[a]--; e.adapters[a] <= 0 {
			delete(e.adapters, a)
		}
	}
}

// schedule builds the next step: running requests first (a decode token each, the next chunk
// of a prefill), then waiting ones in arrival order while a sequence slot, the token budget
// and the KV cache allow (vLLM's scheduler, without preemption: a request reserves the blocks
// of its whole prompt and output when admitted, so a running request never runs out).
func (e *Engine) schedule(now time.Duration, events []Event) []Event {
	budget := e.cfg.MaxBatchTokens
	prefill, seqs := 0, 0
	for _, s := range e.running {
		if s.computed < s.req.Tokens {
			s.sched = min(s.req.Tokens-s.computed, budget)
			prefill += s.sched
			budget -= s.sched
		} else if budget > 0 {
			s.sched = 1
			budget--
		}
		if s.sched > 0 {
			seqs++
		}
	}
	for i := 0; i < len(e.waiting) && budget > 0 && len(e.running) < e.cfg.MaxNumSeqs; {
		s := e.waiting[i]
		r := s.req
		if a := r.Adapter; a != "" && e.cfg.MaxLoras > 0 && e.adapters[a] == 0 && len(e.adapters) >= e.cfg.MaxLoras {
			i++ // vLLM skips a request whose adapter cannot be loaded and goes on
			continue
		}
		need := e.blocksFor(r)
		if e.cfg.CapacityBlocks > 0 && need > e.cfg.CapacityBlocks {
			e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
			events = append(events, Event{Req: r, Kind: Aborted})
			continue
		}
		hit := e.lookupBlocks(r)
		// The hit blocks are taken first, so they cannot be evicted to make room for the rest.
		for j := range hit {
			e.cache.acquire(r.Hashes[j])
		}
		priv := need - hit
		if e.cfg.CapacityBlocks > 0 && !e.makeRoom(priv) {
			for j := hit - 1; j >= 0; j-- {
				e.cache.release(r.Hashes[j])
			}
			break // FIFO: the head waits for room, and so do the others
		}
		e.private += priv
		s.private = priv
		s.hashed = hit
		s.cached = hit * e.cfg.BlockTokens
		s.computed = s.cached
		if r.Remote {
			s.computed = max(s.computed, r.Tokens-1)
		}
		s.admitted = now
		e.reading.PrefixQueries += uint64(r.Tokens)
		e.reading.PrefixHits += uint64(s.cached)
		if a := r.Adapter; a != "" {
			e.adapters[a]++
		}
		s.sched = min(r.Tokens-s.computed, budget)
		prefill += s.sched
		budget -= s.sched
		seqs++
		e.running = append(e.running, s)
		e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
	}
	if len(e.running) == 0 {
		return events
	}
	e.stepping = true
	// A sequence the budget left out of this step (behind a long prefill) costs nothing.
	e.stepEnd = now + e.cfg.StepTime(prefill, seqs)
	return events
}

// makeRoom evicts unreferenced cached blocks until n more blocks fit; false when they cannot.
func (e *Engine) makeRoom(n int) bool {
	free := e.cfg.CapacityBlocks - e.cache.size() - e.private
	if free >= n {
		return true
	}
	if free+e.cache.evictable() < n {
		return false
	}
	for free < n {
		e.cache.evictOne()
		free++
	}
	return true
}

// Abort drops r from the engine, as an engine drops a request whose client went away: from the
// waiting queue, or from the batch, its blocks released (those it computed stay cached). The
// running step keeps its end. It reports whether r was in the engine.
func (e *Engine) Abort(r *Request) bool {
	for i, s := range e.waiting {
		if s.req == r {
			e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
			return true
		}
	}
	for i, s := range e.running {
		if s.req == r {
			e.release(s)
			e.running = append(e.running[:i], e.running[i+1:]...)
			return true
		}
	}
	return false
}

// Generated calls f with each running request and the output tokens it has generated so far
// (0 while its prompt is being prefilled), in batch order: what a real-time server streams.
func (e *Engine) Generated(f func(r *Request, tokens int)) {
	for _, s := range e.running {
		f(s.req, s.generated)
	}
}

// Queued returns the requests in the engine: running and waiting.
func (e *Engine) Queued() int { return len(e.running) + len(e.waiting) }
