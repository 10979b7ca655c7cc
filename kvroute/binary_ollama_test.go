package kvroute

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/ollamafleet"
)

// ollamaRecorder stands between Caddy and one Ollama instance and keeps the bytes of each
// answer as the engine sent them (by the request's X-Test-Request), so that the test compares
// them with what Caddy delivered.
type ollamaRecorder struct {
	srv   *httptest.Server
	proxy *httputil.ReverseProxy
	mu    sync.Mutex
	sent  map[string][]byte
}

func newOllamaRecorder(t *testing.T, addr string) *ollamaRecorder {
	rc := &ollamaRecorder{sent: map[string][]byte{}}
	target := &url.URL{Scheme: "http", Host: addr}
	rc.proxy = &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		FlushInterval: -1,
	}
	rc.srv = httptest.NewServer(rc)
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *ollamaRecorder) addr() string { return strings.TrimPrefix(rc.srv.URL, "http://") }

func (rc *ollamaRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rw := &recordingWriter{ResponseWriter: w}
	rc.proxy.ServeHTTP(rw, r)
	if id := r.Header.Get("X-Test-Request"); id != "" {
		rc.mu.Lock()
		rc.sent[id] = rw.buf.Bytes()
		rc.mu.Unlock()
	}
}

func (rc *ollamaRecorder) answer(id string) ([]byte, bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	b, ok := rc.sent[id]
	return b, ok
}

type recordingWriter struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	return w.ResponseWriter.Write(p)
}

func (w *recordingWriter) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ollamaText is text of words from the tiny model's vocabulary, drawn from seed.
func ollamaText(seed uint64, words int) string {
	rng := rand.New(rand.NewPCG(seed, 7))
	var sb strings.Builder
	for i := range words {
		if i > 0 {
			sb.WriteByte(' ')
		}
		for range 2 + rng.IntN(6) {
			sb.WriteByte(byte('a' + rng.IntN(26)))
		}
	}
	return sb.String()
}

// ollamaTurn is one streamed /api/chat answer as the client got it.
type ollamaTurn struct {
	id       string
	status   int
	upstream string
	format   string
	ttft     time.Duration // to the first line with content
	elapsed  time.Duration
	body     []byte
	content  string // the answer's text
	done     bool   // the final line ("done":true) arrived
	err      error
}

var ollamaRequestID atomic.Int64

// ollamaChat posts a streamed /api/chat of msgs (role, content pairs) and reads the answer.
func ollamaChat(ctx context.Context, client *http.Client, base string, msgs []string) (tr ollamaTurn) {
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	req := struct {
		Model    string         `json:"model"`
		Messages []message      `json:"messages"`
		Options  map[string]int `json:"options"`
	}{Model: "tiny", Options: map[string]int{"num_predict": 4}}
	for i := 0; i+1 < len(msgs); i += 2 {
		req.Messages = append(req.Messages, message{msgs[i], msgs[i+1]})
	}
	body, _ := json.Marshal(req)
	tr.id = strconv.FormatInt(ollamaRequestID.Add(1), 10)
	hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/chat", bytes.NewReader(body))
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("X-Test-Request", tr.id)
	t0 := time.Now()
	defer func() { tr.elapsed = time.Since(t0) }()
	resp, err := client.Do(hr)
	if err != nil {
		tr.err = err
		return tr
	}
	defer resp.Body.Close()
	tr.status, tr.upstream, tr.format = resp.StatusCode, resp.Header.Get("X-Upstream"), resp.Header.Get("X-LLM-Format")
	var all bytes.Buffer
	rd := bufio.NewReader(io.TeeReader(resp.Body, &all))
	for {
		line, err := rd.ReadBytes('\n')
		if len(line) > 0 {
			var l struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
				Done bool `json:"done"`
			}
			if json.Unmarshal(line, &l) == nil {
				if l.Message.Content != "" && tr.ttft == 0 {
					tr.ttft = time.Since(t0)
				}
				tr.content += l.Message.Content
				tr.done = tr.done || l.Done
			}
		}
		if err != nil {
			if err != io.EOF {
				tr.err = err
			}
			break
		}
	}
	tr.body = all.Bytes()
	return tr
}

func (tr ollamaTurn) ok() bool { return tr.err == nil && tr.status == http.StatusOK && tr.done }

