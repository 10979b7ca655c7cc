package kvroute

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
)

// timedEngine is a loopback engine that takes a known time to prefill and then to decode, and
// reports prompt tokens in its usage, none of them cached. A streamed request gets its first
// content event after the prefill and the usage after the decode; a non-streamed one gets the
// whole JSON answer after both, as vLLM and SGLang send it. A request with X-Hold decodes until
// release is closed.
type timedEngine struct {
	srv             *httptest.Server
	prompt          int
	prefill, decode time.Duration
	release         chan struct{}
}

func newTimedEngine(t *testing.T, prompt int, prefill, decode time.Duration) *timedEngine {
	leakCheck(t)
	e := &timedEngine{prompt: prompt, prefill: prefill, decode: decode, release: make(chan struct{})}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	t.Cleanup(func() {
		select {
		case <-e.release:
		default:
			close(e.release)
		}
	})
	return e
}

func (e *timedEngine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

func (e *timedEngine) wait(r *http.Request, d time.Duration) bool {
	if r.Header.Get("X-Hold") != "" && d == e.decode {
		select {
		case <-e.release:
			return true
		case <-r.Context().Done():
			return false
		}
	}
	select {
	case <-time.After(d):
		return true
	case <-r.Context().Done():
		return false
	}
}

func (e *timedEngine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" || r.URL.Path == "/v1/models" {
		http.NotFound(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	usage := fmt.Sprintf(`"usage":{"prompt_tokens":%d,"completion_tokens":20,"prompt_tokens_details":{"cached_tokens":0}}`, e.prompt)
	if !llmreq.Parse(body, false).Stream {
		if !e.wait(r, e.prefill) || !e.wait(r, e.decode) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],`+usage+`}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush() // vLLM sends its headers before the prefill
	if !e.wait(r, e.prefill) {
		return
	}
	io.WriteString(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Par\"}}]}\n\n")
	w.(http.Flusher).Flush()
	if !e.wait(r, e.decode) {
		return
	}
	io.WriteString(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],"+usage+"}\n\ndata: [DONE]\n\n")
	w.(http.Flusher).Flush()
}

