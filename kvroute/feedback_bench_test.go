package kvroute

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// benchStream is a chat stream of n content events and vLLM's final usage event, as written.
func benchStream(n int) [][]byte {
	out := make([][]byte, 0, n+2)
	for i := range n {
		out = append(out, fmt.Appendf(nil, "data: {\"id\":\"chatcmpl-8f2a\",\"object\":\"chat.completion.chunk\",\"created\":1733000000,\"model\":\"llama-3.1-8b\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token%d\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n", i))
	}
	out = append(out, []byte("data: {\"id\":\"chatcmpl-8f2a\",\"object\":\"chat.completion.chunk\",\"created\":1733000000,\"model\":\"llama-3.1-8b\",\"choices\":[],\"usage\":{\"prompt_tokens\":4200,\"total_tokens\":4456,\"completion_tokens\":256,\"prompt_tokens_details\":{\"cached_tokens\":4096}}}\n\n"),
		[]byte("data: [DONE]\n\n"))
	return out
}

// BenchmarkAnswerObserver: the observer alone, per answer (a stream of 256 events, or a JSON
// answer): its cost per byte and its allocations per answer.
func BenchmarkAnswerObserver(b *testing.B) {
	stream := benchStream(256)
	size := 0
	for _, e := range stream {
		size += len(e)
	}
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1733000000,"model":"llama-3.1-8b","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("Paris is the capital of France. ", 64) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4200,"total_tokens":4456,"completion_tokens":256,"prompt_tokens_details":{"cached_tokens":4096}}}`)
	b.Run("sse-256-events", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(size))
		var o answerObserver
		for range b.N {
			o.begin(answerSSE, false)
			for _, e := range stream {
				o.write(e)
			}
			if u := o.finish(); !u.ok {
				b.Fatal("no usage")
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		var o answerObserver
		for range b.N {
			o.begin(answerJSON, false)
			o.write(body)
			if u := o.finish(); !u.ok {
				b.Fatal("no usage")
			}
		}
	})
}

// discardWriter is a ResponseWriter that keeps nothing, with Flush, as Caddy's own.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Flush()                      {}

// benchAnswer serves one answer as Caddy would with and without llm_feedback: the handler
// after it (the reverse proxy) finds the request's decision in its vars, writes the headers,
// then each event with a flush.
func benchAnswer(s *state, u *upstreamState, stream [][]byte, feedback bool) {
	vars := map[string]any{}
	ctx := context.WithValue(context.Background(), caddyhttp.VarsCtxKey, vars)
	r := (&http.Request{Method: http.MethodPost, Header: http.Header{}}).WithContext(ctx)
	dw := &discardWriter{h: http.Header{}}
	proxy := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if _, watched := vars[varFeedback]; watched {
			// What Select records (outside what llm_feedback adds: it runs with or without it).
			lr := &llmRequest{}
			a := &attempt{u: u}
			a.pred.s, a.pred.start, a.pred.watched, a.pred.cpt = s, time.Now(), true, 4
			u.feedback.awaiting.Add(1)
			lr.attempt.Store(a)
			vars[varRequest] = lr
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for _, e := range stream {
			w.Write(e)
			rc.Flush()
		}
		return nil
	})
	if feedback {
		(&Feedback{}).ServeHTTP(dw, r, proxy)
	} else {
		proxy.ServeHTTP(dw, r)
	}
}

// BenchmarkFeedbackWriter: a whole streamed answer through the writer llm_feedback wraps around
// the response, against the same answer written straight: the allocations per answer and the
// throughput ratio.
func BenchmarkFeedbackWriter(b *testing.B) {
	s := newState()
	u := s.upstream("10.0.0.1:8000")
	stream := benchStream(256)
	size := 0
	for _, e := range stream {
		size += len(e)
	}
	for _, feedback := range []bool{false, true} {
		b.Run(fmt.Sprintf("feedback=%v", feedback), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for range b.N {
				benchAnswer(s, u, stream, feedback)
			}
		})
	}
}

// BenchmarkFeedbackFirstByte: from the answer's headers to its first event written, with and
// without llm_feedback: what the observer adds before the first byte reaches the client.
func BenchmarkFeedbackFirstByte(b *testing.B) {
	s := newState()
	u := s.upstream("10.0.0.1:8000")
	stream := benchStream(1)[:1]
	for _, feedback := range []bool{false, true} {
		b.Run(fmt.Sprintf("feedback=%v", feedback), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				benchAnswer(s, u, stream, feedback)
			}
		})
	}
}
