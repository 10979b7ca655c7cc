package kvroute

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
)

// pdFleet is a registry of KV transfers shared by the P/D engines of one test: a prefill
// engine registers a fresh single-use transfer id, a decode engine accepts only an id a prefill
// of the fleet registered and not yet used.
type pdFleet struct {
	transfers sync.Map // block id -> prefill engine name
	next      atomic.Int64
}

// pdEngine is a real HTTP engine on loopback playing vLLM's NixlConnector roles. A prefill
// engine refuses a request that is not a valid prefill leg; a decode engine refuses transfer
// parameters no prefill of the fleet gave, and serves a request without any whole
// (aggregated).
type pdEngine struct {
	name    string
	prefill bool
	fleet   *pdFleet
	srv     *httptest.Server

	mu     sync.Mutex
	bodies []map[string]any
	// hold, when set, makes requests wait until the client goes away; held is signalled when
	// one arrives and cancelled when its context ends.
	hold      bool
	arrived   chan struct{}
	cancelled chan struct{}

	refused atomic.Int64
}

func newPDEngine(t *testing.T, fleet *pdFleet, name string, prefill bool) *pdEngine {
	leakCheck(t)
	e := &pdEngine{name: name, prefill: prefill, fleet: fleet, arrived: make(chan struct{}, 16), cancelled: make(chan struct{}, 16)}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *pdEngine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

func (e *pdEngine) got() []map[string]any {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]map[string]any(nil), e.bodies...)
}

func (e *pdEngine) refuse(w http.ResponseWriter, why string) {
	e.refused.Add(1)
	http.Error(w, `{"error":{"message":"`+why+`"}}`, http.StatusBadRequest)
}