func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestBinaryOllama runs the built Caddy in front of two real Ollama instances serving the tiny
// model (examples/ollama), each behind a recorder that keeps what it sent: conversations stay
// on their instance, a repeated turn's first token comes in a fraction of a cold one's (the
// engine's own prefix cache), Caddy delivers the engine's stream byte for byte, Ollama's API is
// routed as what it is, kvroute learns prefill speed from its answers and says once that it
// serves no metrics, and an instance killed mid-run costs no client more than the retry budget.
// Skipped without KVROUTE_OLLAMA_BIN (.ci/run sets it).
func TestBinaryOllama(t *testing.T) {
	bin, model, ok := ollamafleet.Binary()
	if !ok {
		t.Skip("KVROUTE_OLLAMA_BIN not set (.ci/run builds Ollama from examples/ollama and sets it)")
	}
	caddyBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	fleet, err := ollamafleet.Start(ctx, ollamafleet.Config{Bin: bin, Model: model, Parallel: 4}, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	recs := []*ollamaRecorder{newOllamaRecorder(t, fleet.Addrs[0]), newOllamaRecorder(t, fleet.Addrs[1])}
	addrs := recs[0].addr() + " " + recs[1].addr()
	const tryDuration = 5 * time.Second
	adminPort, httpPort := freePort(t), freePort(t)
	// Caddy's log is read once it stopped (this cleanup runs after startBinary's): one warning
	// per instance that /metrics is missing, not one per scrape.
	var c *binCaddy
	t.Cleanup(func() {
		if n := strings.Count(c.out.String(), "engine serves no metrics (404)"); n == 0 || n > len(recs) {
			t.Errorf("the no-metrics warning logged %d times for %d instances, want once each at most and at least once", n, len(recs))
		}
	})
	c = startBinary(t, fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
}
:%d {
	@llm llm_prompt
	llm_feedback @llm
	reverse_proxy @llm %s {
		lb_policy kv_cache_aware
		lb_try_duration %s
		fail_duration 30s
		flush_interval -1
		header_down X-Upstream {http.reverse_proxy.upstream.hostport}
		header_down X-LLM-Format {http.vars.llm.format}
	}
	reverse_proxy %s
}
`, adminPort, httpPort, httpPort, addrs, tryDuration, addrs), adminPort)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	client := &http.Client{Timeout: 3 * time.Minute}

	// Five conversations of three turns, taken in turn: each with its own long system prompt.
	// An odd count, so that a policy blind to prefixes (round_robin) moves them between turns.
	const convs, turns = 5, 3
	msgs := make([][]string, convs)
	home := make([]string, convs)
	var cold, warm []time.Duration
	check := func(tr ollamaTurn) {
		t.Helper()
		if !tr.ok() {
			t.Fatalf("request %s: status %d, done %v, %v: %s", tr.id, tr.status, tr.done, tr.err, tr.body)
		}
		if tr.format != "ollama_chat" {
			t.Errorf("request %s routed as %q, want ollama_chat", tr.id, tr.format)
		}
		var sent []byte
		for _, rc := range recs {
			if tr.upstream == rc.addr() {
				sent, _ = rc.answer(tr.id)
			}
		}
		if !bytes.Equal(sent, tr.body) {
			t.Fatalf("request %s: Caddy delivered %d bytes, the engine at %s sent %d:\n%q\n%q", tr.id, len(tr.body), tr.upstream, len(sent), tr.body, sent)
		}
	}
	for turn := range turns {
		for i := range convs {
			if turn == 0 {
				msgs[i] = []string{"system", ollamaText(uint64(i+1), 600)}
			}
			msgs[i] = append(msgs[i], "user", ollamaText(uint64(100*i+turn), 12))
			tr := ollamaChat(ctx, client, base, msgs[i])
			check(tr)
			msgs[i] = append(msgs[i], "assistant", tr.content)
			if turn == 0 {
				home[i] = tr.upstream
				cold = append(cold, tr.ttft)
				continue
			}
			warm = append(warm, tr.ttft)
			if tr.upstream != home[i] {
				t.Errorf("conversation %d, turn %d went to %s, its home is %s", i, turn+1, tr.upstream, home[i])
			}
		}
	}
	ratio := float64(medianDuration(warm)) / float64(medianDuration(cold))
	t.Logf("TTFT through Caddy: cold turns %v (median %v), later turns %v (median %v): ratio %.2f; homes %v",
		cold, medianDuration(cold), warm, medianDuration(warm), ratio, home)
	if ratio > 0.7 {
		t.Errorf("a later turn's TTFT is %.2f of a cold one's (medians %v and %v), want < 0.7", ratio, medianDuration(warm), medianDuration(cold))
	}

	// Ollama's other endpoints are routed as what they are. The three generate requests are
	// cold too: with the five first turns, one instance has answered at least 4 cold prompts,
	// more than the 3 samples a learned prefill speed needs.
	for _, tc := range []struct{ path, body, format string }{
		{"/api/generate", `{"model":"tiny","system":"` + ollamaText(9, 60) + `","prompt":"hello there","options":{"num_predict":2}}`, "ollama_generate"},
		{"/api/generate", `{"model":"tiny","system":"` + ollamaText(10, 60) + `","prompt":"hello there","stream":false}`, "ollama_generate"},
		{"/api/generate", `{"model":"tiny","system":"` + ollamaText(11, 60) + `","prompt":"hello there","options":{"num_predict":2}}`, "ollama_generate"},
		{"/v1/chat/completions", `{"model":"tiny","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"hello there"}]}`, "openai_chat"},
	} {
		resp, err := client.Post(base+tc.path, "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-LLM-Format") != tc.format {
			t.Errorf("POST %s: %s, routed as %q (want %s): %s", tc.path, resp.Status, resp.Header.Get("X-LLM-Format"), tc.format, b)
		}
	}

	// What kvroute learned: answers read with their usage, a prefill speed from the cold
	// turns, the model from /v1/models.
	code, raw := c.adminDo(http.MethodGet, "/kvroute/", "", nil)
	if code != http.StatusOK {
		t.Fatalf("GET /kvroute/: %d %s", code, raw)
	}
	var st Status
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	learned := 0
	for _, rc := range recs {
		u, ok := st.Upstreams[rc.addr()]
		if !ok || u.Feedback == nil || !u.Feedback.ReportsUsage || u.Feedback.ReportsCached {
			t.Errorf("GET /kvroute/ upstream %s: %+v; want answers read with usage, without cached tokens", rc.addr(), u.Feedback)
		}
		if u.Learned != nil && u.Learned.PrefillFromAnswers > 0 {
			learned++
		}
		t.Logf("upstream %s: feedback %+v, learned %+v, models %+v", rc.addr(), u.Feedback, u.Learned, u.Models)
	}
	if learned == 0 {
		t.Errorf("no prefill speed learned from %d cold answers", convs)
	}

	// Three clients start new conversations; one instance dies under them. A request in flight
	// there may fail (its stream is cut); every later one goes to the live instance within the
	// retry budget.
	const clients, perClient = 3, 6
	killAt := make(chan struct{})
	var killed time.Time
	var wg sync.WaitGroup
	results := make([][]ollamaTurn, clients)
	starts := make([][]time.Time, clients)
	var before atomic.Int64
	for k := range clients {
		wg.Go(func() {
			for j := range perClient {
				if j == 2 {
					if before.Add(1) == clients {
						close(killAt)
					}
					<-killAt
					time.Sleep(time.Duration(k) * 50 * time.Millisecond)
				}
				starts[k] = append(starts[k], time.Now())
				results[k] = append(results[k], ollamaChat(ctx, client, base,
					[]string{"system", ollamaText(uint64(1000+10*k+j), 150), "user", "go on"}))
			}
		})
	}
	<-killAt
	victim := 1
	if strings.Count(strings.Join(home, " "), recs[0].addr()) > strings.Count(strings.Join(home, " "), recs[1].addr()) {
		victim = 0 // the busier one
	}
	// As a crash: the port refuses at once and open connections break (the recorder first,
	// else it would answer 502 for the dead engine), then the engine dies.
	recs[victim].srv.Listener.Close()
	recs[victim].srv.CloseClientConnections()
	fleet.Kill(victim)
	killed = time.Now()
	wg.Wait()
	var worstBefore time.Duration
	for k := range clients {
		for j, tr := range results[k] {
			if starts[k][j].Before(killed) && tr.ok() {
				worstBefore = max(worstBefore, tr.elapsed)
			}
		}
	}
	for k := range clients {
		failed := 0
		for j, tr := range results[k] {
			switch {
			case !tr.ok() && starts[k][j].Before(killed):
				failed++ // in flight at the kill
			case !tr.ok():
				t.Errorf("client %d, request %d after the kill: status %d, done %v, %v", k, j, tr.status, tr.done, tr.err)
			case starts[k][j].After(killed) && tr.elapsed > tryDuration+2*worstBefore:
				t.Errorf("client %d, request %d after the kill took %v: more than the retry budget %v over the slowest before it (%v)", k, j, tr.elapsed, tryDuration, worstBefore)
			}
			if tr.ok() && starts[k][j].After(killed) && tr.upstream != recs[1-victim].addr() {
				t.Errorf("client %d, request %d after the kill answered by %s", k, j, tr.upstream)
			}
		}
		if failed > 1 {
			t.Errorf("client %d: %d requests failed at the kill, want at most the one in flight", k, failed)
		}
		t.Logf("client %d: %d failed at the kill; latencies %v", k, failed, func() (ds []time.Duration) {
			for _, tr := range results[k] {
				ds = append(ds, tr.elapsed.Round(time.Millisecond))
			}
			return ds
		}())
	}
}
