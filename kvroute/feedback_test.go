package kvroute

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
)

// scriptEngine is a real HTTP upstream on loopback that answers with recorded shapes of real
// engines' answers, chosen by the request's X-Answer header, each SSE event written and flushed
// on its own. With X-Gate, it waits before each event after the first until the test lets it go.
type scriptEngine struct {
	name string
	srv  *httptest.Server
	hits atomic.Int64
	ids  atomic.Int64
	gate chan struct{}
	// lastPrompt is the prompt tokens of the latest request.
	lastPrompt atomic.Int64
	// cached is what it reports as cached tokens in the usage of "usage" answers.
	cached atomic.Int64
	// hold, when set, makes the requests with X-Hold (or without X-Answer) wait until it is
	// closed.
	mu   sync.Mutex
	hold chan struct{}
}

type scripted struct {
	status int
	ctype  string
	parts  []string
}

// answers are the shapes the tests send back. "%ID%" is replaced by a fresh Responses id naming
// the engine, "%CACHED%" by the engine's cached tokens, "%PROMPT%" by the prompt's tokens (its
// routing text's runes over 4).
var answers = map[string]scripted{
	"chat-json": {200, "application/json", []string{`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],"usage":{"prompt_tokens":%PROMPT%,"total_tokens":1202,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":%CACHED%}}}`}},
	"chat-sse": {200, "text/event-stream", []string{
		"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
		"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Par\"}}]}\n\n",
		"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"is.\"},\"finish_reason\":\"stop\"}]}\n\n",
		"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":1200,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":%CACHED%}}}\n\n",
		"data: [DONE]\n\n"}},
	"chat-sse-no-usage": {200, "text/event-stream", []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n", "data: [DONE]\n\n"}},
	"completions-sse": {200, "text/event-stream", []string{
		"data: {\"object\":\"text_completion\",\"choices\":[{\"text\":\"a\",\"index\":0}]}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1200,\"prompt_tokens_details\":{\"cached_tokens\":%CACHED%}}}\n\n", "data: [DONE]\n\n"}},
	"responses-json": {200, "application/json", []string{`{"id":"%ID%","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],"usage":{"input_tokens":1200,"input_tokens_details":{"cached_tokens":%CACHED%},"output_tokens":1,"total_tokens":1201}}`}},
	"responses-sse": {200, "text/event-stream", []string{
		"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"%ID%\",\"object\":\"response\",\"status\":\"in_progress\"}}\n\n",
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n",
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"%ID%\",\"object\":\"response\",\"status\":\"completed\",\"usage\":{\"input_tokens\":1200,\"input_tokens_details\":{\"cached_tokens\":%CACHED%},\"output_tokens\":1}}}\n\n"}},
	"anthropic-json": {200, "application/json", []string{`{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"usage":{"input_tokens":200,"cache_creation_input_tokens":0,"cache_read_input_tokens":%CACHED%,"output_tokens":5}}`}},
	"anthropic-sse": {200, "text/event-stream", []string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"content\":[],\"usage\":{\"input_tokens\":200,\"cache_read_input_tokens\":%CACHED%,\"output_tokens\":1}}}\n\n",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"}},
	// Anthropic's message_delta with its cumulative input_tokens and no cache fields: the
	// cached tokens message_start reported stand.
	"anthropic-sse-delta": {200, "text/event-stream", []string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"content\":[],\"usage\":{\"input_tokens\":200,\"cache_read_input_tokens\":%CACHED%,\"output_tokens\":1}}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":200,\"output_tokens\":15}}\n\n",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"}},
	"llamacpp-json": {200, "application/json", []string{`{"content":"Hi","stop":true,"timings":{"prompt_n":200,"prompt_ms":40.5,"cache_n":%CACHED%,"predicted_n":1}}`}},
	"lying":         {200, "application/json", []string{`{"choices":[],"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":1000000000000}}}`}},
	"nan":           {200, "application/json", []string{`{"choices":[],"usage":{"prompt_tokens":NaN}}`}},
	"huge-final": {200, "text/event-stream", []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 3<<20) + "\"}}],\"usage\":{\"prompt_tokens\":5}}\n\n", "data: [DONE]\n\n"}},
	"cut":   {200, "text/event-stream", []string{"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usa"}},
	"error": {500, "application/json", []string{`{"error":{"message":"boom","usage":{"prompt_tokens":5}}}`}},
	"html":  {200, "text/html", []string{"<html>usage</html>"}},
}

func (a scripted) render(e *scriptEngine, id string, prompt int) []string {
	out := make([]string, len(a.parts))
	for i, p := range a.parts {
		p = strings.ReplaceAll(p, "%ID%", id)
		p = strings.ReplaceAll(p, "%PROMPT%", fmt.Sprint(prompt))
		out[i] = strings.ReplaceAll(p, "%CACHED%", fmt.Sprint(e.cached.Load()))
	}
	return out
}

func newScriptEngine(t testing.TB, name string) *scriptEngine {
	if tt, ok := t.(*testing.T); ok {
		leakCheck(tt) // first, so that its check runs after the engine has closed
	}
	e := &scriptEngine{name: name, gate: make(chan struct{})}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *scriptEngine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

func (e *scriptEngine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" {
		http.NotFound(w, r)
		return
	}
	e.hits.Add(1)
	body, _ := io.ReadAll(r.Body)
	prompt := llmreq.ParseAs(body, false, llmreq.Hint(r)).Runes / 4
	e.lastPrompt.Store(int64(prompt))
	e.mu.Lock()
	hold := e.hold
	e.mu.Unlock()
	if hold != nil && (r.Header.Get("X-Hold") != "" || r.Header.Get("X-Answer") == "") {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	a, ok := answers[r.Header.Get("X-Answer")]
	if !ok {
		a = answers["chat-json"]
	}
	id := fmt.Sprintf("resp_%s_%d", e.name, e.ids.Add(1))
	w.Header().Set("Content-Type", a.ctype)
	w.Header().Set("X-Engine", e.name)
	w.WriteHeader(a.status)
	for i, p := range a.render(e, id, prompt) {
		if i > 0 && r.Header.Get("X-Gate") != "" {
			select {
			case <-e.gate:
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, p)
		w.(http.Flusher).Flush()
	}
}

func (e *scriptEngine) setHold(on bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if on && e.hold == nil {
		e.hold = make(chan struct{})
	}
	if !on && e.hold != nil {
		close(e.hold)
		e.hold = nil
	}
}

// feedbackConfig: llm_feedback in front of a kv_cache_aware reverse_proxy to addrs.
func feedbackConfig(addrs, policy string) string {
	return fmt.Sprintf(`{
	admin `+adminAddr+`
	http_port %d
	https_port `+httpsPort+`
	grace_period 1s
}
localhost:%d {
	@llm llm_prompt
	llm_feedback @llm
	reverse_proxy @llm %s {
		lb_policy kv_cache_aware {
			telemetry off
			%s
		}
		flush_interval -1
	}
}
`, httpPort, httpPort, addrs, policy)
}

// ask posts body with the X-Answer header and returns the whole answer.
func ask(t testing.TB, client *http.Client, path, body, answer string, headers ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, baseURL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Answer", answer)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the answer: %v", path, err)
	}
	return resp, got
}

func upstreamFeedback(addr string) *feedbackState {
	s := currentState()
	if s == nil {
		return nil
	}
	v, ok := s.upstreams.Load(addr)
	if !ok {
		return nil
	}
	return &v.(*upstreamState).feedback
}

// TestFeedbackPassThrough: every format, usage absent, lying or beyond the bounds, an error and
// a page that is no LLM answer reach the client byte for byte, and each is counted as what it
// is.
func TestFeedbackPassThrough(t *testing.T) {
	e := newScriptEngine(t, "e1")
	e.cached.Store(64)
	startCaddy(t, feedbackConfig(e.addr(), ""))
	client := &http.Client{Timeout: 20 * time.Second}
	prompt := chatBody("m", strings.Repeat("a system prompt long enough to match. ", 20), "hello")
	type want struct {
		usage, cached, lies, unreadable, status, ctype int
		respID                                         bool
	}
	for _, tc := range []struct {
		answer string
		path   string
		body   string
		want   want
	}{
		{"chat-json", "/v1/chat/completions", prompt, want{usage: 1, cached: 1}},
		{"chat-sse", "/v1/chat/completions", prompt, want{usage: 1, cached: 1}},
		{"chat-sse-no-usage", "/v1/chat/completions", prompt, want{}},
		{"completions-sse", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("p", 400) + `","stream":true}`, want{usage: 1, cached: 1}},
		{"responses-json", "/v1/responses", `{"model":"m","input":"` + strings.Repeat("r", 300) + `"}`, want{usage: 1, cached: 1, respID: true}},
		{"responses-sse", "/v1/responses", `{"model":"m","input":"` + strings.Repeat("s", 300) + `","stream":true}`, want{usage: 1, cached: 1, respID: true}},
		{"anthropic-json", "/v1/messages", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, want{usage: 1, cached: 1}},
		{"anthropic-sse", "/v1/messages", `{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, want{usage: 1, cached: 1}},
		{"anthropic-sse-delta", "/v1/messages", `{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, want{usage: 1, cached: 1}},
		{"llamacpp-json", "/v1/chat/completions", prompt, want{usage: 1, cached: 1}},
		{"lying", "/v1/chat/completions", prompt, want{lies: 1}},
		{"nan", "/v1/chat/completions", prompt, want{lies: 1}},
		{"huge-final", "/v1/chat/completions", prompt, want{unreadable: 1}},
		{"cut", "/v1/chat/completions", prompt, want{unreadable: 1}},
		{"error", "/v1/chat/completions", prompt, want{status: 1}},
		{"html", "/v1/chat/completions", prompt, want{ctype: 1}},
	} {
		t.Run(tc.answer, func(t *testing.T) {
			fb := upstreamFeedback(e.addr())
			var before [7]uint64
			if fb != nil {
				before = [7]uint64{fb.withUsage.Load(), fb.withCached.Load(), fb.lies.Load(), fb.gaveUp.Load(),
					fb.notRead[notReadStatus].Load(), fb.notRead[notReadType].Load(), fb.respIDs.Load()}
			}
			resp, got := ask(t, client, tc.path, tc.body, tc.answer)
			a := answers[tc.answer]
			if want := strings.Join(a.render(e, "resp_e1_"+fmt.Sprint(e.ids.Load()), int(e.lastPrompt.Load())), ""); !bytes.Equal(got, []byte(want)) {
				t.Fatalf("the client got %d bytes that differ from the %d the engine wrote:\n got %.300q\nwant %.300q", len(got), len(want), got, want)
			}
			if resp.StatusCode != a.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, a.status)
			}
			fb = upstreamFeedback(e.addr())
			// The answer is credited when the handler returns, just after the client has it all.
			waitUntil(t, 5*time.Second, func() bool { return fb.awaiting.Load() == 0 }, "the attempt to settle")
			var after [7]uint64
			cond := func() bool {
				after = [7]uint64{fb.withUsage.Load(), fb.withCached.Load(), fb.lies.Load(), fb.gaveUp.Load(),
					fb.notRead[notReadStatus].Load(), fb.notRead[notReadType].Load(), fb.respIDs.Load()}
				w := tc.want
				respIDs := 0
				if w.respID {
					respIDs = 1
				}
				return after == [7]uint64{before[0] + uint64(w.usage), before[1] + uint64(w.cached), before[2] + uint64(w.lies),
					before[3] + uint64(w.unreadable), before[4] + uint64(w.status), before[5] + uint64(w.ctype), before[6] + uint64(respIDs)}
			}
			deadline := time.Now().Add(10 * time.Second)
			for !cond() && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if !cond() {
				t.Fatalf("counts (usage, cached, lies, unreadable, status, content type, response ids) went from %v to %v; want %+v more", before, after, tc.want)
			}
		})
	}
}