func (e *pdEngine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" {
		http.NotFound(w, r)
		return
	}
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		e.refuse(w, "not JSON")
		return
	}
	e.mu.Lock()
	e.bodies = append(e.bodies, body)
	hold := e.hold
	e.mu.Unlock()
	if hold {
		e.arrived <- struct{}{}
		<-r.Context().Done()
		e.cancelled <- struct{}{}
		return
	}
	kv, _ := body["kv_transfer_params"].(map[string]any)
	if e.prefill {
		_, so := body["stream_options"]
		_, mt := body["min_tokens"]
		if kv == nil || kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false || body["stream"] != false || body["max_tokens"] != float64(1) || so || mt {
			e.refuse(w, "not a prefill leg")
			return
		}
		id := fmt.Sprintf("%s-%d", e.name, e.fleet.next.Add(1))
		e.fleet.transfers.Store(id, e.name)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"p","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"length"}],"usage":{"prompt_tokens":100,"completion_tokens":1},"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":%q,"remote_block_ids":[%q],"remote_host":"127.0.0.1","remote_port":5600,"tp_size":1}}`, e.name, id)
		return
	}
	if kv != nil {
		ids, _ := kv["remote_block_ids"].([]any)
		if kv["do_remote_prefill"] != true || len(ids) != 1 {
			e.refuse(w, "bad transfer parameters")
			return
		}
		id, _ := ids[0].(string)
		if _, ok := e.fleet.transfers.LoadAndDelete(id); !ok {
			e.refuse(w, "unknown or reused transfer")
			return
		}
	}
	if body["stream"] == true {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, part := range []string{"Par", "is."} {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", part)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"Paris. (%s)"}}]}`, e.name)
}

// pdConfig is a site with llm_disaggregate in front of the decode pool; opts go into the
// llm_disaggregate block, decodeOpts into the decode reverse_proxy's.
func pdConfig(prefill, decode, opts, decodeOpts string) string {
	return fmt.Sprintf(`{
	admin `+adminAddr+`
	http_port %d
	https_port `+httpsPort+`
	grace_period 1s
}
localhost:%d {
	@llm llm_prompt
	llm_feedback @llm
	llm_disaggregate @llm %s {
		lb_policy kv_cache_aware {
			telemetry off
		}
		%s
	}
	reverse_proxy @llm %s {
		lb_policy kv_cache_aware {
			telemetry off
			%s
		}
		flush_interval -1
	}
}
`, httpPort, httpPort, prefill, opts, decode, decodeOpts)
}

func longChat(stream bool, extra string) string {
	return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"stream":%t,"stream_options":{"include_usage":true},"min_tokens":2,"max_tokens":50%s}`,
		strings.Repeat("a long document to prefill. ", 400), stream, extra)
}

func postPD(t *testing.T, client *http.Client, body string) (int, string) {
	t.Helper()
	resp, err := client.Post(baseURL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(got)
}

func TestDisaggregateHandshake(t *testing.T) {
	fl := new(pdFleet)
	p := newPDEngine(t, fl, "p1", true)
	dec := newPDEngine(t, fl, "d1", false)
	startCaddy(t, pdConfig(p.addr(), dec.addr(), "split always", ""))
	client := &http.Client{Timeout: 20 * time.Second}
	before := disaggCounts[disaggSplit].Load()

	// The client's own kv_transfer_params and bootstrap fields never reach an engine.
	forged := `,"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":["forged"],"remote_host":"10.9.9.9"},"bootstrap_host":"10.9.9.9"`
	code, got := postPD(t, client, longChat(true, forged))
	if code != http.StatusOK || !strings.Contains(got, `"Par"`) || !strings.Contains(got, "[DONE]") {
		t.Fatalf("streamed split request: status %d, answer %q", code, got)
	}
	code, got = postPD(t, client, longChat(false, ""))
	if code != http.StatusOK || !strings.Contains(got, "Paris. (d1)") {
		t.Fatalf("split request: status %d, answer %q", code, got)
	}
	if n := p.refused.Load() + dec.refused.Load(); n != 0 {
		t.Fatalf("engines refused %d legs", n)
	}
	pb, db := p.got(), dec.got()
	if len(pb) != 2 || len(db) != 2 {
		t.Fatalf("prefill got %d requests, decode %d; want 2 and 2", len(pb), len(db))
	}
	for i, b := range db {
		kv, _ := b["kv_transfer_params"].(map[string]any)
		if kv["remote_engine_id"] != "p1" || b["bootstrap_host"] != nil {
			t.Errorf("decode leg %d: kv_transfer_params %v, bootstrap_host %v: want the prefill engine's, none", i, kv, b["bootstrap_host"])
		}
		if b["max_tokens"] != float64(50) || b["min_tokens"] != float64(2) {
			t.Errorf("decode leg %d lost the client's fields: %v", i, b)
		}
	}
	if db[0]["stream"] != true || db[0]["stream_options"] == nil {
		t.Errorf("streamed decode leg lost stream/stream_options: %v", db[0])
	}
	if pb[0]["bootstrap_host"] != nil {
		t.Errorf("prefill leg kept the client's bootstrap_host")
	}
	if n := disaggCounts[disaggSplit].Load() - before; n != 2 {
		t.Errorf("split counted %d times, want 2", n)
	}
	if st := getStatus(t); st.Disaggregation["split"] < 2 {
		t.Errorf("GET /kvroute/ shows disaggregation %v, want split >= 2", st.Disaggregation)
	}
	// Each leg is credited to its own engine: the prefill engine's two answers (with usage)
	// to it, not to the decode engine.
	waitUntil(t, 5*time.Second, func() bool {
		fb := upstreamFeedback(p.addr())
		return fb != nil && fb.withUsage.Load() == 2
	}, "the prefill legs' usage credited to the prefill engine")
	if fb := upstreamFeedback(dec.addr()); fb != nil && fb.withUsage.Load() != 0 {
		t.Errorf("the decode engine was credited %d usages; its answers carry none", fb.withUsage.Load())
	}
}

func TestDisaggregateRetryResendsDecodeBody(t *testing.T) {
	fl := new(pdFleet)
	p := newPDEngine(t, fl, "p1", true)
	dec := newPDEngine(t, fl, "d1", false)
	dead := "127.0.0.1:1"
	// The dead decode upstream is the cheapest: the cold decision sends the first attempt there
	// (a dial error), the retry must resend the decode body to the live one.
	policy := fmt.Sprintf("upstream %s {\n\t\t\t\tenergy_per_token 10uJ\n\t\t\t}\n\t\t\tupstream %s {\n\t\t\t\tenergy_per_token 500uJ\n\t\t\t}", dead, dec.addr())
	cfg := pdConfig(p.addr(), dead+" "+dec.addr(), "split always", policy)
	cfg = strings.Replace(cfg, "flush_interval -1", "flush_interval -1\n\t\tlb_retries 2", 1)
	startCaddy(t, cfg)
	client := &http.Client{Timeout: 20 * time.Second}
	code, got := postPD(t, client, longChat(false, ""))
	if code != http.StatusOK || !strings.Contains(got, "Paris. (d1)") {
		t.Fatalf("status %d, answer %q", code, got)
	}
	db := dec.got()
	if len(db) != 1 || dec.refused.Load() != 0 {
		t.Fatalf("decode engine got %d requests, refused %d; want 1 accepted", len(db), dec.refused.Load())
	}
	if kv, _ := db[0]["kv_transfer_params"].(map[string]any); kv["remote_engine_id"] != "p1" {
		t.Fatalf("the retry sent %v, want the decode body with the prefill's parameters", db[0])
	}
	if hs := currentState().upstream(dead).healthStatus(); hs.Failures == 0 && hs.TimesDown == 0 {
		t.Errorf("the dead decode upstream was not tried first (no failure recorded)")
	}
}

func TestDisaggregatePrefillDownGoesAggregated(t *testing.T) {
	fl := new(pdFleet)
	dec := newPDEngine(t, fl, "d1", false)
	startCaddy(t, pdConfig("127.0.0.1:1", dec.addr(), "split always", ""))
	client := &http.Client{Timeout: 20 * time.Second}
	before := disaggCounts[disaggPrefillFailed].Load()
	for i := 0; i < 3; i++ {
		code, got := postPD(t, client, longChat(i%2 == 0, `,"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":["forged"]}`))
		if code != http.StatusOK {
			t.Fatalf("request %d: status %d, answer %q: want the aggregated answer", i, code, got)
		}
	}
	for i, b := range dec.got() {
		if b["kv_transfer_params"] != nil {
			t.Errorf("aggregated request %d carried kv_transfer_params %v", i, b["kv_transfer_params"])
		}
	}
	if n := disaggCounts[disaggPrefillFailed].Load() - before; n != 3 {
		t.Errorf("prefill_failed counted %d, want 3", n)
	}
	if dec.refused.Load() != 0 {
		t.Errorf("decode refused %d", dec.refused.Load())
	}
	// A format that is not split loses the client's P/D fields too.
	resp, err := client.Post(baseURL+"/v1/responses", "application/json", strings.NewReader(
		`{"model":"m","input":"hello","bootstrap_room":7,"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":["forged"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got := dec.got()
	if last := got[len(got)-1]; resp.StatusCode != http.StatusOK || last["kv_transfer_params"] != nil || last["bootstrap_room"] != nil || last["input"] != "hello" {
		t.Errorf("Responses request: status %d, the decode engine got %v; want the client's fields without its P/D fields", resp.StatusCode, last)
	}
}

func TestDisaggregateShortPromptNotSplit(t *testing.T) {
	fl := new(pdFleet)
	p := newPDEngine(t, fl, "p1", true)
	dec := newPDEngine(t, fl, "d1", false)
	startCaddy(t, pdConfig(p.addr(), dec.addr(), "min_uncached 1024", ""))
	client := &http.Client{Timeout: 20 * time.Second}
	code, _ := postPD(t, client, `{"model":"m","messages":[{"role":"user","content":"short question"}]}`)
	if code != http.StatusOK || len(p.got()) != 0 || len(dec.got()) != 1 {
		t.Fatalf("short prompt: status %d, prefill got %d, decode %d: want only the decode pool", code, len(p.got()), len(dec.got()))
	}
	// A long prompt is split the first time; the decode engine then holds it (the decode
	// pool's tree), so the same prompt again has nothing uncached on the decode side.
	long := longChat(false, "")
	postPD(t, client, long)
	if len(p.got()) != 1 {
		t.Fatalf("long cold prompt: prefill got %d requests, want 1", len(p.got()))
	}
	postPD(t, client, long)
	if len(p.got()) != 1 || len(dec.got()) != 3 {
		t.Fatalf("long prompt held by the decode engine: prefill got %d, decode %d; want 1 and 3", len(p.got()), len(dec.got()))
	}
}

func TestDisaggregateClientGoneCancelsPrefill(t *testing.T) {
	fl := new(pdFleet)
	p := newPDEngine(t, fl, "p1", true)
	dec := newPDEngine(t, fl, "d1", false)
	p.hold = true
	startCaddy(t, pdConfig(p.addr(), dec.addr(), "split always", ""))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := postInBackground(ctx, longChat(true, ""))
	select {
	case <-p.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the prefill leg never arrived")
	}
	cancel()
	select {
	case <-p.cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the prefill leg was not cancelled when the client went away")
	}
	<-done
	if n := len(dec.got()); n != 0 {
		t.Errorf("decode engine got %d requests after the client went away", n)
	}
	// The decode leg too: a client gone mid-stream ends it.
	p.mu.Lock()
	p.hold = false
	p.mu.Unlock()
	dec.mu.Lock()
	dec.hold = true
	dec.mu.Unlock()
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	req2, _ := http.NewRequestWithContext(ctx2, http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader(longChat(true, "")))
	go func() {
		if resp, err := http.DefaultClient.Do(req2); err == nil {
			_, _ = bufio.NewReader(resp.Body).ReadByte()
			resp.Body.Close()
		}
	}()
	select {
	case <-dec.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the decode leg never arrived")
	}
	cancel2()
	select {
	case <-dec.cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the decode leg was not cancelled when the client went away")
	}
}

func TestDisaggregateBadConfig(t *testing.T) {
	for _, tc := range []struct{ opts, want string }{
		{"split sometimes", "split"},
		{"protocol tcp", "protocol"},
		{"min_uncached many", "min_uncached"},
		{"lb_policy no_such_policy", "no_such_policy"},
		{"no_such_option 1", "no_such_option"},
	} {
		cfg := pdConfig("127.0.0.1:1", "127.0.0.1:2", tc.opts, "")
		cfg = strings.Replace(cfg, "\t\tlb_policy kv_cache_aware {\n\t\t\ttelemetry off\n\t\t}\n\t\t"+tc.opts, "\t\t"+tc.opts, 1)
		_, _, err := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}.Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
		if err == nil {
			t.Errorf("%q: adapt succeeded, want an error", tc.opts)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "Caddyfile:1") {
			t.Errorf("%q: error %q should name %q and the file:line (Caddyfile:1x)", tc.opts, err, tc.want)
		}
	}
}

