package kvroute

import (
	"bytes"
	"compress/gzip"
	"context"
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

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
)

// sgEngine is a recording SGLang engine on loopback: it keeps each body it gets (numbers as
// json.Number: a room is up to 2^63-1), answers, or holds the request until the client goes
// away (hold), or answers status.
type sgEngine struct {
	srv *httptest.Server

	mu     sync.Mutex
	bodies []map[string]any
	hold   bool
	status int
	// errBody, when set, is the JSON body of a status answer.
	errBody string
	// headFirst: a streamed request gets its 200 and event-stream header at once, as SGLang's
	// streamed /generate sends them, then waits (hold, before) before its first event.
	headFirst bool
	before    chan struct{} // when set, a request waits for it before its answer

	arrived   chan struct{}
	cancelled chan struct{}
}

func newSGEngine(t *testing.T) *sgEngine {
	leakCheck(t)
	e := &sgEngine{arrived: make(chan struct{}, 16), cancelled: make(chan struct{}, 16)}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			http.NotFound(w, r)
			return
		}
		// Read to the end: the server notices a client gone only once the body is consumed.
		raw, _ := io.ReadAll(r.Body)
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var body map[string]any
		if err := dec.Decode(&body); err != nil {
			http.Error(w, "not JSON", http.StatusBadRequest)
			return
		}
		e.mu.Lock()
		e.bodies = append(e.bodies, body)
		hold, status, before, errBody := e.hold, e.status, e.before, e.errBody
		headFirst := e.headFirst && body["stream"] == true
		e.mu.Unlock()
		if headFirst {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
		}
		e.arrived <- struct{}{}
		if before != nil {
			<-before
		}
		if hold {
			<-r.Context().Done()
			e.cancelled <- struct{}{}
			return
		}
		if status != 0 {
			if errBody != "" {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				io.WriteString(w, errBody)
				return
			}
			http.Error(w, `{"error":"engine error"}`, status)
			return
		}
		if body["stream"] == true {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Par\"}}]}\n\n")
			w.(http.Flusher).Flush()
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"Paris."}}]}`)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *sgEngine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

func (e *sgEngine) got() []map[string]any {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]map[string]any(nil), e.bodies...)
}

func (e *sgEngine) set(hold bool, status int) {
	e.mu.Lock()
	e.hold, e.status = hold, status
	e.mu.Unlock()
}

// room returns a body's bootstrap_room, checking it is a whole number in [0, 2^63-1].
func room(t *testing.T, v any) uint64 {
	t.Helper()
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("bootstrap_room %v (%T) is not a number", v, v)
	}
	r, err := strconv.ParseUint(string(n), 10, 63)
	if err != nil {
		t.Fatalf("bootstrap_room %s is not in [0, 2^63-1]: %v", n, err)
	}
	return r
}

// TestDisaggregateSGLangHandshake: the prefill and the decode engine get the same body, the
// client's plus the prefill engine's bootstrap host and port and a fresh room; whatever
// bootstrap or kv_transfer fields the client sent are gone; a batch (n > 1) gets lists.
func TestDisaggregateSGLangHandshake(t *testing.T) {
	p, dec := newSGEngine(t), newSGEngine(t)
	startCaddy(t, pdConfig(p.addr(), dec.addr(), "protocol sglang", ""))
	client := &http.Client{Timeout: 20 * time.Second}
	split := disaggCounts[disaggSplit].Load()

	forged := `,"bootstrap_host":"10.9.9.9","bootstrap_port":1,"bootstrap_room":7,"bootstrap_pair_key":"x","disagg_prefill_dp_rank":3,"kv_transfer_params":{"do_remote_prefill":true}`
	code, got := postPD(t, client, longChat(true, forged))
	if code != http.StatusOK || !strings.Contains(got, `"Par"`) || !strings.Contains(got, "[DONE]") {
		t.Fatalf("streamed request: status %d, answer %q", code, got)
	}
	code, got = postPD(t, client, longChat(false, ""))
	if code != http.StatusOK || !strings.Contains(got, "Paris.") {
		t.Fatalf("request: status %d, answer %q", code, got)
	}
	// This decode engine answers without waiting for the prefill (an SGLang one cannot): the
	// prefill leg may land after the client has its answer.
	waitUntil(t, 10*time.Second, func() bool { return len(p.got()) == 2 }, "the prefill engine got both legs")
	pb, db := p.got(), dec.got()
	if len(pb) != 2 || len(db) != 2 {
		t.Fatalf("prefill got %d requests, decode %d; want 2 and 2", len(pb), len(db))
	}
	rooms := map[uint64]bool{}
	for i := range pb {
		pj, _ := json.Marshal(pb[i])
		dj, _ := json.Marshal(db[i])
		if !bytes.Equal(pj, dj) {
			t.Errorf("request %d: the legs' bodies differ:\nprefill %s\ndecode  %s", i, pj, dj)
		}
		b := db[i]
		if b["bootstrap_host"] != "127.0.0.1" || b["bootstrap_port"] != json.Number("8998") {
			t.Errorf("request %d: bootstrap %v:%v, want the prefill engine's host and the default port 8998", i, b["bootstrap_host"], b["bootstrap_port"])
		}
		r := room(t, b["bootstrap_room"])
		if rooms[r] || r == 7 {
			t.Errorf("request %d: room %d is not fresh", i, r)
		}
		rooms[r] = true
		for _, k := range []string{"kv_transfer_params", "bootstrap_pair_key", "disagg_prefill_dp_rank"} {
			if b[k] != nil {
				t.Errorf("request %d: the client's %s reached the engines: %v", i, k, b[k])
			}
		}
		if b["max_tokens"] != json.Number("50") || b["min_tokens"] != json.Number("2") || b["stream_options"] == nil {
			t.Errorf("request %d lost the client's fields: %v", i, b)
		}
	}
	if db[0]["stream"] != true || db[1]["stream"] != false {
		t.Errorf("stream fields %v, %v: want the client's", db[0]["stream"], db[1]["stream"])
	}
	// Counted when the handler ends, which a client with the whole answer may not wait for.
	waitUntil(t, 10*time.Second, func() bool { return disaggCounts[disaggSplit].Load()-split == 2 }, "split counted twice")

	// A batch: chat n 3 gets lists of 3, three distinct rooms.
	code, _ = postPD(t, client, longChat(false, `,"n":3`))
	if code != http.StatusOK {
		t.Fatalf("n 3: status %d", code)
	}
	waitUntil(t, 10*time.Second, func() bool { return len(p.got()) == 3 }, "the prefill engine got the batch")
	b := dec.got()[2]
	if pj, dj := fmt.Sprint(p.got()[2]), fmt.Sprint(b); pj != dj {
		t.Errorf("n 3: the legs' bodies differ:\nprefill %s\ndecode  %s", pj, dj)
	}
	hosts, _ := b["bootstrap_host"].([]any)
	ports, _ := b["bootstrap_port"].([]any)
	rl, _ := b["bootstrap_room"].([]any)
	if len(hosts) != 3 || len(ports) != 3 || len(rl) != 3 || hosts[2] != "127.0.0.1" || ports[2] != json.Number("8998") {
		t.Fatalf("n 3: bootstrap %v %v %v, want lists of 3", b["bootstrap_host"], b["bootstrap_port"], b["bootstrap_room"])
	}
	if r0, r1, r2 := room(t, rl[0]), room(t, rl[1]), room(t, rl[2]); r0 == r1 || r1 == r2 || r0 == r2 {
		t.Errorf("n 3: rooms %d %d %d not distinct", r0, r1, r2)
	}

	// SGLang's /generate: a text list is a batch; input_ids that are numbers are one prompt.
	for i, tc := range []struct {
		body string
		list int
	}{
		{`{"text":["` + strings.Repeat("a b ", 300) + `","c"],"sampling_params":{"max_new_tokens":4}}`, 2},
		{`{"input_ids":[1,2,3,4],"sampling_params":{"max_new_tokens":4}}`, 0},
	} {
		resp, err := client.Post(baseURL+"/generate", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("generate %d: status %d", i, resp.StatusCode)
		}
		b := dec.got()[3+i]
		if rl, isList := b["bootstrap_room"].([]any); tc.list > 0 && len(rl) != tc.list || tc.list == 0 && isList {
			t.Errorf("generate %d: bootstrap_room %v, want a list of %d (0: a number)", i, b["bootstrap_room"], tc.list)
		}
	}
}

// TestDisaggregateSGLangNotSplitIsAnError: with protocol sglang nothing reaches a decode
// engine unsplit: a prefill pool that cannot be reached, a prefill engine that fails while the
// decode engine waits, a body over max_body, a compressed body, a format SGLang does not split,
// are clean errors, counted.
func TestDisaggregateSGLangNotSplitIsAnError(t *testing.T) {
	p, dec := newSGEngine(t), newSGEngine(t)
	cfg := pdConfig("127.0.0.1:1", dec.addr(), "protocol sglang", "")
	cfg = strings.Replace(cfg, "@llm llm_prompt\n", "@llm llm_prompt {\n\t\tmax_body 8KiB\n\t}\n", 1)
	startCaddy(t, cfg)
	client := &http.Client{Timeout: 20 * time.Second}
	small := `{"model":"m","messages":[{"role":"user","content":"hello"}]}`

	failed, refused := disaggCounts[disaggPrefillFailed].Load(), disaggCounts[disaggRefused].Load()
	if code, got := postPD(t, client, small); code != http.StatusBadGateway {
		t.Errorf("prefill pool down: status %d %q, want 502", code, got)
	}
	if n := disaggCounts[disaggPrefillFailed].Load() - failed; n != 1 {
		t.Errorf("prefill_failed counted %d, want 1", n)
	}

	// The prefill engine answers an error while the decode engine waits for the room: the decode
	// leg is cancelled, the client gets a 502.
	cfg = strings.Replace(cfg, "127.0.0.1:1", p.addr(), 1)
	load(t, cfg)
	p.set(false, http.StatusInternalServerError)
	dec.set(true, 0)
	// The prefill engine fails once the decode leg is on its engine, waiting.
	decodeWaits := make(chan struct{})
	p.mu.Lock()
	p.before = decodeWaits
	p.mu.Unlock()
	go func() {
		<-dec.arrived
		close(decodeWaits)
	}()
	done := make(chan int, 1)
	go func() {
		resp, err := client.Post(baseURL+"/v1/chat/completions", "application/json", strings.NewReader(small))
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	select {
	case <-dec.cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the decode leg was not cancelled when the prefill leg failed")
	}
	if code := <-done; code != http.StatusBadGateway {
		t.Errorf("prefill engine error: status %d, want 502", code)
	}
	if n := disaggCounts[disaggPrefillFailed].Load() - failed; n != 2 {
		t.Errorf("prefill_failed counted %d, want 2", n)
	}
	p.set(false, 0)
	dec.set(false, 0)
	p.mu.Lock()
	p.before = nil
	p.mu.Unlock()
	decoded := len(dec.got())

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, small)
	zw.Close()
	for _, tc := range []struct {
		name, path, body string
		header           http.Header
		want             int
	}{
		{"over max_body", "/v1/chat/completions", longChat(false, ""), nil, http.StatusBadGateway},
		{"gzip body", "/v1/chat/completions", gz.String(), http.Header{"Content-Encoding": {"gzip"}}, http.StatusBadGateway},
		{"responses", "/v1/responses", `{"model":"m","input":"hello"}`, nil, http.StatusNotImplemented},
		{"n with a list of prompts", "/v1/completions", `{"model":"m","prompt":["a","b"],"n":2}`, nil, http.StatusBadRequest},
	} {
		req, _ := http.NewRequest(http.MethodPost, baseURL+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range tc.header {
			req.Header[k] = v
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
	}
	if n := disaggCounts[disaggRefused].Load() - refused; n != 4 {
		t.Errorf("refused counted %d, want 4", n)
	}
	if n := len(dec.got()) - decoded; n != 0 {
		t.Errorf("the decode engine got %d requests that were not split", n)
	}
}

// sglangFleet starts 2 prefill and 2 decode workers of the repo's simulator in SGLang P/D mode,
// each prefill worker with a bootstrap port of its own, and returns them with the Caddyfile
// options naming those ports.
func sglangFleet(t *testing.T, tr *llmsim.Transfers, cfg llmsim.Config) (p, d []*llmsim.Worker, opts string) {
	leakCheck(t)
	start := func(name, role, boot string) *llmsim.Worker {
		c := cfg
		c.Name, c.Role, c.Protocol, c.Transfers, c.BootstrapAddr = name, role, llmsim.ProtocolSGLang, tr, boot
		w, err := llmsim.StartWorker("127.0.0.1:0", c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		return w
	}
	opts = "protocol sglang"
	for i := range 2 {
		port := 19301 + i
		p = append(p, start(fmt.Sprintf("p%d", i), llmsim.RolePrefill, fmt.Sprintf("127.0.0.1:%d", port)))
		opts += fmt.Sprintf("\n\t\tbootstrap_port %s %d", p[i].Addr, port)
		d = append(d, start(fmt.Sprintf("d%d", i), llmsim.RoleDecode, ""))
	}
	return p, d, opts
}

func addrs(ws []*llmsim.Worker) string {
	var s []string
	for _, w := range ws {
		s = append(s, w.Addr)
	}
	return strings.Join(s, " ")
}

// TestDisaggregateSGLangLLMSimFleet: the simulator's decode workers accept only rooms a prefill
// worker of the fleet announced under the bootstrap address the request names, once; every
// request's handshake holds, streamed or not, forged client fields and all. A prefill worker
// killed between requests costs at most the one request whose leg went out on a keep-alive
// connection the kill closed (a clean 502, counted): after that its dial errors move the
// prefill leg (lb_retries) to the other worker, with that worker's bootstrap port, before any
// decode leg.
func TestDisaggregateSGLangLLMSimFleet(t *testing.T) {
	tr := llmsim.NewTransfers()
	p, d, opts := sglangFleet(t, tr, llmsim.Config{Speed: 50, MinEventInterval: -1})
	cfg := strings.ReplaceAll(pdConfig(addrs(p), addrs(d), opts+"\n\t\tlb_retries 2", ""), `"m"`, `"`+llmsim.DefaultModel+`"`)
	startCaddy(t, cfg)
	client := &http.Client{Timeout: 30 * time.Second}
	split, failed := disaggCounts[disaggSplit].Load(), disaggCounts[disaggPrefillFailed].Load()
	const n = 24
	stale := 0
	for i := range n {
		if i == n/2 {
			p[0].Close()
		}
		forged := ""
		if i%3 == 0 {
			forged = `,"bootstrap_host":"127.0.0.1","bootstrap_port":19301,"bootstrap_room":1`
		}
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":4,"stream":%t%s}`,
			llmsim.DefaultModel, fmt.Sprintf("document %d: ", i%4)+strings.Repeat("words to prefill ", 300), i%2 == 0, forged)
		code, got := postPD(t, client, body)
		if code == http.StatusBadGateway && i >= n/2 {
			stale++
			continue
		}
		if code != http.StatusOK || (i%2 == 0 && !strings.Contains(got, "[DONE]")) {
			t.Fatalf("request %d: status %d: %s", i, code, got)
		}
	}
	if stale > 1 {
		t.Errorf("%d requests failed after the kill, want at most 1", stale)
	}
	want := uint64(n - stale)
	waitUntil(t, 10*time.Second, func() bool { return tr.Pending() == 0 }, "no room pending")
	if tr.Refused.Load() != 0 || tr.Taken.Load() != want || tr.Served.Load() != want {
		t.Fatalf("rooms: served %d, taken %d, refused %d; want %d served and taken, none refused",
			tr.Served.Load(), tr.Taken.Load(), tr.Refused.Load(), want)
	}
	// Counted when the handler ends, which a client with the whole answer may not wait for.
	waitUntil(t, 10*time.Second, func() bool {
		return disaggCounts[disaggSplit].Load()-split == want && disaggCounts[disaggPrefillFailed].Load()-failed == uint64(stale)
	}, fmt.Sprintf("split counted %d times, prefill_failed %d", want, stale))
	served := p[0].Stats().Requests + p[1].Stats().Requests
	if served != want || p[0].Stats().Requests == 0 || p[0].Stats().Requests == n {
		t.Errorf("prefill workers served %d and %d, want %d together, both some", p[0].Stats().Requests, p[1].Stats().Requests, want)
	}
}