// TestFeedbackStreamNotHeld: each event the engine flushes reaches the client before the engine
// writes the next one (the engine waits for the test, which waits for the client to have it).
func TestFeedbackStreamNotHeld(t *testing.T) {
	e := newScriptEngine(t, "e1")
	startCaddy(t, feedbackConfig(e.addr(), ""))
	for _, answer := range []string{"chat-sse", "responses-sse", "anthropic-sse"} {
		t.Run(answer, func(t *testing.T) {
			body := `{"model":"m","stream":true,"input":"hi there","messages":[{"role":"user","content":"hi there"}]}`
			path := "/v1/chat/completions"
			if answer == "responses-sse" {
				path, body = "/v1/responses", `{"model":"m","stream":true,"input":"hi there"}`
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+path, strings.NewReader(body))
			req.Header.Set("X-Answer", answer)
			req.Header.Set("X-Gate", "1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			parts := answers[answer].render(e, fmt.Sprintf("resp_e1_%d", e.ids.Load()), 0)
			br := bufio.NewReader(resp.Body)
			for i, want := range parts {
				if i > 0 {
					select {
					case e.gate <- struct{}{}: // the engine may write the next event
					case <-ctx.Done():
						t.Fatalf("the engine never asked for event %d", i)
					}
				}
				got := make([]byte, len(want))
				if _, err := io.ReadFull(br, got); err != nil {
					t.Fatalf("event %d did not reach the client before the engine wrote the next: %v", i, err)
				}
				if string(got) != want {
					t.Fatalf("event %d: got %q, want %q", i, got, want)
				}
			}
		})
	}
}

// TestFeedbackClientGoesAway: a client that leaves mid-stream changes nothing but a count; the
// attempt stops counting as waiting for its first token.
func TestFeedbackClientGoesAway(t *testing.T) {
	e := newScriptEngine(t, "e1")
	startCaddy(t, feedbackConfig(e.addr(), ""))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("X-Answer", "chat-sse")
	req.Header.Set("X-Gate", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	first := answers["chat-sse"].parts[0]
	if _, err := io.ReadFull(resp.Body, make([]byte, len(first))); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	fb := upstreamFeedback(e.addr())
	waitUntil(t, 5*time.Second, func() bool { return fb.notRead[notReadCut].Load() == 1 && fb.awaiting.Load() == 0 },
		"the cut answer to be counted and its attempt settled")
	if fb.withUsage.Load() != 0 {
		t.Fatalf("a cut answer was credited")
	}
}

// routingTextOf is the routing text kvroute derives from a chat body.
func routingTextOf(t testing.TB, body string) string {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	return requestFor(r, DefaultMaxBody).Text
}

// TestFeedbackPredictedAndTrim: the router's predicted cached tokens are counted beside what
// the engine reports for the same answers; an answer that reports a prefix the tree claimed as
// not cached makes the tree stop claiming, for that upstream, the other prompts that hung off
// it (the prompt itself stays: the engine just computed it), and shrinks its share.
func TestFeedbackPredictedAndTrim(t *testing.T) {
	e := newScriptEngine(t, "e1")
	startCaddy(t, feedbackConfig(e.addr(), ""))
	client := &http.Client{Timeout: 20 * time.Second}
	sys := strings.Repeat("You are a careful assistant who answers in French. ", 40)
	conv := func(i int) string {
		return chatBody("m", sys, fmt.Sprintf("conversation %d: %s", i, strings.Repeat("tell me more. ", 10)))
	}
	st := currentState()
	fb := func() *feedbackState { return upstreamFeedback(e.addr()) }
	sysTokens := int64(len(routingTextOf(t, chatBody("m", sys))) / 4)

	e.cached.Store(0)
	ask(t, client, "/v1/chat/completions", conv(1), "chat-json")
	e.cached.Store(sysTokens)
	ask(t, client, "/v1/chat/completions", conv(2), "chat-json")
	waitUntil(t, 5*time.Second, func() bool { return fb().credited.Load() == 2 }, "two answers credited")
	pred, rep := fb().predicted.load(), fb().reported.load()
	if pred < float64(sysTokens-kvBlockTokens) || rep != float64(sysTokens) || fb().misses() != 0 {
		t.Fatalf("after a first and a second conversation sharing the system prompt: predicted %.0f, reported %.0f, %d misses; want both about %d, no miss",
			pred, rep, fb().misses(), sysTokens)
	}

	// The engine lost the system prompt (traffic the router did not send filled its cache).
	tr := st.forest.Get("m")
	before := tr.TenantChars(e.addr())
	e.cached.Store(0)
	ask(t, client, "/v1/chat/completions", conv(3), "chat-json")
	waitUntil(t, 5*time.Second, func() bool { return fb().misses() == 1 }, "the miss")
	if fb().unconfirmed.Load() != 0 || fb().trimmed.Load() == 0 {
		t.Fatalf("a miss with no other request in prefill: %d unconfirmed, %d chars trimmed; want it acted on", fb().unconfirmed.Load(), fb().trimmed.Load())
	}
	text3 := routingTextOf(t, conv(3))
	for i := 1; i <= 2; i++ {
		// What it shares with conversation 3 the engine holds again; the rest it lost.
		text := routingTextOf(t, conv(i))
		if m, shared := tr.MatchTenant(text, e.addr()), commonRunes(text, text3); m != shared {
			t.Errorf("conversation %d: the tree claims %d runes of it on the engine, want the %d it shares with the prompt just computed", i, m, shared)
		}
	}
	if m := tr.MatchTenant(text3, e.addr()); m != len([]rune(text3)) {
		t.Errorf("the prompt the engine just computed: the tree claims %d of its %d runes", m, len([]rune(text3)))
	}
	if after := tr.TenantChars(e.addr()); after >= before {
		t.Errorf("the upstream's tree chars went from %d to %d", before, after)
	}
	if sh := fb().shareNow(); sh >= 1 {
		t.Errorf("its share is %v after a miss, want below 1", sh)
	}
}

// TestFeedbackBurstOfNewPrefix: requests sharing a prefix new to the tree, decided before the
// engine computed it, all report about nothing cached: the tree is not corrected by them (the
// prefix they matched was put there by a request still in prefill).
func TestFeedbackBurstOfNewPrefix(t *testing.T) {
	e := newScriptEngine(t, "e1")
	startCaddy(t, feedbackConfig(e.addr(), ""))
	client := &http.Client{Timeout: 20 * time.Second}
	sys := strings.Repeat("A brand new system prompt for a burst of requests. ", 40)
	e.cached.Store(0)
	e.setHold(true)
	const n = 5
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ask(t, client, "/v1/chat/completions", chatBody("m", sys, fmt.Sprintf("burst request %d", i)), "chat-json", "X-Hold", "1")
		}()
		// One at a time into the engine: each decision sees the prefix the ones before put in.
		waitUntil(t, 5*time.Second, func() bool { return e.hits.Load() == int64(i+1) }, "the request to reach the engine")
	}
	e.setHold(false)
	wg.Wait()
	fb := upstreamFeedback(e.addr())
	waitUntil(t, 5*time.Second, func() bool { return fb.misses() == n-1 }, "the burst's misses")
	if fb.misses() != n-1 || fb.unconfirmed.Load() != n-1 || fb.trimmed.Load() != 0 {
		t.Fatalf("burst of %d: %d misses, %d unconfirmed, %d chars trimmed; want %d, %d, 0", n, fb.misses(), fb.unconfirmed.Load(), fb.trimmed.Load(), n-1, n-1)
	}
	tr := currentState().forest.Get("m")
	for i := range n {
		text := routingTextOf(t, chatBody("m", sys, fmt.Sprintf("burst request %d", i)))
		if m := tr.MatchTenant(text, e.addr()); m != len([]rune(text)) {
			t.Errorf("burst request %d: the tree claims %d of its %d runes", i, m, len([]rune(text)))
		}
	}
}

