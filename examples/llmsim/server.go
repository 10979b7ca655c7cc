package llmsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// Headers set on every response of a worker.
const (
	HeaderWorker       = "X-Kvsim-Worker"
	HeaderCachedTokens = "X-Kvsim-Cached-Tokens"
	HeaderPromptTokens = "X-Kvsim-Prompt-Tokens"
)

// Server is one simulated worker. It is an http.Handler; create it with New.
type Server struct {
	cfg     Config
	cache   *BlockCache
	slots   *slots // batch slots
	prefill *slots // the compute prefills share
	mux     *http.ServeMux
	seq     atomic.Uint64
	m       counters
	// advertise is the host:port a prefill worker names in its transfer parameters.
	advertise string
}

// New returns a worker simulating cfg (zero fields take the defaults).
func New(cfg Config) *Server {
	cfg = cfg.withDefaults()
	s := &Server{
		cfg:     cfg,
		cache:   NewBlockCache(cfg.CapacityBlocks),
		slots:   newSlots(cfg.Slots),
		prefill: newSlots(cfg.PrefillSlots),
		mux:     http.NewServeMux(),
	}
	s.m.startNanos.Store(time.Now().UnixNano())
	s.mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		s.serveGenerate(w, r, true)
	})
	s.mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		s.serveGenerate(w, r, false)
	})
	s.mux.HandleFunc("POST /v1/responses", s.serveResponses)
	s.mux.HandleFunc("GET /v1/models", s.serveModels)
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {})
	s.mux.HandleFunc("GET /metrics", s.serveMetrics)
	s.mux.HandleFunc("POST /reset", func(w http.ResponseWriter, r *http.Request) {
		s.Reset()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	return s
}

// Config returns the worker's config, defaults filled in.
func (s *Server) Config() Config { return s.cfg }

// ServeHTTP serves the OpenAI-compatible API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(HeaderWorker, s.cfg.Name)
	s.mux.ServeHTTP(w, r)
}

// Reset empties the prefix cache and zeroes the counters. Running requests go on.
func (s *Server) Reset() {
	s.cache.Reset()
	s.m.reset()
}

// Restart is Reset as an engine process restarted would show it: an empty cache, counters back
// to zero and a new process_start_time_seconds. Running requests go on (a real restart would
// cut them; the demo's restart scenario is about the cache and the counters).
func (s *Server) Restart() {
	s.Reset()
	s.m.startNanos.Store(time.Now().UnixNano())
}

// Stats is a snapshot of a worker's counters.
type Stats struct {
	Requests         uint64 // requests served to the end
	PromptTokens     uint64
	CachedTokens     uint64
	GenerationTokens uint64
	Running, Waiting int
	CacheBlocks      int
	Evictions        uint64
}

// Stats returns the worker's counters since it started or was reset.
func (s *Server) Stats() Stats {
	running, waiting := s.slots.counts()
	return Stats{
		Requests:         s.m.requests.Load(),
		PromptTokens:     s.m.promptTokens.Load(),
		CachedTokens:     s.m.cachedTokens.Load(),
		GenerationTokens: s.m.generationTokens.Load(),
		Running:          running,
		Waiting:          waiting,
		CacheBlocks:      s.cache.Len(),
		Evictions:        s.cache.Evictions(),
	}
}

func (s *Server) serveModels(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id":       s.cfg.Model,
			"object":   "model",
			"created":  time.Now().Unix(),
			"owned_by": "llmsim",
		}},
	})
}

// serveGenerate runs one chat (chat == true) or completions request through the simulation.
func (s *Server) serveGenerate(w http.ResponseWriter, r *http.Request, chat bool) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	j, err := parseJob(body, chat, s.cfg.DefaultMaxTokens)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.run(w, r, j)
}

// serveResponses runs one OpenAI Responses request through the simulation. The simulator keeps
// no responses: previous_response_id is not followed, so only the input sent is prefilled.
func (s *Server) serveResponses(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	j, err := parseResponsesJob(body, s.cfg.DefaultMaxTokens)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.run(w, r, j)
}

