package llmsim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fast is a config that simulates no time at all.
var fast = Config{Name: "w", StepFixed: -1, PrefillPerToken: -1, PerSeq: -1}

// counts returns the requests running and waiting in s's engine.
func counts(s *Server) (running, waiting int) {
	st := s.Stats()
	return st.Running, st.Waiting
}

func startServer(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	s := New(cfg)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts
}

func post(t *testing.T, url string, body any) *http.Response {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

type chatResponse struct {
	Object  string `json:"object"`
	Choices []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage Usage `json:"usage"`
}

func decode[T any](t *testing.T, resp *http.Response) T {
	t.Helper()
	defer resp.Body.Close()
	var v T
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func msg(role, content string) map[string]string {
	return map[string]string{"role": role, "content": content}
}

func TestChatHitsGrowAcrossTurns(t *testing.T) {
	_, ts := startServer(t, fast)
	system := strings.Repeat("You are a helpful assistant who answers briefly. ", 40)
	msgs := []map[string]string{msg("system", system)}
	prevCached, prevPrompt := -1, 0
	for turn := range 5 {
		msgs = append(msgs, msg("user", fmt.Sprintf("question %d: %s", turn, strings.Repeat("why? ", 30))))
		resp := post(t, ts.URL+"/v1/chat/completions", map[string]any{"model": DefaultModel, "messages": msgs, "max_tokens": 20})
		if got := resp.Header.Get(HeaderWorker); got != "w" {
			t.Errorf("worker header = %q", got)
		}
		headerCached, _ := strconv.Atoi(resp.Header.Get(HeaderCachedTokens))
		r := decode[chatResponse](t, resp)
		u := r.Usage
		wantPrompt := Tokens(chatTextOf(msgs))
		if u.PromptTokens != wantPrompt || u.CompletionTokens != 20 || u.TotalTokens != wantPrompt+20 {
			t.Errorf("turn %d: usage %+v, want %d prompt tokens", turn, u, wantPrompt)
		}
		if headerCached != u.PromptTokensDetails.CachedTokens {
			t.Errorf("turn %d: header says %d cached, usage %d", turn, headerCached, u.PromptTokensDetails.CachedTokens)
		}
		cached := u.PromptTokensDetails.CachedTokens
		if turn == 0 && cached != 0 {
			t.Errorf("turn 0: %d cached tokens on a cold cache", cached)
		}
		if turn > 0 && cached <= prevCached {
			t.Errorf("turn %d: cached %d, not more than turn %d's %d", turn, cached, turn-1, prevCached)
		}
		// The previous prompt is cached up to its last full block.
		if turn > 0 && cached < prevPrompt/DefaultBlockTokens*DefaultBlockTokens {
			t.Errorf("turn %d: cached %d of the previous %d-token prompt", turn, cached, prevPrompt)
		}
		if content := r.Choices[0].Message.Content; len(content) != 20*CharsPerToken {
			t.Errorf("reply has %d chars, want %d", len(content), 20*CharsPerToken)
		}
		msgs = append(msgs, msg("assistant", r.Choices[0].Message.Content))
		prevCached, prevPrompt = cached, u.PromptTokens
	}
}

func chatTextOf(msgs []map[string]string) string {
	m := make([]Message, len(msgs))
	for i, x := range msgs {
		m[i] = Message{x["role"], x["content"]}
	}
	return ChatText(m)
}

// TestServerEvictsAtCapacity: the engine's cache holds the running requests' blocks and the
// cached ones in one pool of 8. Each request needs 7 blocks while it runs (97 prompt tokens and
// 1 output token) and leaves its 6 full prompt blocks cached; admitting one evicts the least
// recently released unreferenced blocks, a prompt's tail before its head.
func TestServerEvictsAtCapacity(t *testing.T) {
	cfg := fast
	cfg.CapacityBlocks = 8
	s, ts := startServer(t, cfg)
	a := blocksText("a", 6) + "?"
	b := blocksText("b", 6) + "?"
	cachedOf := func(prompt string) int {
		r := decode[chatResponse](t, post(t, ts.URL+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}))
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	steps := []struct {
		prompt string
		want   int
	}{
		{a, 0},
		{a, 6 * 16},
		{b, 0},  // needs 7 blocks, 2 free: evicts a's last 5
		{a, 16}, // a's head survived; its 6 new blocks evict b's last 5
		{b, 16},
	}
	for i, st := range steps {
		if got := cachedOf(st.prompt); got != st.want {
			t.Errorf("step %d: cached %d, want %d", i, got, st.want)
		}
	}
	if st := s.Stats(); st.CacheBlocks != 7 || st.Evictions != 15 || st.Requests != 5 {
		t.Errorf("stats %+v, want 7 blocks cached, 15 evicted, 5 requests", st)
	}
	s.Reset()
	if got := cachedOf(a); got != 0 {
		t.Errorf("after Reset: cached %d", got)
	}
	// A request that cannot fit in the whole cache is refused, as vLLM refuses a prompt
	// longer than the model's length.
	resp := post(t, ts.URL+"/v1/completions", map[string]any{"prompt": blocksText("c", 8), "max_tokens": 1})
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a request of 9 blocks on a cache of 8: status %d, want 400", resp.StatusCode)
	}
}

func TestQueueWhenSlotsAreFull(t *testing.T) {
	cfg := Config{Name: "q", Slots: 1, PrefillPerToken: -1, StepFixed: 50 * time.Millisecond, PerSeq: -1}
	s, ts := startServer(t, cfg)
	// The first request holds the slot for a second (21 steps of 50 ms), long enough for the
	// second to arrive and be seen waiting on a loaded machine; the second takes 250 ms.
	bodies := []map[string]any{{"prompt": "hello", "max_tokens": 21}, {"prompt": "hello", "max_tokens": 5}}
	var wg sync.WaitGroup
	durations := make([]time.Duration, 2)
	start := time.Now()
	send := func(i int) {
		wg.Go(func() {
			decode[chatResponse](t, post(t, ts.URL+"/v1/completions", bodies[i]))
			durations[i] = time.Since(start)
		})
	}
	waitCounts := func(running, waiting int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
			if r, w := counts(s); r == running && w == waiting {
				return
			}
			if time.Now().After(deadline) {
				r, w := counts(s)
				t.Fatalf("running %d waiting %d, want %d and %d", r, w, running, waiting)
			}
		}
	}
	send(0)
	waitCounts(1, 0) // the second arrives second
	send(1)
	waitCounts(1, 1)
	m := scrape(t, ts.URL)
	if m["vllm:num_requests_waiting"] != 1 || m["vllm:num_requests_running"] != 1 {
		t.Errorf("metrics running=%v waiting=%v, want 1 and 1",
			m["vllm:num_requests_running"], m["vllm:num_requests_waiting"])
	}
	wg.Wait()
	if durations[1] < 1050*time.Millisecond+250*time.Millisecond-10*time.Millisecond {
		t.Errorf("second request done after %v: it did not wait for the first (%v)", durations[1], durations[0])
	}
}