// TestDisaggregateLLMSimFleet: 2 prefill and 2 decode workers of the repo's simulator in P/D
// mode, whose decode workers accept only transfers a prefill worker of the fleet served. Every
// split request's handshake holds (no transfer refused, none left pending); streamed answers
// come through; a prefill worker killed mid-run costs no client a failed request.
func TestDisaggregateLLMSimFleet(t *testing.T) {
	leakCheck(t)
	tr := llmsim.NewTransfers()
	start := func(name, role string) *llmsim.Worker {
		w, err := llmsim.StartWorker("127.0.0.1:0", llmsim.Config{Name: name, Role: role, Transfers: tr, Speed: 50, MinEventInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		return w
	}
	p0, p1 := start("p0", llmsim.RolePrefill), start("p1", llmsim.RolePrefill)
	d0, d1 := start("d0", llmsim.RoleDecode), start("d1", llmsim.RoleDecode)
	cfg := pdConfig(p0.Addr+" "+p1.Addr, d0.Addr+" "+d1.Addr, "split always", "")
	cfg = strings.ReplaceAll(cfg, `"m"`, `"`+llmsim.DefaultModel+`"`)
	startCaddy(t, cfg)
	client := &http.Client{Timeout: 30 * time.Second}
	failed := 0
	run := func(from, to int) {
		for i := from; i < to; i++ {
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":4,"stream":%t}`,
				llmsim.DefaultModel, fmt.Sprintf("document %d: ", i%5)+strings.Repeat("words to prefill ", 300), i%2 == 0)
			code, got := postPD(t, client, body)
			if code != http.StatusOK {
				failed++
				t.Errorf("request %d: status %d: %s", i, code, got)
			}
		}
	}
	splitBefore, failedBefore := disaggCounts[disaggSplit].Load(), disaggCounts[disaggPrefillFailed].Load()
	run(0, 10)
	if tr.Refused.Load() != 0 || tr.Taken.Load() != 10 || tr.Pending() != 0 {
		t.Fatalf("transfers: served %d, taken %d, refused %d, pending %d; want 10 taken, none refused or pending",
			tr.Served.Load(), tr.Taken.Load(), tr.Refused.Load(), tr.Pending())
	}
	p0.Close()
	run(10, 30)
	if failed != 0 {
		t.Fatalf("%d client requests failed with a prefill worker down", failed)
	}
	split := disaggCounts[disaggSplit].Load() - splitBefore
	pf := disaggCounts[disaggPrefillFailed].Load() - failedBefore
	if split+pf != 30 || tr.Taken.Load() != split || tr.Refused.Load() != 0 {
		t.Fatalf("split %d, prefill_failed %d, taken %d, refused %d: want every split's transfer taken, 30 requests", split, pf, tr.Taken.Load(), tr.Refused.Load())
	}
	t.Logf("2P+2D llmsim (speed 50): 30 requests, %d split, %d aggregated after the prefill leg failed (p0 killed after 10)", split, pf)
}

// TestDisaggregateLlmdSimulator: llm-d's simulator as the prefill and the decode engine, for
// protocol compatibility only (its prefill answers dummy parameters, its decode does not check
// them): the prefill leg's shape is accepted, its answer's kv_transfer_params are found and
// handed to the decode leg, which the simulator serves with its KV transfer latency.
func TestDisaggregateLlmdSimulator(t *testing.T) {
	p := llmdSim(t, "--kv-cache-transfer-latency", "5ms")
	d := llmdSim(t, "--kv-cache-transfer-latency", "5ms")
	cfg := strings.ReplaceAll(pdConfig(p, d, "split always", ""), `"m"`, `"llama-3.1-8b"`)
	startCaddy(t, cfg)
	client := &http.Client{Timeout: 30 * time.Second}
	split, pf := disaggCounts[disaggSplit].Load(), disaggCounts[disaggPrefillFailed].Load()
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"model":"llama-3.1-8b","messages":[{"role":"user","content":%q}],"max_tokens":5,"stream":%t,"stream_options":{"include_usage":true}}`,
			strings.Repeat("a prompt for the prefill engine. ", 100), stream)
		if code, got := postPD(t, client, body); code != http.StatusOK {
			t.Fatalf("stream %t: status %d: %s", stream, code, got)
		}
	}
	if n, f := disaggCounts[disaggSplit].Load()-split, disaggCounts[disaggPrefillFailed].Load()-pf; n != 2 || f != 0 {
		t.Fatalf("split %d, prefill_failed %d: want both requests split (the simulator's prefill answer carries kv_transfer_params)", n, f)
	}
}

// rawDecoder is a decode engine on loopback that keeps each body it got, byte for byte, with
// the request's Content-Encoding and Content-Length, and answers a small chat completion.
type rawDecoder struct {
	srv  *httptest.Server
	got  chan rawBody
	seen atomic.Int64
}

type rawBody struct {
	body          []byte
	encoding      string
	contentLength int64
}

func newRawDecoder(t *testing.T) *rawDecoder {
	d := &rawDecoder{got: make(chan rawBody, 16)}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return // a body that failed on its way is never answered
		}
		d.seen.Add(1)
		d.got <- rawBody{b, r.Header.Get("Content-Encoding"), r.ContentLength}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[]}`)
	}))
	t.Cleanup(d.srv.Close)
	return d
}

