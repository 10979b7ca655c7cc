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

	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
)

// Headers set on every response of a worker.
const (
	HeaderWorker       = "X-Kvsim-Worker"
	HeaderCachedTokens = "X-Kvsim-Cached-Tokens"
	HeaderPromptTokens = "X-Kvsim-Prompt-Tokens"
)

// Server is one simulated worker. It is an http.Handler; create it with New.
type Server struct {
	cfg Config
	eng *realtime // the engine, run on the wall clock
	mux *http.ServeMux
	seq atomic.Uint64
	// requests counts the requests answered to the end; startNanos is the simulated
	// process's start (Unix nanoseconds): Restart takes a new one.
	requests   atomic.Uint64
	handling   atomic.Int64
	startNanos atomic.Int64
	// advertise is the host:port a prefill worker names in its transfer parameters.
	advertise string
	// observer sees the requests (Observe); nil: none.
	observer atomic.Pointer[Observer]
}

// New returns a worker simulating cfg (zero fields take the defaults).
func New(cfg Config) *Server {
	cfg = cfg.withDefaults()
	s := &Server{
		cfg: cfg,
		eng: newRealtime(cfg.engine()),
		mux: http.NewServeMux(),
	}
	s.startNanos.Store(time.Now().UnixNano())
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

// Engine returns the parameters of the engine the worker runs (its durations divided by
// Speed): the fleet simulator's engine.Config of the same engine.
func (s *Server) Engine() engine.Config { return s.eng.cfg }

// ServeHTTP serves the OpenAI-compatible API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(HeaderWorker, s.cfg.Name)
	s.mux.ServeHTTP(w, r)
}

// Reset empties the engine, as a restart does (its prefix cache, queues and counters), but
// keeps its process start time. Requests in flight are aborted: they end in an error, or a
// stream cut short.
func (s *Server) Reset() {
	s.eng.restart()
	s.requests.Store(0)
}

// Restart is Reset as an engine process restarted would show it: an empty cache, counters back
// to zero, the requests in flight cut, and a new process_start_time_seconds.
func (s *Server) Restart() {
	s.Reset()
	s.startNanos.Store(time.Now().UnixNano())
}

// Stats is a snapshot of a worker's counters.
type Stats struct {
	Requests         uint64 // requests served to the end
	PromptTokens     uint64
	CachedTokens     uint64
	GenerationTokens uint64
	Running, Waiting int // in the engine
	// Handling is the generation requests received and not yet answered: those in the engine
	// and those waiting outside it (a decode worker's for its KV transfer or bootstrap room).
	Handling    int
	CacheBlocks int
	Evictions   uint64
}

// Stats returns the worker's counters since it started or was reset.
func (s *Server) Stats() Stats {
	r := s.eng.reading()
	return Stats{
		Requests:         s.requests.Load(),
		PromptTokens:     r.PrefixQueries,
		CachedTokens:     r.PrefixHits,
		GenerationTokens: r.GenerationTokens,
		Running:          r.Running,
		Waiting:          r.Waiting,
		Handling:         int(s.handling.Load()),
		CacheBlocks:      r.CachedBlocks,
		Evictions:        r.Evictions,
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

// run takes a parsed request through the engine: queue, prefix cache lookup at admission,
// prefill in the engine's steps, decode; a decode worker of prefill/decode disaggregation
// receives the prompt's KV first instead of prefilling it.
func (s *Server) run(w http.ResponseWriter, r *http.Request, j job) {
	if j.model != "" && j.model != s.cfg.Model {
		writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", j.model))
		return
	}
	s.handling.Add(1)
	defer s.handling.Add(-1)
	p := NewPrompt(j.text, s.cfg.BlockTokens)
	arrived := time.Now()
	if c := s.cfg.CapacityBlocks; c > 0 {
		// The engine drops a request whose prompt and output do not fit in the whole cache,
		// as vLLM refuses a prompt longer than the model's length.
		if need := (p.Tokens + j.maxTokens + s.cfg.BlockTokens - 1) / s.cfg.BlockTokens; need > c {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("%d prompt tokens and %d output tokens need %d KV blocks; the cache holds %d", p.Tokens, j.maxTokens, need, c))
			return
		}
	}
	ctx := r.Context()
	var (
		pd  *pending
		obs Observer // sees this request (aggregated workers only)
		id  string
	)
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
			pd = s.eng.submit(p, 1, false, false, arrived)
			if !s.eng.wait(ctx, pd, pd.done) {
				s.cfg.Transfers.abandon(key, e)
				s.aborted(w, ctx)
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
			if pd = s.transfer(ctx, p, j, arrived); pd == nil {
				s.cfg.Transfers.abandon(key, e)
				return
			}
			s.cfg.Transfers.took(key, e)
			s.cfg.Transfers.Taken.Add(1)
		}
	}
	switch {
	case pd != nil:
		// Prefilled or transferred above.
	case s.cfg.Role == RoleDecode && j.kv != nil && j.kv.DoRemotePrefill:
		if err := s.takeTransfer(j.kv); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		if pd = s.transfer(ctx, p, j, arrived); pd == nil {
			return
		}
	case s.cfg.Role == RoleDecode && j.kv != nil:
		writeError(w, http.StatusBadRequest, "a decode worker takes do_remote_prefill transfers or whole requests")
		return
	case s.cfg.Role == RolePrefill && j.kv != nil && j.kv.DoRemoteDecode:
		// The prefill leg: one token and the handover.
		pd = s.eng.submit(p, 1, false, false, arrived)
		if !s.eng.wait(ctx, pd, pd.done) {
			s.aborted(w, ctx)
			return
		}
		s.cfg.Transfers.Prefills.Add(1)
		finish := "length"
		resp := response{ID: s.responseID(j), Created: time.Now().Unix(), Model: s.cfg.Model,
			Usage:            &Usage{PromptTokens: p.Tokens, CompletionTokens: 1, TotalTokens: p.Tokens + 1, PromptTokensDetails: PromptTokensDetails{CachedTokens: pd.cached}},
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
		s.requests.Add(1)
		return
	default:
		if o := s.observer.Load(); o != nil {
			obs = *o
			a := s.arrival(r, p, j.maxTokens, arrived)
			id = a.ID
			obs.Arrived(s, a)
		}
		pd = s.eng.submit(p, j.maxTokens, false, j.stream, arrived)
	}
	if !s.eng.wait(ctx, pd, pd.first) {
		s.aborted(w, ctx)
		return
	}
	if obs != nil {
		obs.FirstToken(id, s.eng.origin.Add(pd.firstAt), pd.cached)
	}
	usage := Usage{
		PromptTokens:        p.Tokens,
		CompletionTokens:    j.maxTokens,
		TotalTokens:         p.Tokens + j.maxTokens,
		PromptTokensDetails: PromptTokensDetails{CachedTokens: pd.cached},
	}
	h := w.Header()
	h.Set(HeaderCachedTokens, strconv.Itoa(pd.cached))
	h.Set(HeaderPromptTokens, strconv.Itoa(p.Tokens))
	g := generation{
		job:   j,
		id:    s.responseID(j),
		reply: replyText(uint64(p.Tokens)^uint64(len(j.text))<<32, j.maxTokens),
		usage: usage,
		pd:    pd,
	}
	var ok bool
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
		s.requests.Add(1)
		if obs != nil {
			obs.Finished(id, s.eng.origin.Add(pd.doneAt), time.Now())
		}
	}
}