// TestDisaggregateSGLangDecodeRetry: a decode upstream that cannot be dialled never got the
// room: the decode pool's retry sends the same body, same room, to the next decode engine; the
// prefill engine is not asked again.
func TestDisaggregateSGLangDecodeRetry(t *testing.T) {
	p, dec := newSGEngine(t), newSGEngine(t)
	dead := "127.0.0.1:1"
	// The dead decode upstream is the cheapest: the first decode attempt goes there.
	policy := fmt.Sprintf("upstream %s {\n\t\t\t\tenergy_per_token 10uJ\n\t\t\t}\n\t\t\tupstream %s {\n\t\t\t\tenergy_per_token 500uJ\n\t\t\t}", dead, dec.addr())
	cfg := pdConfig(p.addr(), dead+" "+dec.addr(), "protocol sglang", policy)
	cfg = strings.Replace(cfg, "flush_interval -1", "flush_interval -1\n\t\tlb_retries 2", 1)
	startCaddy(t, cfg)
	client := &http.Client{Timeout: 20 * time.Second}
	if code, got := postPD(t, client, longChat(false, "")); code != http.StatusOK {
		t.Fatalf("status %d, answer %q", code, got)
	}
	waitUntil(t, 10*time.Second, func() bool { return len(p.got()) == 1 }, "the prefill leg")
	pb, db := p.got(), dec.got()
	if len(pb) != 1 || len(db) != 1 {
		t.Fatalf("prefill got %d, decode %d; want 1 and 1", len(pb), len(db))
	}
	if room(t, pb[0]["bootstrap_room"]) != room(t, db[0]["bootstrap_room"]) {
		t.Errorf("the retried decode leg has room %v, the prefill leg %v", db[0]["bootstrap_room"], pb[0]["bootstrap_room"])
	}
	if hs := currentState().upstream(dead).healthStatus(); hs.Failures == 0 && hs.TimesDown == 0 {
		t.Errorf("the dead decode upstream was not tried first (no failure recorded)")
	}
}