func (d *rawDecoder) addr() string { return strings.TrimPrefix(d.srv.URL, "http://") }

func (d *rawDecoder) next(t *testing.T) rawBody {
	t.Helper()
	select {
	case b := <-d.got:
		return b
	case <-time.After(10 * time.Second):
		t.Fatal("the decode pool never got the request")
		return rawBody{}
	}
}

// The P/D fields a client sends in a body that is not split, and the vLLM extra argument that
// vLLM merges into the same request parameters (vllm_xargs.kv_transfer_params).
const (
	forgedKV    = `"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.9.9.9","remote_engine_id":"victim-engine","remote_block_ids":[1,2,3]}`
	forgedXargs = `"vllm_xargs":{"kv_transfer_params":"forged","keep":1}`
)

// TestDisaggregateBodyNotHeldNotSplit: a body over max_body is not split, and it streams to the
// decode pool without the client's P/D fields (top-level, and inside vllm_xargs); every other
// byte arrives unchanged.
func TestDisaggregateBodyNotHeldNotSplit(t *testing.T) {
	fl := new(pdFleet)
	p := newPDEngine(t, fl, "p1", true)
	dec := newRawDecoder(t)
	cfg := strings.Replace(pdConfig(p.addr(), dec.addr(), "split always", ""), "@llm llm_prompt\n", "@llm llm_prompt {\n\t\tmax_body 2KiB\n\t}\n", 1)
	startCaddy(t, cfg)
	client := &http.Client{Timeout: 20 * time.Second}
	fallback := disaggCounts[disaggFallback].Load()
	long := longChat(false, ", "+forgedKV+` , "bootstrap_room": 7,`+forgedXargs+`,"user":"u"`)
	want := longChat(false, `,"vllm_xargs":{"keep":1},"user":"u"`)
	// Client P/D fields first, last and in the middle, a key written with an escape.
	first := `{"kv\u005ftransfer_params":{"do_remote_prefill":true},` + long[1:]
	for i, body := range []string{long, first} {
		if code, got := postPD(t, client, body); code != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, code, got)
		}
		b := dec.next(t)
		if got := strings.ReplaceAll(string(b.body), " ", ""); got != strings.ReplaceAll(want, " ", "") {
			t.Errorf("request %d: a body over max_body reached the decode pool as\n%.300s...%s\nwant it without its P/D fields:\n%.300s...%s", i, b.body, b.body[max(0, len(b.body)-300):], want, want[len(want)-300:])
		}
		if strings.Count(string(b.body), "a long document") != 400 {
			t.Errorf("request %d: the prompt did not arrive whole", i)
		}
	}
	// A gzip body that decodes to more than max_body: decoded and filtered as it streams.
	if code, enc, got := postGzip(t, client, long); code != http.StatusOK {
		t.Fatalf("gzip body over max_body decoded: status %d: %s", code, got)
	} else if enc > 2<<10 {
		t.Fatalf("the gzip body is %d bytes: the test wants it held whole and decoding past max_body", enc)
	}
	if b := dec.next(t); b.encoding != "" || strings.ReplaceAll(string(b.body), " ", "") != strings.ReplaceAll(want, " ", "") {
		t.Errorf("gzip body over max_body decoded reached the decode engine as (Content-Encoding %q) %.200s..., want the decoded body without its P/D fields", b.encoding, b.body)
	}
	if len(p.got()) != 0 {
		t.Errorf("the prefill engine got %d requests, want none", len(p.got()))
	}
	if n := disaggCounts[disaggFallback].Load() - fallback; n != 3 {
		t.Errorf("aggregated_fallback counted %d, want 3", n)
	}
	// A body over max_body that is not a JSON object (or not one Go and Python read alike)
	// never reaches a decode engine.
	for _, bad := range []string{
		long[:len(long)-1] + `,"temperature":NaN}`,
		long + `{"kv_transfer_params":{}}`,
		"[" + long + "]",
	} {
		// llm_prompt does not match a body it cannot read as an LLM request at all (the list).
		if code, got := postPD(t, client, bad); got == `{"choices":[]}` {
			t.Errorf("a body that is not one JSON object (%.30s...%s): status %d, the decode engine's answer", bad, bad[len(bad)-30:], code)
		}
	}
	if n := dec.seen.Load(); n != 3 {
		t.Errorf("the decode engine answered %d requests, want 3 (nothing of the bad bodies)", n)
	}
}