// readBody reads a request body of at most MaxBodyBytes, answering the error when it cannot.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, err.Error())
			return nil, false
		}
		writeError(w, http.StatusBadRequest, "reading body: "+err.Error())
		return nil, false
	}
	return body, true
}

// run takes a parsed request through queue, prefix cache lookup, prefill, cache insert, decode.
func (s *Server) run(w http.ResponseWriter, r *http.Request, j job) {
	if j.model != "" && j.model != s.cfg.Model {
		writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", j.model))
		return
	}
	p := NewPrompt(j.text, s.cfg.BlockTokens)
	arrived := time.Now()

	ctx := r.Context()
	if err := s.slots.acquire(ctx); err != nil {
		return // the client is gone
	}
	defer s.slots.release()
	kvBlocks := int64((p.Tokens + j.maxTokens + s.cfg.BlockTokens - 1) / s.cfg.BlockTokens)
	s.m.runningBlocks.Add(kvBlocks)
	defer s.m.runningBlocks.Add(-kvBlocks)

	clock := newSleeper()
	defer clock.stop()
	var cached int
	var ok bool
	if s.cfg.Protocol == ProtocolSGLang && s.cfg.Role != RoleAggregated {
		if err := s.checkSGLang(j); err != nil {
			s.cfg.Transfers.Refused.Add(1)
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		key := j.boot.key()
		if s.cfg.Role == RolePrefill {
			// The prefill leg: announce the room, compute the prompt, hand the KV over, then
			// answer the first token (the router discards it).
			e, err := s.cfg.Transfers.announce(key)
			if err != nil {
				s.cfg.Transfers.Refused.Add(1)
				writeError(w, http.StatusBadRequest, err.Error())
				return
			}
			if cached, ok = s.runPrefill(ctx, p, clock); !ok {
				s.cfg.Transfers.abandon(key, e)
				return
			}
			if err := s.cfg.Transfers.handOver(ctx, key, e, s.cfg.BootstrapTimeout); err != nil {
				if ctx.Err() == nil {
					s.cfg.Transfers.Refused.Add(1)
					writeError(w, http.StatusInternalServerError, err.Error())
				}
				return
			}
			s.cfg.Transfers.Served.Add(1)
			s.cfg.Transfers.Prefills.Add(1)
			j.maxTokens = 1
		} else {
			e, err := s.cfg.Transfers.claim(ctx, key, s.cfg.BootstrapTimeout)
			if err != nil {
				if ctx.Err() == nil {
					s.cfg.Transfers.Refused.Add(1)
					writeError(w, http.StatusBadRequest, err.Error())
				}
				return
			}
			if cached, ok = s.runTransfer(ctx, p, clock); !ok {
				s.cfg.Transfers.abandon(key, e)
				return
			}
			s.cfg.Transfers.took(key, e)
			s.cfg.Transfers.Taken.Add(1)
		}
	}
	switch {
	case s.cfg.Protocol == ProtocolSGLang && s.cfg.Role != RoleAggregated:
		// Prefilled or transferred above.
	case s.cfg.Role == RoleDecode && j.kv != nil && j.kv.DoRemotePrefill:
		if err := s.takeTransfer(j.kv); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		cached, ok = s.runTransfer(ctx, p, clock)
	case s.cfg.Role == RoleDecode && j.kv != nil:
		writeError(w, http.StatusBadRequest, "a decode worker takes do_remote_prefill transfers or whole requests")
		return
	default:
		cached, ok = s.runPrefill(ctx, p, clock)
	}
	if !ok {
		return
	}
	if s.cfg.Role == RolePrefill && j.kv != nil && j.kv.DoRemoteDecode {
		// The prefill leg: one token and the handover, at once.
		s.m.ttft.observe(time.Since(arrived))
		s.cfg.Transfers.Prefills.Add(1)
		finish := "length"
		resp := response{ID: s.responseID(j), Created: time.Now().Unix(), Model: s.cfg.Model,
			Usage:            &Usage{PromptTokens: p.Tokens, CompletionTokens: 1, TotalTokens: p.Tokens + 1, PromptTokensDetails: PromptTokensDetails{CachedTokens: cached}},
			KVTransferParams: s.prefillAnswer(p.Tokens)}
		c := choice{FinishReason: &finish}
		text := "x"
		if j.chat {
			resp.Object, c.Message = "chat.completion", &chatMessage{Role: "assistant", Content: text}
		} else {
			resp.Object, c.Text = "text_completion", &text
		}
		resp.Choices = []choice{c}
		writeJSON(w, http.StatusOK, resp)
		s.m.requests.Add(1)
		return
	}
	s.m.ttft.observe(time.Since(arrived))

	usage := Usage{
		PromptTokens:        p.Tokens,
		CompletionTokens:    j.maxTokens,
		TotalTokens:         p.Tokens + j.maxTokens,
		PromptTokensDetails: PromptTokensDetails{CachedTokens: cached},
	}
	h := w.Header()
	h.Set(HeaderCachedTokens, strconv.Itoa(cached))
	h.Set(HeaderPromptTokens, strconv.Itoa(p.Tokens))
	g := generation{
		job:   j,
		id:    s.responseID(j),
		reply: replyText(uint64(p.Tokens)^uint64(len(j.text))<<32, j.maxTokens),
		usage: usage,
		clock: clock,
	}
	switch {
	case j.responses && j.stream:
		ok = s.streamResponses(ctx, w, g)
	case j.responses:
		ok = s.respondResponses(ctx, w, g)
	case j.stream:
		ok = s.stream(ctx, w, g)
	default:
		ok = s.respond(ctx, w, g)
	}
	if ok {
		s.m.requests.Add(1)
		s.m.generationTokens.Add(uint64(j.maxTokens))
		s.m.decodeTime.observe(s.cfg.scaled(time.Duration(max(0, j.maxTokens-1)) * s.cfg.DecodePerToken))
	}
}

// runPrefill waits for the prefill compute, looks the prompt up in the cache (when the
// prefill starts, as vLLM's scheduler does: a request that waited behind another with the same
// prefix hits what that one just computed), sleeps for the uncached tokens and inserts the
// prompt's blocks. It returns the cached tokens, and false when the client went away.
func (s *Server) runPrefill(ctx context.Context, p Prompt, clock *sleeper) (int, bool) {
	if err := s.prefill.acquire(ctx); err != nil {
		return 0, false
	}
	defer s.prefill.release()
	cached := s.cache.Lookup(p)
	s.m.promptTokens.Add(uint64(p.Tokens))
	s.m.cachedTokens.Add(uint64(cached))
	d := s.cfg.scaled(time.Duration(p.Tokens-cached) * s.cfg.PrefillPerToken)
	if !clock.sleep(ctx, d) {
		return cached, false
	}
	s.m.prefillTime.observe(d)
	s.cache.Insert(p)
	return cached, true
}

// runTransfer is a decode worker's prefill for a request a prefill worker computed: the KV of
// the prompt's tokens it does not hold arrives at TransferPerToken each, without the prefill
// compute. It returns the tokens it held, and false when the client went away.
func (s *Server) runTransfer(ctx context.Context, p Prompt, clock *sleeper) (int, bool) {
	cached := s.cache.Lookup(p)
	s.m.promptTokens.Add(uint64(p.Tokens))
	s.m.cachedTokens.Add(uint64(cached))
	if !clock.sleep(ctx, s.cfg.scaled(time.Duration(p.Tokens-cached)*s.cfg.TransferPerToken)) {
		return cached, false
	}
	s.cache.Insert(p)
	return cached, true
}

// generation is a request past its prefill: what remains is to send the reply.
type generation struct {
	job
	id    string
	reply string
	usage Usage
	clock *sleeper
}

func (s *Server) responseID(j job) string {
	prefix := "cmpl-"
	switch {
	case j.chat:
		prefix = "chatcmpl-"
	case j.responses:
		prefix = "resp_"
	}
	return prefix + s.cfg.Name + "-" + strconv.FormatUint(s.seq.Add(1), 10)
}

// respond waits for the whole decode, then writes one JSON response.
func (s *Server) respond(ctx context.Context, w http.ResponseWriter, g generation) bool {
	if !g.clock.sleep(ctx, s.cfg.scaled(time.Duration(g.maxTokens-1)*s.cfg.DecodePerToken)) {
		return false
	}
	finish := "length"
	resp := response{ID: g.id, Created: time.Now().Unix(), Model: s.cfg.Model, Usage: &g.usage}
	c := choice{FinishReason: &finish}
	if g.chat {
		resp.Object = "chat.completion"
		c.Message = &chatMessage{Role: "assistant", Content: g.reply}
	} else {
		resp.Object = "text_completion"
		c.Text = &g.reply
	}
	resp.Choices = []choice{c}
	writeJSON(w, http.StatusOK, resp)
	return true
}

// responsesObject is the Responses API object of a finished generation (status "incomplete":
// the simulator always stops at the output budget, as finish_reason "length" says for chat).
func (s *Server) responsesObject(g generation, status string, text string) responsesResponse {
	resp := responsesResponse{ID: g.id, Object: "response", CreatedAt: time.Now().Unix(), Status: status, Model: s.cfg.Model,
		Output: []responsesOut{{Type: "message", ID: "msg_" + g.id, Status: status, Role: "assistant",
			Content: []responsesOutput{{Type: "output_text", Text: text, Annotations: []any{}}}}}}
	if status == "incomplete" {
		u := &responsesUsage{InputTokens: g.usage.PromptTokens, OutputTokens: g.usage.CompletionTokens, TotalTokens: g.usage.TotalTokens}
		u.InputTokensDetails.CachedTokens = g.usage.PromptTokensDetails.CachedTokens
		resp.Usage, resp.Details = u, &incompleteCause{Reason: "max_output_tokens"}
	}
	return resp
}

// respondResponses waits for the whole decode, then writes one Responses object.
func (s *Server) respondResponses(ctx context.Context, w http.ResponseWriter, g generation) bool {
	if !g.clock.sleep(ctx, s.cfg.scaled(time.Duration(g.maxTokens-1)*s.cfg.DecodePerToken)) {
		return false
	}
	writeJSON(w, http.StatusOK, s.responsesObject(g, "incomplete", g.reply))
	return true
}

// streamResponses sends the reply as the Responses API's server-sent events: response.created,
// response.output_text.delta events paced as stream paces chat chunks, response.completed's
// counterpart for a reply cut at the budget (response.incomplete) with the usage.
func (s *Server) streamResponses(ctx context.Context, w http.ResponseWriter, g generation) bool {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	seq := 0
	send := func(event string, v map[string]any) bool {
		v["type"], v["sequence_number"] = event, seq
		seq++
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !send("response.created", map[string]any{"response": s.responsesObject(g, "in_progress", "")}) {
		return false
	}
	perToken := s.cfg.scaled(s.cfg.DecodePerToken)
	group := 1
	if perToken > 0 && s.cfg.MinEventInterval > perToken {
		group = int((s.cfg.MinEventInterval + perToken - 1) / perToken)
	}
	start := time.Now()
	for sent, next := 0, 1; sent < g.maxTokens; next = min(sent+group, g.maxTokens) {
		if !g.clock.sleep(ctx, time.Until(start.Add(time.Duration(next-1)*perToken))) {
			return false
		}
		delta := g.reply[sent*CharsPerToken : next*CharsPerToken]
		if !send("response.output_text.delta", map[string]any{"item_id": "msg_" + g.id, "output_index": 0, "content_index": 0, "delta": delta}) {
			return false
		}
		sent = next
	}
	return send("response.incomplete", map[string]any{"response": s.responsesObject(g, "incomplete", g.reply)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	var e apiError
	e.Error.Message = msg
	e.Error.Code = status
	switch status {
	case http.StatusNotFound:
		e.Error.Type = "NotFoundError"
	default:
		e.Error.Type = "BadRequestError"
	}
	writeJSON(w, status, e)
}

// sleeper sleeps on one reusable timer, and wakes early when the request's context ends.
type sleeper struct{ t *time.Timer }

func newSleeper() *sleeper {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &sleeper{t: t}
}

// sleep waits d and reports whether ctx is still alive.
func (s *sleeper) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	s.t.Reset(d)
	select {
	case <-s.t.C:
		return true
	case <-ctx.Done():
		s.t.Stop()
		return false
	}
}

func (s *sleeper) stop() { s.t.Stop() }
