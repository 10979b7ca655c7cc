package llmsim

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// stream sends the reply as server-sent events the way vLLM does: for chat a first chunk with
// the assistant role, then content chunks, the last one with finish_reason; when the request
// asked for stream_options.include_usage, a final chunk with no choices and the usage; then
// "data: [DONE]". Every event is flushed. The first token goes out right after prefill (that is
// the time to first token), the others every DecodePerToken, grouped so that events are at
// least MinEventInterval apart.
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, g generation) bool {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)

	created := time.Now().Unix()
	object := "text_completion"
	if g.chat {
		object = "chat.completion.chunk"
	}
	chunk := func(delta *chatMessage, text string, finish *string) response {
		r := response{ID: g.id, Object: object, Created: created, Model: s.cfg.Model}
		c := choice{FinishReason: finish}
		if g.chat {
			if delta == nil {
				delta = &chatMessage{Content: text}
			}
			c.Delta = delta
		} else {
			c.Text = &text
		}
		r.Choices = []choice{c}
		return r
	}
	send := func(v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := w.Write(append(append([]byte("data: "), b...), '\n', '\n')); err != nil {
			return false
		}
		return rc.Flush() == nil
	}

	perToken := s.cfg.scaled(s.cfg.DecodePerToken)
	group := 1
	if perToken > 0 && s.cfg.MinEventInterval > perToken {
		group = int((s.cfg.MinEventInterval + perToken - 1) / perToken)
	}
	finish := "length"
	start := time.Now()
	if g.chat && !send(chunk(&chatMessage{Role: "assistant"}, "", nil)) {
		return false
	}
	// Token i (0-based) is ready at start + i*perToken; an event carries the tokens ready.
	for sent, next := 0, 1; sent < g.maxTokens; next = min(sent+group, g.maxTokens) {
		if !g.clock.sleep(ctx, time.Until(start.Add(time.Duration(next-1)*perToken))) {
			return false
		}
		var fin *string
		if next == g.maxTokens {
			fin = &finish
		}
		text := g.reply[sent*CharsPerToken : next*CharsPerToken]
		if !send(chunk(nil, text, fin)) {
			return false
		}
		sent = next
	}
	if g.includeUsage {
		if !send(response{ID: g.id, Object: object, Created: created, Model: s.cfg.Model,
			Choices: []choice{}, Usage: &g.usage}) {
			return false
		}
	}
	if _, err := w.Write([]byte("data: [DONE]\n\n")); err != nil {
		return false
	}
	return rc.Flush() == nil
}