// TestPrefillsShareCompute: prefill is compute-bound: two prompts sent together take the time
// of both, whether the engine computes them in one step (its token budget allows both) or one
// after the other (the second arrives during the first's step and waits for the next one).
func TestPrefillsShareCompute(t *testing.T) {
	// A prefill takes 500 ms, so that the answer stays apart from one prefill's time while a
	// loaded machine delays the requests by up to 400 ms.
	const wantSecond = 1000 * time.Millisecond // the slower of two concurrent 100-token prefills
	cfg := Config{PrefillPerToken: 5 * time.Millisecond, StepFixed: -1, PerSeq: -1}
	_, ts := startServer(t, cfg)
	var wg sync.WaitGroup
	took := make([]time.Duration, 2)
	for i := range 2 {
		wg.Go(func() {
			start := time.Now()
			prompt := strings.Repeat(fmt.Sprint(i), 400) // 100 tokens, nothing shared
			decode[chatResponse](t, post(t, ts.URL+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}))
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	slowest := max(took[0], took[1])
	if slowest < wantSecond-5*time.Millisecond || slowest > wantSecond+400*time.Millisecond {
		t.Errorf("slower request took %v, want about %v", slowest, wantSecond)
	}
}

func TestStreamEventsAreFlushed(t *testing.T) {
	tests := []struct {
		path   string
		object string
	}{
		{"/v1/chat/completions", "chat.completion.chunk"},
		{"/v1/completions", "text_completion"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			cfg := Config{Name: "s", PrefillPerToken: -1, StepFixed: 200 * time.Millisecond, PerSeq: -1, MinEventInterval: -1}
			_, ts := startServer(t, cfg)
			body := map[string]any{"max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true},
				"prompt": "hello there", "messages": []map[string]string{msg("user", "hello there")}}
			start := time.Now()
			resp := post(t, ts.URL+tt.path, body)
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Fatalf("Content-Type = %q", ct)
			}
			sc := bufio.NewScanner(resp.Body)
			var events []string
			var firstAt time.Duration
			for sc.Scan() {
				line := sc.Text()
				if line == "" {
					continue
				}
				data, ok := strings.CutPrefix(line, "data: ")
				if !ok {
					t.Fatalf("unexpected line %q", line)
				}
				if len(events) == 0 {
					firstAt = time.Since(start)
				}
				events = append(events, data)
			}
			// The 3 decode steps after the first token take 600ms: the first event must
			// arrive long before the end, not buffered with the rest. Measured from the end,
			// not from the start, which a loaded machine delays as much as the first event.
			elapsed := time.Since(start)
			if elapsed-firstAt < 300*time.Millisecond {
				t.Errorf("first event after %v, the last after %v", firstAt, elapsed)
			}
			if elapsed < 600*time.Millisecond {
				t.Errorf("stream done after %v, want >= 600ms", elapsed)
			}
			if events[len(events)-1] != "[DONE]" {
				t.Fatalf("last event %q", events[len(events)-1])
			}
			var text strings.Builder
			var usage *Usage
			finishes := 0
			for _, e := range events[:len(events)-1] {
				var c struct {
					Object  string `json:"object"`
					Choices []struct {
						Delta        struct{ Content string } `json:"delta"`
						Text         string                   `json:"text"`
						FinishReason *string                  `json:"finish_reason"`
					} `json:"choices"`
					Usage *Usage `json:"usage"`
				}
				if err := json.Unmarshal([]byte(e), &c); err != nil {
					t.Fatalf("event %q: %v", e, err)
				}
				if c.Object != tt.object {
					t.Errorf("object %q, want %q", c.Object, tt.object)
				}
				if c.Usage != nil {
					usage = c.Usage
					if len(c.Choices) != 0 {
						t.Error("usage chunk has choices")
					}
				}
				for _, ch := range c.Choices {
					text.WriteString(ch.Delta.Content + ch.Text)
					if ch.FinishReason != nil {
						finishes++
					}
				}
			}
			if usage == nil || usage.CompletionTokens != 4 || usage.PromptTokens == 0 {
				t.Errorf("usage %+v", usage)
			}
			if text.Len() != 4*CharsPerToken || finishes != 1 {
				t.Errorf("streamed %q with %d finish reasons", text.String(), finishes)
			}
		})
	}
}