// TestDisaggregateSGLangClientGone: a client that goes away while both legs run cancels both:
// the simulator's prefill and decode workers are back to 0 running, no room left pending.
func TestDisaggregateSGLangClientGone(t *testing.T) {
	tr := llmsim.NewTransfers()
	// A prefill of 400 tokens at 50ms/token: 20s, far longer than the test waits.
	p, d, _ := sglangFleet(t, tr, llmsim.Config{Speed: 1, PrefillPerToken: 50 * time.Millisecond})
	cfg := strings.ReplaceAll(pdConfig(p[0].Addr, d[0].Addr, "protocol sglang\n\t\tbootstrap_port "+p[0].Addr+" 19301", ""), `"m"`, `"`+llmsim.DefaultModel+`"`)
	startCaddy(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := postInBackground(ctx, strings.ReplaceAll(longChat(true, ""), `"m"`, `"`+llmsim.DefaultModel+`"`))
	// The decode leg waits for its room's prefill outside its engine (it joins the batch once
	// the KV arrived).
	waitUntil(t, 10*time.Second, func() bool {
		return p[0].Stats().Running == 1 && d[0].Stats().Handling == 1
	}, "the prefill leg running on its engine, the decode leg waiting for its room")
	cancel()
	<-done
	waitUntil(t, 10*time.Second, func() bool {
		return p[0].Stats().Running == 0 && p[0].Stats().Handling == 0 && d[0].Stats().Handling == 0 && tr.Pending() == 0
	}, "both engines back to 0 requests, no room pending")
	if tr.Taken.Load() != 0 {
		t.Errorf("a room was taken after the client went away")
	}
}

func TestDisaggregateSGLangBadConfig(t *testing.T) {
	for _, tc := range []struct{ opts, want string }{
		{"protocol sglang\n\t\tsplit auto", "split auto"},
		{"protocol sglang\n\t\tmin_uncached 10", "min_uncached"},
		{"bootstrap_port 9000", "bootstrap_port is for protocol sglang"},
		{"protocol sglang\n\t\tbootstrap_port 10.0.0.9:8000 9000", "not a prefill upstream"},
		{"protocol sglang\n\t\tbootstrap_port 127.0.0.1:1 port", "not a port"},
		{"protocol sglang\n\t\tbootstrap_port 70000", "not a port"},
	} {
		cfg := pdConfig("127.0.0.1:1", "127.0.0.1:2", tc.opts, "")
		_, _, err := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}.Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
		if err == nil {
			t.Errorf("%q: adapt succeeded, want an error", tc.opts)
			continue
		}
		// The options' lines are 14 and 15 of pdConfig's site.
		if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "Caddyfile:1") {
			t.Errorf("%q: error %q should name %q and the file:line (Caddyfile:1x)", tc.opts, err, tc.want)
		}
	}
	// A valid SGLang block adapts, its ports in the JSON.
	cfg := pdConfig("127.0.0.1:1 127.0.0.1:3", "127.0.0.1:2", "protocol sglang\n\t\tbootstrap_port 9000\n\t\tbootstrap_port http://127.0.0.1:3 9001", "")
	out, _, err := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}.Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"bootstrap_port":9000,"bootstrap_ports":{"127.0.0.1:3":9001}`) {
		t.Errorf("adapted JSON lacks the bootstrap ports: %s", out)
	}
}

// TestDisaggregateSGLangPrefillKilledMidRun: a prefill worker killed with legs in flight fails
// at most those requests, each a clean 502 counted prefill_failed (their decode legs cancelled,
// no room left waiting; a leg whose KV was already taken is served); the other requests, and
// all after, are served.
func TestDisaggregateSGLangPrefillKilledMidRun(t *testing.T) {
	tr := llmsim.NewTransfers()
	// About 1,300 prompt tokens at 1 ms/token: each prefill runs about a second, one at a time.
	p, d, opts := sglangFleet(t, tr, llmsim.Config{Speed: 1, PrefillPerToken: time.Millisecond, StepFixed: -1, PerSeq: -1})
	cfg := strings.ReplaceAll(pdConfig(addrs(p), addrs(d), opts+"\n\t\tlb_retries 2", ""), `"m"`, `"`+llmsim.DefaultModel+`"`)
	startCaddy(t, cfg)
	client := &http.Client{Timeout: 60 * time.Second}
	failed := disaggCounts[disaggPrefillFailed].Load()
	const n = 6
	codes := make(chan int, n)
	for i := range n {
		go func() {
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":2}`,
				llmsim.DefaultModel, fmt.Sprintf("document %d: ", i)+strings.Repeat("words to prefill ", 300))
			resp, err := client.Post(baseURL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				codes <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	waitUntil(t, 20*time.Second, func() bool { return p[0].Stats().Running > 0 }, "a prefill leg on p0")
	p[0].Close()
	ok, bad := 0, 0
	for range n {
		switch c := <-codes; c {
		case http.StatusOK:
			ok++
		case http.StatusBadGateway:
			bad++
		default:
			t.Errorf("a request got status %d: want 200, or 502 for a leg on the killed worker", c)
		}
	}
	// Only legs on the killed worker fail (one whose KV the decode worker had already taken
	// is served by the decode answer): the requests p1 served all succeeded.
	if onP1 := int(p[1].Stats().Requests); bad > n-onP1 {
		t.Errorf("%d requests failed, %d prefill legs served by p1 of %d: want at most %d", bad, onP1, n, n-onP1)
	}
	waitUntil(t, 10*time.Second, func() bool { return disaggCounts[disaggPrefillFailed].Load()-failed == uint64(bad) }, fmt.Sprintf("prefill_failed counted %d times", bad))
	waitUntil(t, 10*time.Second, func() bool {
		return tr.Pending() == 0 && d[0].Stats().Running == 0 && d[1].Stats().Running == 0
	}, "no room pending, the decode workers back to 0 running")
	// After the kill: served by p1 (dial errors on p0 are retried before any decode leg).
	code, got := postPD(t, client, fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"after"}],"max_tokens":2}`, llmsim.DefaultModel))
	if code != http.StatusOK {
		t.Errorf("after the kill: status %d %s", code, got)
	}
	t.Logf("p0 killed mid-run: %d of %d requests failed (502, counted prefill_failed), %d served", bad, n, ok)
}

// TestDisaggregateSGLangEngineRefusal: an engine's 4xx is the client's answer, status and body
// unchanged, not a failed leg. Both engines check the same body, so both refuse a prompt over
// the context length: the client gets the decode engine's answer (the leg whose answer it
// always gets). When only the prefill engine refuses (the decode engine waits for a room no
// prefill will fill), the client gets the prefill engine's answer within about a second and
// the decode leg is cancelled.
func TestDisaggregateSGLangEngineRefusal(t *testing.T) {
	p, dec := newSGEngine(t), newSGEngine(t)
	const pBody = `{"object":"error","message":"prefill: This model's maximum context length is 8192 tokens.","type":"BadRequestError","param":null,"code":400}`
	const dBody = `{"object":"error","message":"decode: This model's maximum context length is 8192 tokens.","type":"BadRequestError","param":null,"code":400}`
	p.mu.Lock()
	p.status, p.errBody = http.StatusBadRequest, pBody
	p.mu.Unlock()
	dec.mu.Lock()
	dec.status, dec.errBody = http.StatusBadRequest, dBody
	dec.mu.Unlock()
	startCaddy(t, pdConfig(p.addr(), dec.addr(), "protocol sglang", ""))
	client := &http.Client{Timeout: 20 * time.Second}
	failed := disaggCounts[disaggPrefillFailed].Load()
	for _, stream := range []bool{false, true} {
		code, got := postPD(t, client, longChat(stream, ""))
		if code != http.StatusBadRequest || got != dBody {
			t.Errorf("both engines refuse (stream %t): status %d, body %q; want 400 and the decode engine's body byte for byte", stream, code, got)
		}
	}

	// Only the prefill engine refuses; the decode engine waits for the room.
	dec.set(true, 0)
	start := time.Now()
	code, got := postPD(t, client, longChat(true, ""))
	took := time.Since(start)
	if code != http.StatusBadRequest || got != pBody {
		t.Errorf("the prefill engine refuses: status %d, body %q; want 400 and its body byte for byte", code, got)
	}
	if took > 10*time.Second {
		t.Errorf("the prefill engine's refusal took %v to reach the client", took)
	}
	select {
	case <-dec.cancelled:
	case <-time.After(10 * time.Second):
		t.Error("the decode leg was not cancelled")
	}
	if n := disaggCounts[disaggPrefillFailed].Load() - failed; n != 0 {
		t.Errorf("prefill_failed counted %d for engine refusals, want 0", n)
	}
}

// TestDisaggregateSGLangPrefillDiesBeforeFirstByte: SGLang's streamed /generate sends its 200
// and event-stream header at once, then waits for the room's KV (until its bootstrap timeout,
// minutes in a real deployment). A prefill engine that dies mid-prefill, while the decode
// engine has sent its header and no byte of body, gives the client the documented 502 at once
// (the gate commits on the decode answer's first body byte, not its header), and cancels the
// decode leg.
func TestDisaggregateSGLangPrefillDiesBeforeFirstByte(t *testing.T) {
	p, dec := newSGEngine(t), newSGEngine(t)
	p.set(true, 0) // mid-prefill until it dies
	dec.mu.Lock()
	dec.headFirst, dec.hold = true, true // header sent, then waiting for the room
	dec.mu.Unlock()
	startCaddy(t, pdConfig(p.addr(), dec.addr(), "protocol sglang", ""))
	failed := disaggCounts[disaggPrefillFailed].Load()
	type result struct {
		code int
		body string
		at   time.Time
	}
	done := make(chan result, 1)
	go func() {
		client := &http.Client{Timeout: 15 * time.Second} // far below SGLang's bootstrap timeout, far above the bound below
		resp, err := client.Post(baseURL+"/v1/chat/completions", "application/json", strings.NewReader(longChat(true, "")))
		if err != nil {
			done <- result{0, err.Error(), time.Now()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- result{resp.StatusCode, string(b), time.Now()}
	}()
	for _, e := range []*sgEngine{p, dec} {
		select {
		case <-e.arrived:
		case <-time.After(10 * time.Second):
			t.Fatal("a leg never arrived")
		}
	}
	killed := time.Now()
	p.srv.CloseClientConnections() // the prefill engine dies: its connection reset mid-request
	res := <-done
	if took := res.at.Sub(killed); res.code != http.StatusBadGateway || took > 5*time.Second {
		t.Errorf("prefill engine died before the decode answer's first byte: status %d after %v (body %q); want 502 within 5s", res.code, took.Round(time.Millisecond), res.body)
	}
	select {
	case <-dec.cancelled:
	case <-time.After(10 * time.Second):
		t.Error("the decode leg was not cancelled")
	}
	if n := disaggCounts[disaggPrefillFailed].Load() - failed; n != 1 {
		t.Errorf("prefill_failed counted %d, want 1", n)
	}
}

// TestDisaggregateSGLangPrefillPoolSheds: when the prefill pool is full and its flow_control
// sheds the prefill leg, the client gets the 429 the policy wrote (status, Retry-After, the
// error body), as it does from a pool without P/D, and no decode leg is sent. Before, the
// prefill leg's error was taken for a failed leg: an empty 503 without Retry-After (issue 40).
func TestDisaggregateSGLangPrefillPoolSheds(t *testing.T) {
	p, dec := newSGEngine(t), newSGEngine(t)
	p.set(true, 0) // the first request holds the prefill engine's one slot
	dec.set(true, 0)
	startCaddy(t, fmt.Sprintf(`{
	admin `+adminAddr+`
	http_port %d
	https_port `+httpsPort+`
	grace_period 1s
}
localhost:%d {
	@llm llm_prompt
	llm_feedback @llm
	llm_disaggregate @llm %s {
		protocol sglang
		bootstrap_port 19311
		lb_policy kv_cache_aware {
			telemetry off
			flow_control {
				band interactive {
					queue_timeout 200ms
				}
			}
			upstream %s {
				max_concurrency 1
			}
		}
	}
	reverse_proxy @llm %s {
		lb_policy kv_cache_aware {
			telemetry off
		}
		flush_interval -1
	}
}
`, httpPort, httpPort, p.addr(), p.addr(), dec.addr()))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := postInBackground(ctx, longChat(true, ""))
	select {
	case <-p.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request's prefill leg never arrived")
	}
	select {
	case <-dec.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request's decode leg never arrived")
	}
	client := &http.Client{Timeout: 20 * time.Second}
	failed, shed := disaggCounts[disaggPrefillFailed].Load(), disaggCounts[disaggShed].Load()
	for _, stream := range []bool{false, true} {
		req, _ := http.NewRequest(http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader(longChat(stream, "")))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var body struct {
			Error struct{ Type, Message string }
		}
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
			json.Unmarshal(got, &body) != nil || body.Error.Type != "rate_limit_exceeded" || body.Error.Message == "" {
			t.Errorf("stream %t, the prefill pool full: status %d, Retry-After %q, body %q; want the policy's 429 with Retry-After and its error body",
				stream, resp.StatusCode, resp.Header.Get("Retry-After"), got)
		}
	}
	if n := len(dec.got()); n != 1 {
		t.Errorf("the decode engine got %d requests, want the first one's only", n)
	}
	if n := disaggCounts[disaggPrefillFailed].Load() - failed; n != 0 {
		t.Errorf("prefill_failed counted %d for requests the prefill pool shed, want 0", n)
	}
	if n := disaggCounts[disaggShed].Load() - shed; n != 2 {
		t.Errorf("shed counted %d, want 2", n)
	}
	cancel()
	<-first
}

// TestDisaggregateSGLangDecodePoolSheds: when the decode pool is full and its flow_control
// sheds the decode leg, the client gets that 429 as soon as it is written, and the prefill leg
// is cancelled (an SGLang prefill engine aborts the room). Before, the 429 was held as a decode
// engine's error answer is, waiting for the prefill leg to end (decodeErrorHold, 1 s; here a
// minute, so that a held answer shows as one that never comes): a prefill engine waiting for
// its room's decode never ends first.
func TestDisaggregateSGLangDecodePoolSheds(t *testing.T) {
	old := decodeErrorHold
	decodeErrorHold = time.Minute
	t.Cleanup(func() { decodeErrorHold = old })
	tr := llmsim.NewTransfers()
	p, d, opts := sglangFleet(t, tr, llmsim.Config{Speed: 1, StepFixed: 20 * time.Millisecond, PerSeq: -1,
		PrefillPerToken: time.Microsecond, MinEventInterval: -1})
	startCaddy(t, strings.Replace(pdAdmitConfig(addrs(p), d[0].Addr, ""), "split always", opts, 1))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	firstDone := make(chan struct{})
	go func() {
		defer close(firstDone)
		postAdmit(t, ctx, admitChat(0, 300), "")
	}()
	waitUntil(t, 5*time.Second, func() bool { return tr.Taken.Load() == 1 }, "the first request's decode leg took its room")
	shed := disaggCounts[disaggShed].Load()
	client := &http.Client{Timeout: 20 * time.Second}
	for i := 1; i <= 2; i++ {
		req, _ := http.NewRequest(http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader(admitChat(i, 4)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d with the decode pool full: %v; want its 429 at once", i, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(got), "rate_limit_exceeded") {
			t.Errorf("request %d with the decode pool full: status %d, Retry-After %q, body %q; want the policy's 429", i, resp.StatusCode, resp.Header.Get("Retry-After"), got)
		}
	}
	// Counted once the prefill leg ended, after the client has its answer.
	waitUntil(t, 5*time.Second, func() bool { return disaggCounts[disaggShed].Load()-shed == 2 }, "both requests counted shed")
	waitUntil(t, 5*time.Second, func() bool { return tr.Pending() == 0 }, "the shed requests' rooms abandoned (their prefill legs cancelled)")
	cancel()
	<-firstDone
}
