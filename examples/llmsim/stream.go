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
// "data: [DONE]". Every event is flushed. The first token goes out at the engine step that
// ends the prefill (that is the time to first token), the others as the engine's decode steps
// make them, grouped so that events are at least MinEventInterval apart at one sequence's
// decode step.
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

	finish := "length"
	if g.chat && !send(chunk(&chatMessage{Role: "assistant"}, "", nil)) {
		s.eng.abort(g.pd)
		return false
	}
	// An event carries the tokens the engine generated since the last one.
	if !s.follow(ctx, g, func(from, to int) bool {
		var fin *string
		if to == g.maxTokens {
			fin = &finish
		}
		return send(chunk(nil, g.reply[from*CharsPerToken:to*CharsPerToken], fin))
	}) {
		s.eng.abort(g.pd)
		return false
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