func TestStreamGroupsTokens(t *testing.T) {
	cfg := Config{PrefillPerToken: -1, StepFixed: time.Millisecond, PerSeq: -1, MinEventInterval: 10 * time.Millisecond}
	_, ts := startServer(t, cfg)
	resp := post(t, ts.URL+"/v1/completions", map[string]any{"prompt": "x", "max_tokens": 41, "stream": true})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// 1 first token, then 40 tokens in groups of 10, then [DONE]; no usage asked.
	if n := strings.Count(string(b), "data: "); n != 6 {
		t.Errorf("%d events, want 6:\n%s", n, b)
	}
}

// scrape parses a Prometheus text exposition into metric name -> value (labels dropped),
// failing on any line that is not well formed.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("Content-Type = %q", ct)
	}
	types := map[string]string{}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || (f[1] != "gauge" && f[1] != "counter" && f[1] != "histogram") {
				t.Errorf("bad TYPE line %q", line)
			}
			types[f[0]] = f[1]
			continue
		}
		if strings.HasPrefix(line, "# HELP ") {
			continue
		}
		name, rest, ok := strings.Cut(line, "{")
		labels, value, ok2 := strings.Cut(rest, "} ")
		if !ok { // a sample without labels (process_start_time_seconds)
			name, value, ok2 = strings.Cut(line, " ")
		}
		if !ok2 || strings.Contains(labels, "}") {
			t.Errorf("bad sample line %q", line)
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Errorf("bad value in %q", line)
		}
		if base, part := histogramSample(name); part && types[base] == "histogram" {
			out[name] = v // the last bucket written is +Inf
			continue
		}
		if types[name] == "" {
			t.Errorf("sample %s without TYPE", name)
		}
		if types[name] == "counter" && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s without _total", name)
		}
		out[name] = v
	}
	return out
}

// histogramSample returns the histogram family of a _bucket, _sum or _count sample.
func histogramSample(name string) (string, bool) {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			return base, true
		}
	}
	return "", false
}

