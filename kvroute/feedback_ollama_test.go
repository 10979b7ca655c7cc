package kvroute

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// ollamaShaped answers /api/chat as Ollama does (application/x-ndjson unless stream is false):
// a role line, content lines, and a final object with prompt_eval_count (a token per 4 chars of
// the messages) and prompt_eval_duration at prefillSpeed tokens per second (no cache).
func ollamaShaped(t *testing.T, prefillSpeed float64) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream   *bool `json:"stream"`
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		chars := 0
		for _, m := range req.Messages {
			chars += utf8.RuneCountInString(m.Content)
		}
		tokens := chars / 4
		ns := int64(float64(tokens) / prefillSpeed * 1e9)
		final := fmt.Sprintf(`{"model":"tiny","created_at":"2026-12-05T08:40:00Z","message":{"role":"assistant","content":""},"done_reason":"length","done":true,`+
			`"total_duration":%d,"load_duration":1000,"prompt_eval_count":%d,"prompt_eval_duration":%d,"eval_count":2,"eval_duration":1000000}`, ns+2000000, tokens, ns)
		if req.Stream != nil && !*req.Stream {
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			fmt.Fprint(w, strings.Replace(final, `"content":""`, `"content":"ab cd"`, 1))
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		fl := w.(http.Flusher)
		for _, piece := range []string{"", "ab", " cd"} {
			fmt.Fprintf(w, `{"model":"tiny","created_at":"2026-12-05T08:40:00Z","message":{"role":"assistant","content":%q},"done":false}`+"\n", piece)
			fl.Flush()
		}
		fmt.Fprint(w, final+"\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestFeedbackOllamaAnswers: Ollama's own API answers in NDJSON and reports no cached tokens;
// llm_feedback reads its streamed and whole answers, and learns the engine's prefill speed from
// prompt_eval_count over prompt_eval_duration of the answers the tree expected cold.
func TestFeedbackOllamaAnswers(t *testing.T) {
	leakCheck(t)
	const speed = 20000.0 // tokens per second
	srv := ollamaShaped(t, speed)
	addr := strings.TrimPrefix(srv.URL, "http://")
	startCaddy(t, feedbackConfig(addr, ""))
	client := &http.Client{Timeout: 20 * time.Second}
	for i := range 4 {
		// Distinct conversations: nothing the tree holds, each prefilled whole.
		body := fmt.Sprintf(`{"model":"tiny","messages":[{"role":"user","content":"%d %s"}]}`, i, strings.Repeat(fmt.Sprintf("conversation %d says hello. ", i), 60))
		if i == 3 {
			body = strings.Replace(body, `{"model"`, `{"stream":false,"model"`, 1)
		}
		if resp, got := ask(t, client, "/api/chat", body, ""); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, got)
		}
	}
	fb := upstreamFeedback(addr)
	waitUntil(t, 5*time.Second, func() bool { return fb != nil && fb.credited.Load() == 4 }, "four answers credited")
	if got, notType := fb.withUsage.Load(), fb.notRead[notReadType].Load(); got != 4 || notType != 0 {
		t.Fatalf("%d of 4 answers read with usage, %d not read for their content type; want 4 and 0", got, notType)
	}
	if fb.withCached.Load() != 0 {
		t.Fatalf("%d answers counted as reporting cached tokens: Ollama reports none", fb.withCached.Load())
	}
	s := currentState()
	u, _ := s.upstreams.Load(addr)
	learned := math.Float64frombits(u.(*upstreamState).learn.answerSpeed.Load())
	if math.Abs(learned-speed) > 0.02*speed {
		t.Fatalf("learned a prefill speed of %.0f tokens/s from the answers, the engine's is %.0f", learned, speed)
	}
	t.Logf("Ollama-shaped answers: 4 read, prefill speed learned %.0f tokens/s (engine %.0f)", learned, speed)
}