// aborted answers a request the engine dropped before its first token (a restart), unless
// its client is gone.
func (s *Server) aborted(w http.ResponseWriter, ctx context.Context) {
	if ctx.Err() == nil {
		writeError(w, http.StatusInternalServerError, "the engine restarted and dropped the request")
	}
}

// transfer is a decode worker's request for a prompt a prefill worker computed: the KV of the
// prompt's tokens it does not hold arrives at TransferPerToken each, then the request joins
// the batch without a prefill. nil when the client went away.
func (s *Server) transfer(ctx context.Context, p Prompt, j job, arrived time.Time) *pending {
	cached := s.eng.lookup(p)
	t := time.NewTimer(s.cfg.scaled(time.Duration(p.Tokens-cached) * s.cfg.TransferPerToken))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return nil
	}
	return s.eng.submit(p, j.maxTokens, true, j.stream, arrived)
}

// generation is a request past its first token: what remains is to send the reply.
type generation struct {
	job
	id    string
	reply string
	usage Usage
	pd    *pending
}

// group is how many tokens a streamed event carries: tokens generated faster than
// MinEventInterval (at the engine's decode step of one sequence) are sent together.
func (s *Server) group() int {
	perToken := s.Engine().StepTime(0, 1)
	if perToken > 0 && s.cfg.MinEventInterval > perToken {
		return int((s.cfg.MinEventInterval + perToken - 1) / perToken)
	}
	return 1
}

// follow calls emit for the output tokens as the engine generates them: the first token
// alone, then groups of s.group() tokens (the last one shorter). It reports false when the
// client went away, the engine dropped the request or emit failed.
func (s *Server) follow(ctx context.Context, g generation, emit func(from, to int) bool) bool {
	total, group := g.maxTokens, s.group()
	for sent := 0; sent < total; {
		next := min(sent+group, total)
		if sent == 0 {
			next = 1
		}
		if g.pd.want.Store(int64(next)); int(g.pd.gen.Load()) >= next {
			if !emit(sent, next) {
				return false
			}
			sent = next
			continue
		}
		select {
		case <-g.pd.tick:
		case <-g.pd.done:
			if g.pd.aborted.Load() {
				return false
			}
		case <-ctx.Done():
			s.eng.abort(g.pd)
			return false
		}
	}
	return true
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
	if !s.eng.wait(ctx, g.pd, g.pd.done) {
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
	if !s.eng.wait(ctx, g.pd, g.pd.done) {
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
	ok := s.follow(ctx, g, func(from, to int) bool {
		delta := g.reply[from*CharsPerToken : to*CharsPerToken]
		return send("response.output_text.delta", map[string]any{"item_id": "msg_" + g.id, "output_index": 0, "content_index": 0, "delta": delta})
	})
	if !ok {
		s.eng.abort(g.pd)
		return false
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