// postGzip posts body gzip-compressed; it returns the status, the compressed size and the answer.
func postGzip(t *testing.T, client *http.Client, body string) (int, int, string) {
	t.Helper()
	var zbuf bytes.Buffer
	zw := gzip.NewWriter(&zbuf)
	io.WriteString(zw, body)
	zw.Close()
	n := zbuf.Len()
	req, _ := http.NewRequest(http.MethodPost, baseURL+"/v1/chat/completions", &zbuf)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, n, string(got)
}

// TestDisaggregateHeldNotSplitStripped: a body held whole but not split (split auto's short
// prompt, a content-encoded body, one Go's JSON refuses) reaches no decode engine with the
// client's P/D fields.
func TestDisaggregateHeldNotSplitStripped(t *testing.T) {
	fl := new(pdFleet)
	p := newPDEngine(t, fl, "p1", true)
	dec := newRawDecoder(t)
	startCaddy(t, pdConfig(p.addr(), dec.addr(), "split auto", ""))
	client := &http.Client{Timeout: 20 * time.Second}

	// A short prompt (not split): vllm_xargs' kv_transfer_params is removed too.
	short := `{"model":"m","messages":[{"role":"user","content":"hi"}],` + forgedKV + `,` + forgedXargs + `}`
	if code, got := postPD(t, client, short); code != http.StatusOK {
		t.Fatalf("status %d: %s", code, got)
	}
	if b := dec.next(t); strings.Contains(string(b.body), "kv_transfer_params") {
		t.Errorf("a short prompt reached the decode engine with the client's P/D fields: %s", b.body)
	}

	// A gzip body: decoded, stripped, forwarded without Content-Encoding.
	if code, _, got := postGzip(t, client, longChat(false, ","+forgedKV)); code != http.StatusOK {
		t.Fatalf("gzip body: status %d %s", code, got)
	}
	b := dec.next(t)
	if b.encoding != "" || string(b.body) != longChat(false, "") {
		t.Errorf("gzip body reached the decode engine as (Content-Encoding %q) %.200s..., want the decoded body without its P/D fields", b.encoding, b.body)
	}

	if n := dec.seen.Load(); n != 2 {
		t.Errorf("the decode engine answered %d requests, want 2", n)
	}

	// Without a matcher in front (llm_prompt matches no body it cannot read), llm_disaggregate
	// itself refuses what it cannot filter: an encoding it does not decode (415), a body held
	// whole that is not one JSON object as RFC 8259 has it, such as NaN, which Python's json
	// reads and Go's does not (400).
	startCaddy(t, strings.NewReplacer("llm_feedback @llm", "llm_feedback", "llm_disaggregate @llm", "llm_disaggregate", "reverse_proxy @llm", "reverse_proxy").Replace(pdConfig(p.addr(), dec.addr(), "split auto", "")))
	req, _ := http.NewRequest(http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader("not really br"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "br")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("a br body: status %d, want 415", resp.StatusCode)
	}

	// A body Python's json reads and Go's does not (NaN): never forwarded with its P/D fields.
	nan := `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":NaN,` + forgedKV + `}`
	for _, bad := range []string{nan, "[" + short + "]", short + "{}"} {
		if code, _ := postPD(t, client, bad); code != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", bad, code)
		}
	}
	if n := dec.seen.Load(); n != 2 {
		t.Errorf("the decode engine answered %d requests, want 2", n)
	}
}