// prefillSpeedMetric is caddy_kvroute_prefill_tokens_per_second for addr.
func prefillSpeedMetric(t *testing.T, addr string) float64 {
	t.Helper()
	_, body := adminCall(t, http.MethodGet, "/metrics")
	m := regexp.MustCompile(`caddy_kvroute_prefill_tokens_per_second\{upstream="` + regexp.QuoteMeta(addr) + `"\} (\S+)`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("metrics lack caddy_kvroute_prefill_tokens_per_second for %s", addr)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestFeedbackNonStreamedTeachesNoPrefillSpeed: a non-streamed answer's first byte comes after
// its whole decode, so it marks no first token: answers of 20,000 uncached tokens prefilled in
// 20 ms and decoded in 300 ms teach no prefill speed (taken from the first byte, they taught
// 20,000 ÷ 0.32 s, 16 times too slow), while the same answers streamed teach about 20,000 ÷
// 0.02 s.
func TestFeedbackNonStreamedTeachesNoPrefillSpeed(t *testing.T) {
	const prompt = 20000
	prefill, decode := 20*time.Millisecond, 300*time.Millisecond
	e := newTimedEngine(t, prompt, prefill, decode)
	startCaddy(t, feedbackConfig(e.addr(), ""))
	client := &http.Client{Timeout: 20 * time.Second}
	body := func(i int, stream bool) string {
		b := chatBody("m", fmt.Sprintf("question %d: %s", i, strings.Repeat("why? ", 20)))
		if stream {
			b = strings.Replace(b, `"max_tokens":16`, `"max_tokens":16,"stream":true`, 1)
		}
		return b
	}
	fb := func() *feedbackState { return upstreamFeedback(e.addr()) }
	const n = 5 // more than the minSpeedSamples a median needs
	for i := range n {
		ask(t, client, "/v1/chat/completions", body(i, false), "")
	}
	waitUntil(t, 5*time.Second, func() bool { return fb().withUsage.Load() == n }, "the non-streamed answers' usage credited")
	if l := learnedOf(t, e.addr()); l.PrefillFromAnswers != 0 {
		t.Errorf("%d non-streamed answers (prefill %v, decode %v, %d uncached tokens) taught a prefill speed of %.0f tokens/s; want none (a first byte after the decode is no first token)",
			n, prefill, decode, prompt, l.PrefillFromAnswers)
	}
	if v := prefillSpeedMetric(t, e.addr()); v != DefaultPrefillTokensPerSecond {
		t.Errorf("caddy_kvroute_prefill_tokens_per_second after non-streamed answers only: %.0f, want the default %v", v, DefaultPrefillTokensPerSecond)
	}

	for i := range n {
		ask(t, client, "/v1/chat/completions", body(100+i, true), "")
	}
	waitUntil(t, 5*time.Second, func() bool { return fb().withUsage.Load() == 2*n }, "the streamed answers' usage credited")
	whole := prompt / (prefill + decode).Seconds()
	l := learnedOf(t, e.addr())
	t.Logf("streamed answers taught %.0f tokens/s (%.0f over the prefill alone, %.0f over prefill and decode)", l.PrefillFromAnswers, prompt/prefill.Seconds(), whole)
	if !(l.PrefillFromAnswers > 2*whole) || l.PrefillFromAnswers > prompt/prefill.Seconds() {
		t.Errorf("streamed answers taught %.0f tokens/s; want above %.0f (twice the speed over prefill and decode) and at most %.0f (over the prefill alone)",
			l.PrefillFromAnswers, 2*whole, prompt/prefill.Seconds())
	}
	if v := prefillSpeedMetric(t, e.addr()); v != l.PrefillFromAnswers {
		t.Errorf("caddy_kvroute_prefill_tokens_per_second %.0f, want the speed learned from the streamed answers, %.0f", v, l.PrefillFromAnswers)
	}
}

// TestFeedbackNonStreamedLeavesQueuedPrefill: on an upstream whose streamed answers report
// their first tokens, a non-streamed request (which reports none) stops counting in the
// queued prefill once its predicted time to first token has passed, not when its long decode
// ends; a streamed one still counts until its first content.
func TestFeedbackNonStreamedLeavesQueuedPrefill(t *testing.T) {
	e := newTimedEngine(t, 2000, 5*time.Millisecond, 10*time.Millisecond)
	startCaddy(t, feedbackConfig(e.addr(), ""))
	client := &http.Client{Timeout: 30 * time.Second}
	stream := func(b string) string {
		return strings.Replace(b, `"max_tokens":16`, `"max_tokens":16,"stream":true`, 1)
	}
	// A streamed answer: the upstream now reports first tokens.
	ask(t, client, "/v1/chat/completions", stream(chatBody("m", coldPrompt(1))), "")
	u := currentState().upstream(e.addr())
	waitUntil(t, 5*time.Second, func() bool { return u.firstTokens.Load() }, "the first token reported")

	// A non-streamed request that decodes until the test releases it: about 500 tokens
	// estimated, at the default 5,000 tokens per second its first token is predicted 0.1 s on.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader(chatBody("m", bigCold(2, 500))))
		req.Header.Set("X-Hold", "1")
		if resp, err := client.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitUntil(t, 5*time.Second, func() bool { return getStatus(t).Upstreams[e.addr()].PrefillTokens > 400 }, "the non-streamed request counted in the queued prefill")
	time.Sleep(300 * time.Millisecond) // past its predicted first token, deep in its decode
	// The next decision reads the queue: the non-streamed request has left it.
	ask(t, client, "/v1/chat/completions", stream(chatBody("m", coldPrompt(3))), "")
	waitUntil(t, 5*time.Second, func() bool { return getStatus(t).Upstreams[e.addr()].InFlight == 1 }, "the streamed request's end")
	if got := getStatus(t).Upstreams[e.addr()].PrefillTokens; got != 0 {
		t.Errorf("a non-streamed request past its predicted first token, still decoding: %d tokens of queued prefill; want 0", got)
	}
	close(e.release)
	<-done
}

// TestFeedbackDoneSplitAcrossWrites: an engine that flushes "data: [DO" and "NE]\n\n" apart
// ends its stream; no answer is counted as unreadable. Its stream carries no content the
// observer knows (a role chunk: an empty completion), so every event of it is parsed.
func TestFeedbackDoneSplitAcrossWrites(t *testing.T) {
	leakCheck(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, part := range []string{
			"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":\"stop\"}]}\n\n",
			"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":256}}}\n\n",
			"data: [DO", "NE]\n\n",
		} {
			io.WriteString(w, part)
			w.(http.Flusher).Flush()
			time.Sleep(30 * time.Millisecond) // each part its own read on the proxy's side
		}
	}))
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	startCaddy(t, feedbackConfig(addr, ""))
	client := &http.Client{Timeout: 20 * time.Second}
	const n = 3
	for i := range n {
		_, got := ask(t, client, "/v1/chat/completions", strings.Replace(chatBody("m", coldPrompt(i)), `"max_tokens":16`, `"max_tokens":16,"stream":true`, 1), "")
		if !strings.HasSuffix(string(got), "data: [DONE]\n\n") {
			t.Fatalf("answer %d: the client got %q", i, got)
		}
	}
	fb := upstreamFeedback(addr)
	waitUntil(t, 5*time.Second, func() bool { return fb.credited.Load() == n }, "the answers credited")
	if fb.gaveUp.Load() != 0 || fb.withCached.Load() != n {
		t.Errorf("%d streams ending in a [DONE] flushed in two writes: %d counted unreadable (answers_ignored_total), %d with cached tokens; want 0 and %d",
			n, fb.gaveUp.Load(), fb.withCached.Load(), n)
	}
	_, body := adminCall(t, http.MethodGet, "/metrics")
	if want := fmt.Sprintf(`caddy_kvroute_answers_ignored_total{reason="unreadable",upstream=%q} 0`, addr); !strings.Contains(string(body), want) {
		for _, l := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(l, "caddy_kvroute_answers_ignored_total") {
				t.Log(l)
			}
		}
		t.Errorf("metrics lack %s", want)
	}
}