func TestMetrics(t *testing.T) {
	_, ts := startServer(t, fast)
	prompt := blocksText("m", 3) + "?"
	for range 2 {
		decode[chatResponse](t, post(t, ts.URL+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 3}))
	}
	m := scrape(t, ts.URL)
	want := map[string]float64{
		"vllm:num_requests_running":       0,
		"vllm:num_requests_waiting":       0,
		"vllm:kv_cache_usage_perc":        0,
		"vllm:prefix_cache_queries_total": 2 * 49,
		"vllm:prefix_cache_hits_total":    48,
		"vllm:generation_tokens_total":    6,
		"kvsim_requests_total":            2,
		"kvsim_cache_blocks":              3,
		"kvsim_cache_capacity_blocks":     DefaultCapacityBlocks,
	}
	for name, v := range want {
		if got, ok := m[name]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, v)
		}
	}
	resp, err := http.Post(ts.URL+"/reset", "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /reset: %v %v", resp, err)
	}
	resp.Body.Close()
	if m := scrape(t, ts.URL); m["vllm:prefix_cache_queries_total"] != 0 || m["kvsim_cache_blocks"] != 0 {
		t.Errorf("after reset: %v", m)
	}
}

func TestEndpoints(t *testing.T) {
	_, ts := startServer(t, fast)
	tests := []struct {
		method, path, body string
		status             int
		contains           string
	}{
		{"GET", "/health", "", 200, ""},
		{"GET", "/v1/models", "", 200, `"id":"` + DefaultModel + `"`},
		{"POST", "/v1/completions", `{"prompt":["a","b"],"max_tokens":2}`, 200, `"object":"text_completion"`},
		{"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_completion_tokens":1}`, 200, `"finish_reason":"length"`},
		{"POST", "/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":"hi"}]}`, 404, "does not exist"},
		{"POST", "/v1/chat/completions", `{"messages":[]}`, 400, "messages"},
		{"POST", "/v1/chat/completions", `{not json`, 400, "invalid JSON"},
		{"POST", "/v1/completions", `{"prompt":""}`, 400, "prompt"},
		{"POST", "/v1/completions", `{"prompt":[1,2,3]}`, 400, "prompt"},
		{"POST", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400, "max_tokens"},
		{"GET", "/v1/chat/completions", "", 405, ""},
		{"GET", "/nope", "", 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path+" "+tt.body, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, ts.URL+tt.path, strings.NewReader(tt.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status || !strings.Contains(string(b), tt.contains) {
				t.Errorf("got %d %s, want %d containing %q", resp.StatusCode, b, tt.status, tt.contains)
			}
			if resp.Header.Get(HeaderWorker) != "w" {
				t.Error("no worker header")
			}
		})
	}
}

func TestConcurrentRequests(t *testing.T) {
	cfg := Config{Name: "c", Slots: 4, CapacityBlocks: 64, PrefillPerToken: time.Microsecond, StepFixed: 100 * time.Microsecond}
	s, ts := startServer(t, cfg)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			body := map[string]any{"prompt": blocksText(fmt.Sprint(i%5), 20) + "?", "max_tokens": 8, "stream": i%2 == 0}
			resp := post(t, ts.URL+"/v1/completions", body)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("status %d", resp.StatusCode)
			}
		})
		if i%10 == 0 {
			wg.Go(func() { scrape(t, ts.URL) })
		}
	}
	wg.Wait()
	st := s.Stats()
	if st.Requests != 40 || st.Running != 0 || st.Waiting != 0 || st.CacheBlocks > 64 {
		t.Errorf("stats %+v", st)
	}
}

func TestClientGoneWhileQueued(t *testing.T) {
	cfg := Config{Slots: 1, PrefillPerToken: -1, StepFixed: 20 * time.Millisecond, PerSeq: -1}
	s, ts := startServer(t, cfg)
	go func() {
		resp := post(t, ts.URL+"/v1/completions", map[string]any{"prompt": "a", "max_tokens": 10})
		resp.Body.Close()
	}()
	for r, _ := counts(s); r == 0; r, _ = counts(s) {
		time.Sleep(time.Millisecond)
	}
	client := &http.Client{Timeout: 30 * time.Millisecond}
	if _, err := client.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"b"}`)); err == nil {
		t.Fatal("expected a timeout")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if r, w := counts(s); r == 0 && w == 0 {
			break
		}
		if time.Now().After(deadline) {
			r, w := counts(s)
			t.Fatalf("requests left in the engine: running %d waiting %d", r, w)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func FuzzParseJob(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`), true)
	f.Add([]byte(`{"prompt":["a","b"]}`), false)
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url"}]}]}`), true)
	f.Add([]byte(`{"prompt":null,"max_completion_tokens":-1}`), false)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		j, err := parseJob(body, chat, 16)
		if err == nil && (j.maxTokens < 1 || (!chat && j.text == "")) {
			t.Errorf("accepted %q as %+v", body, j)
		}
	})
}