// A decode leg runs no prefill on its engine (its prompt arrives as KV blocks from the prefill
// engine): while it is in flight, the decode engine's queued prefill, which decision cost
// ranks by, stays 0, and the prefill engine's is back at 0 once its leg answered.
func TestDisaggregateDecodeLegQueuesNoPrefill(t *testing.T) {
	fl := new(pdFleet)
	p := newPDEngine(t, fl, "p1", true)
	dec := newPDEngine(t, fl, "d1", false)
	dec.hold = true
	startCaddy(t, pdConfig(p.addr(), dec.addr(), "split always", ""))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := postInBackground(ctx, longChat(true, ""))
	select {
	case <-dec.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the decode leg never arrived")
	}
	s := currentState()
	d := s.upstream(dec.addr())
	if n := d.inFlight.Load(); n != 1 {
		t.Fatalf("decode engine: %d requests in flight, want the decode leg", n)
	}
	if n := d.prefillTokens.Load(); n != 0 {
		t.Errorf("decode engine: %d prefill tokens queued for a decode leg, want 0", n)
	}
	// The prefill leg stops counting when its context ends, after its answer was read: wait
	// for the count rather than assume it.
	waitUntil(t, time.Second, func() bool { return s.upstream(p.addr()).prefillTokens.Load() == 0 },
		"the prefill engine's queued prefill back at 0 after its leg answered")
	cancel()
	<-done
}