// TestFeedbackPreviousResponseID: a Responses follow-up goes to the engine that stored the
// response it names, even when balance would send it elsewhere; an unknown id routes as any
// request.
func TestFeedbackPreviousResponseID(t *testing.T) {
	e1, e2 := newScriptEngine(t, "e1"), newScriptEngine(t, "e2")
	startCaddy(t, feedbackConfig(e1.addr()+" "+e2.addr(), "balance_abs_threshold 0\n\t\t\tbalance_rel_threshold 1"))
	client := &http.Client{Timeout: 20 * time.Second}
	followUp := func(prev string, i int) string {
		return fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"follow-up %d"}`, prev, i)
	}
	for _, answer := range []string{"responses-json", "responses-sse"} {
		t.Run(answer, func(t *testing.T) {
			resp, body := ask(t, client, "/v1/responses", `{"model":"m","input":"first turn of a conversation"}`, answer)
			home := resp.Header.Get("X-Engine")
			owner := map[string]*scriptEngine{"e1": e1, "e2": e2}[home]
			id := fmt.Sprintf("resp_%s_%d", home, owner.ids.Load())
			if !bytes.Contains(body, []byte(id)) {
				t.Fatalf("answer %q does not carry %s", body, id)
			}
			waitUntil(t, 5*time.Second, func() bool { return upstreamFeedback(owner.addr()).respIDs.Load() > 0 }, "the id bound")
			for i := range 8 {
				r, _ := ask(t, client, "/v1/responses", followUp(id, i), answer)
				if got := r.Header.Get("X-Engine"); got != home {
					t.Fatalf("follow-up %d of %s went to %s", i, id, got)
				}
			}
			// The owner busier than the other: out of the balance band, still the follow-up's.
			owner.setHold(true)
			done := make(chan struct{})
			go func() {
				defer close(done)
				ask(t, client, "/v1/responses", followUp(id, 100), answer, "X-Hold", "1")
			}()
			hits := owner.hits.Load()
			waitUntil(t, 5*time.Second, func() bool { return owner.srv != nil && currentState().upstream(owner.addr()).inFlight.Load() == 1 }, "a request held on the owner")
			r, _ := ask(t, client, "/v1/responses", followUp(id, 101), answer)
			if got := r.Header.Get("X-Engine"); got != home {
				t.Errorf("the follow-up went to %s, not to %s which stored its response (busier by one)", got, home)
			}
			owner.setHold(false)
			<-done
			_ = hits
		})
	}
	// An id no answer gave routes as any request: both engines get some.
	e1h, e2h := e1.hits.Load(), e2.hits.Load()
	for i := range 40 {
		ask(t, client, "/v1/responses", followUp(fmt.Sprintf("resp_unknown_%d", i), i), "responses-json")
	}
	if e1.hits.Load() == e1h || e2.hits.Load() == e2h {
		t.Errorf("follow-ups naming unknown ids all went to one engine (e1 +%d, e2 +%d)", e1.hits.Load()-e1h, e2.hits.Load()-e2h)
	}
}

// TestFeedbackReload: llm_feedback keeps counting across a reload and leaves no goroutine
// behind (startCaddy's leak check).
func TestFeedbackReload(t *testing.T) {
	e := newScriptEngine(t, "e1")
	cfg := feedbackConfig(e.addr(), "")
	startCaddy(t, cfg)
	client := &http.Client{Timeout: 20 * time.Second}
	body := chatBody("m", strings.Repeat("reload me. ", 50), "hi")
	for range 3 {
		ask(t, client, "/v1/chat/completions", body, "chat-sse")
	}
	load(t, strings.Replace(cfg, "telemetry off", "telemetry off\n\t\t\tcache_threshold 0.2", 1))
	for range 3 {
		ask(t, client, "/v1/chat/completions", body, "chat-sse")
	}
	fb := upstreamFeedback(e.addr())
	waitUntil(t, 5*time.Second, func() bool { return fb.credited.Load() == 6 && fb.awaiting.Load() == 0 }, "six answers credited across the reload")
	if fb.withCached.Load() != 6 {
		t.Fatalf("%d of 6 answers reported cached tokens", fb.withCached.Load())
	}
}

func commonRunes(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	n := 0
	for n < len(ra) && n < len(rb) && ra[n] == rb[n] {
		n++
	}
	return n
}

// TestFeedbackShareShrinks: misses one after another shrink what the tree remembers for the
// upstream (its bound, 1.5 × its KV capacity) toward what the engine holds; answers that match
// the prediction let it grow back.
func TestFeedbackShareShrinks(t *testing.T) {
	e := newScriptEngine(t, "e1")
	startCaddy(t, feedbackConfig(e.addr(), fmt.Sprintf("upstream %s {\n\t\t\t\tkv_capacity 100k\n\t\t\t}", e.addr())))
	client := &http.Client{Timeout: 20 * time.Second}
	fb := upstreamFeedback
	full := tenantBound(100_000, DefaultCharsPerToken)
	sys := strings.Repeat("The engine keeps losing this system prompt. ", 30)
	e.cached.Store(0)
	const misses = 4
	for i := range misses + 1 {
		ask(t, client, "/v1/chat/completions", chatBody("m", sys, fmt.Sprintf("turn %d", i)), "chat-json")
		waitUntil(t, 5*time.Second, func() bool { return fb(e.addr()).credited.Load() == uint64(i+1) }, "the answer credited")
		if i == 0 {
			// The first prompt matched nothing: no miss yet.
			if got := getStatus(t).Upstreams[e.addr()].TreeBoundChars; got != full {
				t.Fatalf("tree bound %d before any miss, want %d", got, full)
			}
		}
	}
	if got := fb(e.addr()).corrected.Load(); got != misses {
		t.Fatalf("%d misses corrected, want %d", got, misses)
	}
	want := int64(float64(full) * math.Pow(shrinkFactor, misses))
	got := getStatus(t).Upstreams[e.addr()].TreeBoundChars
	if got != want {
		t.Fatalf("after %d misses the tree bound is %d, want %d (%.2f of %d)", misses, got, want, math.Pow(shrinkFactor, misses), full)
	}
	// The engine holds its prefixes again: the share grows back.
	e.cached.Store(int64(len(routingTextOf(t, chatBody("m", sys))) / 4))
	for i := range 3 {
		n := fb(e.addr()).credited.Load()
		ask(t, client, "/v1/chat/completions", chatBody("m", sys, fmt.Sprintf("good turn %d", i)), "chat-json")
		waitUntil(t, 5*time.Second, func() bool { return fb(e.addr()).credited.Load() == n+1 }, "the answer credited")
	}
	if sh := fb(e.addr()).shareNow(); !(sh > math.Pow(shrinkFactor, misses)) {
		t.Fatalf("the share stayed at %v after answers that matched the prediction", sh)
	}
}

// TestResponseBindingsBounded: a million response ids, or one id bound again and again, keep
// the store within max_sessions; an id rebinds to the engine that answered it last.
func TestResponseBindingsBounded(t *testing.T) {
	s := newState()
	s.responses.configure(1000, time.Hour)
	for i := range 1_000_000 {
		s.bindResponse(fmt.Sprintf("resp_%d", i), "10.0.0.1:8000")
	}
	if n := s.responses.len(); n > 1000 {
		t.Fatalf("%d response bindings held, want at most 1000", n)
	}
	for _, up := range []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.2:8000"} {
		s.bindResponse("resp_reused", up)
	}
	if got, _ := s.responses.get("", s.responseKey("resp_reused"), time.Now()); got != "10.0.0.2:8000" {
		t.Fatalf("a reused id is bound to %q", got)
	}
	if _, ok := s.responses.get("", "resp_reused", time.Now()); ok {
		t.Fatal("the id is kept as it came, not as a keyed digest")
	}
}
