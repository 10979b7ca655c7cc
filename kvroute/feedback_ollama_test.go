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
// the messages), prompt_eval_duration at prefillSpeed tokens per second (no cache) and
// eval_count 2.
func ollamaShaped(t *testing.T, prefillSpeed float64) *httptest.Server {
	return ollamaAnswering(t, prefillSpeed, 2, -1)
}

// ollamaAnswering is ollamaShaped with evalCount output tokens and, when cached >= 0, the
// prompt_eval_cached_count of the releases that report it (cached tokens, at most the prompt's;
// prompt_eval_duration then covers the rest).
func ollamaAnswering(t *testing.T, prefillSpeed float64, evalCount, cached int) *httptest.Server {
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
		computed, cachedField := tokens, ""
		if cached >= 0 {
			c := min(cached, tokens)
			computed, cachedField = tokens-c, fmt.Sprintf(`"prompt_eval_cached_count":%d,`, c)
		}
		ns := int64(float64(computed) / prefillSpeed * 1e9)
		final := fmt.Sprintf(`{"model":"tiny","created_at":"2026-12-05T08:40:00Z","message":{"role":"assistant","content":""},"done_reason":"length","done":true,`+
			`"total_duration":%d,"load_duration":1000,"prompt_eval_count":%d,%s"prompt_eval_duration":%d,"eval_count":%d,"eval_duration":1000000}`, ns+2000000, tokens, cachedField, ns, evalCount)
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

// TestFeedbackOllamaChargesOutput: a flow_control tenant is charged, once its Ollama answer is
// read, its prompt plus output_weight × the answer's eval_count, streamed or whole: 5,000
// output tokens are due, not expected_tokens' 256.
func TestFeedbackOllamaChargesOutput(t *testing.T) {
	leakCheck(t)
	const out = 5000
	srv := ollamaAnswering(t, 20000, out, -1)
	addr := strings.TrimPrefix(srv.URL, "http://")
	startCaddy(t, feedbackConfig(addr, "flow_control {\n\t\t\t\ttenant {http.request.header.X-Tenant}\n\t\t\t}"))
	client := &http.Client{Timeout: 20 * time.Second}
	text := strings.Repeat("tell me more about the cache. ", 40)
	prompt := utf8.RuneCountInString(text) / 4 // the upstream counts a token per 4 chars
	for _, stream := range []bool{true, false} {
		tenant := fmt.Sprintf("ollama-stream-%v", stream)
		body := fmt.Sprintf(`{"model":"tiny","stream":%v,"messages":[{"role":"user","content":%q}]}`, stream, text)
		if resp, got := ask(t, client, "/api/chat", body, "", "X-Tenant", tenant); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, got)
		}
		series := fmt.Sprintf(`caddy_kvroute_tenant_tokens_served{tenant=%q}`, tenant)
		want, got := float64(prompt+2*out), 0.0
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if got = metricValue(t, series); got == want {
				break
			}
		}
		if got != want {
			t.Fatalf("stream %v: tenant's tokens served %v, want the answer's %d prompt + 2 × %d output = %v", stream, got, prompt, out, want)
		}
	}
}

// TestFeedbackOllamaCachedTokens: an Ollama that reports prompt_eval_cached_count has its cached
// tokens read as any engine's: the answers count as reporting cached tokens, the reported total
// moves by the engine's figure, and the prefill speed is learned from the tokens it computed
// over prompt_eval_duration.
func TestFeedbackOllamaCachedTokens(t *testing.T) {
	leakCheck(t)
	const speed, cached = 20000.0, 64
	srv := ollamaAnswering(t, speed, 3, cached)
	addr := strings.TrimPrefix(srv.URL, "http://")
	startCaddy(t, feedbackConfig(addr, ""))
	client := &http.Client{Timeout: 20 * time.Second}
	for i := range 3 {
		body := fmt.Sprintf(`{"model":"tiny","messages":[{"role":"user","content":"%d %s"}]}`, i, strings.Repeat(fmt.Sprintf("conversation %d says hello. ", i), 60))
		if i == 2 {
			body = strings.Replace(body, `{"model"`, `{"stream":false,"model"`, 1)
		}
		if resp, got := ask(t, client, "/api/chat", body, ""); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, got)
		}
	}
	fb := upstreamFeedback(addr)
	waitUntil(t, 5*time.Second, func() bool { return fb != nil && fb.credited.Load() == 3 }, "three answers credited")
	if got := fb.withCached.Load(); got != 3 {
		t.Fatalf("%d of 3 answers counted as reporting cached tokens, want 3", got)
	}
	if got := metricValue(t, fmt.Sprintf(`caddy_kvroute_reported_cached_tokens_total{upstream=%q}`, addr)); got != 3*cached {
		t.Fatalf("reported cached tokens %v, want 3 × %d", got, cached)
	}
	u, _ := currentState().upstreams.Load(addr)
	learned := math.Float64frombits(u.(*upstreamState).learn.answerSpeed.Load())
	if math.Abs(learned-speed) > 0.02*speed {
		t.Fatalf("learned a prefill speed of %.0f tokens/s, the engine's is %.0f (its computed tokens over prompt_eval_duration)", learned, speed)
	}
}