// postInBackground posts body to the site's chat completions from a goroutine, with ctx (the
// test ends the request by cancelling it); the channel closes when the request is over.
func postInBackground(ctx context.Context, body string) <-chan struct{} {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader(body))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	return done
}

// TestDisaggregateDeepNesting: issue 40's request through Caddy (llm_disaggregate, split
// always): a gzip body of about 12 KiB, a chat request whose first max_body bytes decoded end
// inside a string (4 MiB of padding), then a member of 8 MiB of '['. It streams through the
// P/D filter past max_body, which kept a frame per bracket: the router allocated 1,172 MiB
// for one such request (heap 587 MiB after) before its 502. Now it fails at llmreq.MaxDepth
// levels, mid-body (502), having allocated what the 4 MiB it holds of the body costs.
func TestDisaggregateDeepNesting(t *testing.T) {
	fl := new(pdFleet)
	p := newPDEngine(t, fl, "p1", true)
	dec := newRawDecoder(t)
	cfg := pdConfig(p.addr(), dec.addr(), "split always", "")
	startCaddy(t, cfg)
	client := &http.Client{Timeout: 60 * time.Second}

	var zbuf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&zbuf, gzip.BestCompression)
	io.WriteString(zw, `{"model":"m","messages":[{"role":"user","content":"hi"}],"pad":"`)
	io.Copy(zw, io.LimitReader(repeatReader('a'), 4<<20))
	io.WriteString(zw, `","x":`)
	io.Copy(zw, io.LimitReader(repeatReader('['), 8<<20))
	zw.Close()
	if zbuf.Len() > 16<<10 {
		t.Fatalf("the gzip body is %d bytes, want about 12 KiB", zbuf.Len())
	}
	req, _ := http.NewRequest(http.MethodPost, baseURL+"/v1/chat/completions", bytes.NewReader(zbuf.Bytes()))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("a %d-byte gzip body of 12 MiB decoded: status %d, the process allocated %d MiB", zbuf.Len(), resp.StatusCode, alloc>>20)
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d, want 502 (a body streaming past max_body that is not JSON the router reads)", resp.StatusCode)
	}
	// The process (Caddy, the engines, this client) allocates about 17 MiB: the 4 MiB of the
	// body held decoded, a few times over. The defect was a gigabyte.
	if alloc > 256<<20 {
		t.Errorf("the request made the process allocate %d MiB, want at most 256 MiB", alloc>>20)
	}
	if n := dec.seen.Load(); n != 0 {
		t.Errorf("the decode engine read %d whole bodies, want none", n)
	}
}

// TestDisaggregateDeepNestingHeldWhole: a body held whole that nests deeper than
// llmreq.MaxDepth is refused before a byte goes out (400), as any body the filter does not
// read; the matcher does not match it, so the directives here have none.
func TestDisaggregateDeepNestingHeldWhole(t *testing.T) {
	fl := new(pdFleet)
	p := newPDEngine(t, fl, "p1", true)
	dec := newRawDecoder(t)
	cfg := pdConfig(p.addr(), dec.addr(), "split always", "")
	startCaddy(t, strings.NewReplacer("llm_feedback @llm", "llm_feedback", "llm_disaggregate @llm", "llm_disaggregate", "reverse_proxy @llm", "reverse_proxy").Replace(cfg))
	client := &http.Client{Timeout: 20 * time.Second}
	for _, in := range deepBodies(llmreq.MaxDepth + 1) {
		if code, got := postPD(t, client, in); code != http.StatusBadRequest {
			t.Errorf("a body held whole nesting %d levels (%.30s...): status %d (%.100s), want 400", llmreq.MaxDepth+1, in, code, got)
		}
	}
	if n := dec.seen.Load(); n != 0 {
		t.Errorf("the decode engine read %d whole bodies, want none", n)
	}
}
