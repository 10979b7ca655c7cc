package kvroute

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// gated is a loopback upstream that holds every request until the test releases one: with
// max_concurrency 1 in front of it, the fleet is full while one request is held, and the
// order in which the rest reach it is the router's, not the scheduler's.
type gated struct {
	srv     *httptest.Server
	release chan struct{}

	mu        sync.Mutex
	order     []string // the X-Req header of each request, in arrival order
	active    int
	maxActive int
}

func newGated(t *testing.T) *gated {
	t.Helper()
	leakCheck(t)
	g := &gated{release: make(chan struct{})}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *gated) addr() string { return strings.TrimPrefix(g.srv.URL, "http://") }

func (g *gated) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" || r.URL.Path == "/v1/models" || r.URL.Path == "/health" {
		http.NotFound(w, r)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	g.mu.Lock()
	g.order = append(g.order, r.Header.Get("X-Req"))
	g.active++
	g.maxActive = max(g.maxActive, g.active)
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.active--
		g.mu.Unlock()
	}()
	select {
	case <-g.release:
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`)
}

// arrived returns the requests that reached the upstream so far.
func (g *gated) arrived() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.order...)
}

// queueConfig is a Caddyfile with one site in front of g at max_concurrency 1; extra goes
// into the reverse_proxy block.
func queueConfig(g *gated, policy, extra string) string {
	return fmt.Sprintf(`{
	admin `+adminAddr+`
	http_port %d
	https_port `+httpsPort+`
	grace_period 5s
}
localhost:%d {
	@llm llm_prompt
	reverse_proxy @llm %s {
		%s
		lb_policy kv_cache_aware {
			explain_header X-Kvroute-Decision
			telemetry off
			upstream %s {
				max_concurrency 1
			}
			%s
		}
	}
}
`, httpPort, httpPort, g.addr(), extra, g.addr(), policy)
}

// queued returns how many requests wait at the router.
func queued() int {
	s := currentState()
	if s == nil {
		return 0
	}
	s.wq.mu.Lock()
	defer s.wq.mu.Unlock()
	return s.wq.q.Len()
}

// result is one request's outcome.
type result struct {
	id     string
	status int
	header http.Header
	body   string
	err    error
}

// postAsync sends one request in the background; its result comes on the channel.
func postAsync(ctx context.Context, path, body string, headers ...string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		var id string
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
			if headers[i] == "X-Req" {
				id = headers[i+1]
			}
		}
		resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
		if err != nil {
			ch <- result{id: id, err: err}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		ch <- result{id: id, status: resp.StatusCode, header: resp.Header, body: string(b)}
	}()
	return ch
}

// occupy sends a request that takes the upstream's one slot and waits until it holds it.
func occupy(t *testing.T, g *gated, headers ...string) <-chan result {
	t.Helper()
	n := len(g.arrived())
	ch := postAsync(context.Background(), "/v1/chat/completions", chatBody("m", "occupy the slot"), append([]string{"X-Req", "occupier"}, headers...)...)
	waitFor(t, func() bool { return len(g.arrived()) > n }, "the first request reaches the upstream")
	return ch
}

// enqueue sends a request and waits until it waits at the router.
func enqueue(t *testing.T, path, body string, headers ...string) <-chan result {
	t.Helper()
	n := queued()
	ch := postAsync(context.Background(), path, body, headers...)
	waitFor(t, func() bool { return queued() > n }, "request "+strings.Join(headers, " ")+" waits at the router")
	return ch
}

// releaseAll lets the upstream answer n requests, one at a time.
func (g *gated) releaseN(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		select {
		case g.release <- struct{}{}:
		case <-time.After(30 * time.Second):
			t.Fatalf("release %d of %d: no request reached the upstream (arrived: %v)", i+1, n, g.arrived())
		}
	}
}

func mustOK(t *testing.T, chs ...<-chan result) []result {
	t.Helper()
	var out []result
	for _, ch := range chs {
		r := <-ch
		if r.err != nil || r.status != http.StatusOK {
			t.Errorf("request %s: status %d, err %v, body %q", r.id, r.status, r.err, r.body)
		}
		out = append(out, r)
	}
	return out
}

// Without flow_control, requests wait at the router while the fleet is full and reach the
// upstream one at a time, in arrival order; the one that waited says so in its explain
// header, and the metrics count the wait.
func TestQueueArrivalOrder(t *testing.T) {
	g := newGated(t)
	startCaddy(t, queueConfig(g, "queue_timeout 1m", ""))
	before := metricValue(t, `caddy_kvroute_queue_seconds_count{band="default"}`)
	first := occupy(t, g)
	var chs []<-chan result
	for i := range 4 {
		chs = append(chs, enqueue(t, "/v1/chat/completions", chatBody("m", fmt.Sprintf("request %d", i)), "X-Req", fmt.Sprint(i)))
	}
	if v := metricValue(t, `caddy_kvroute_queue_requests{band="default"}`); v != 4 {
		t.Errorf("queue_requests gauge %v while 4 wait, want 4", v)
	}
	g.releaseN(t, 5)
	mustOK(t, first)
	res := mustOK(t, chs...)
	if got, want := strings.Join(g.arrived(), ","), "occupier,0,1,2,3"; got != want {
		t.Errorf("order at the upstream %s, want %s", got, want)
	}
	if g.maxActive != 1 {
		t.Errorf("%d requests at once at an upstream of max_concurrency 1, want 1", g.maxActive)
	}
	if h := res[0].header.Get("X-Kvroute-Decision"); !strings.Contains(h, "queued_ms=") {
		t.Errorf("explain header %q of a request that waited: want queued_ms", h)
	}
	if v := metricValue(t, `caddy_kvroute_queue_seconds_count{band="default"}`) - before; v != 4 {
		t.Errorf("queue_seconds counted %v waits, want 4", v)
	}
	if v := metricValue(t, `caddy_kvroute_queue_requests{band="default"}`); v != 0 {
		t.Errorf("queue_requests gauge %v once all went, want 0", v)
	}
}

const flowPolicy = `queue_timeout 1m
			flow_control {
				tenant   {http.request.header.X-Tenant}
				priority {http.request.header.X-Priority}
				band hi {
					queue_timeout 1m
				}
				band lo {
					queue_timeout 1m
				}
			}`

// With flow_control, the highest band goes first, then the tenant with the fewest tokens
// served: a heavy tenant's long prompts wait behind a light tenant's short ones, though they
// came first; inside a tenant, arrival order.
func TestQueueFlowOrder(t *testing.T) {
	g := newGated(t)
	startCaddy(t, queueConfig(g, flowPolicy, ""))
	first := occupy(t, g, "X-Tenant", "someone")
	long := strings.Repeat("a long prompt of the heavy tenant. ", 120)
	var chs []<-chan result
	send := func(id, tenant, band, prompt string) {
		// max_tokens 1: a request's tokens served are its prompt's (and 2 for its output).
		body := strings.Replace(chatBody("m", prompt+id), `{"model":"m",`, `{"model":"m","max_tokens":1,`, 1)
		chs = append(chs, enqueue(t, "/v1/chat/completions", body, "X-Req", id, "X-Tenant", tenant, "X-Priority", band))
	}
	send("h1", "heavy", "lo", long)
	send("h2", "heavy", "lo", long)
	send("h3", "heavy", "lo", long)
	send("l1", "light", "lo", "short")
	send("l2", "light", "lo", "short")
	send("l3", "light", "lo", "short")
	send("x1", "heavy", "hi", long)
	st := adminStatus(t)
	if st.Queue == nil || st.Queue.Waiting != 7 || st.Queue.Bands["hi"] != 1 || st.Queue.Bands["lo"] != 6 {
		t.Errorf("GET /kvroute/ queue %+v, want 7 waiting: 1 in band hi, 6 in band lo", st.Queue)
	}
	g.releaseN(t, 8)
	mustOK(t, first)
	mustOK(t, chs...)
	// x1 first (band hi); the heavy tenant then has a long prompt more served than the light
	// one (both started level: an idle tenant banks no credit), so the light tenant's three
	// short ones go before the heavy tenant's next, though they came after.
	if got, want := strings.Join(g.arrived(), ","), "occupier,x1,l1,l2,l3,h1,h2,h3"; got != want {
		t.Errorf("order at the upstream %s, want %s", got, want)
	}
	if v := metricValue(t, `caddy_kvroute_tenant_tokens_served{tenant="heavy"}`); v <= metricValue(t, `caddy_kvroute_tenant_tokens_served{tenant="light"}`) {
		t.Errorf("tokens served: heavy %v, light %v: want heavy ahead", v, metricValue(t, `caddy_kvroute_tenant_tokens_served{tenant="light"}`))
	}
}

// adminStatus reads GET /kvroute/.
func adminStatus(t *testing.T) Status {
	t.Helper()
	_, body := adminCall(t, http.MethodGet, "/kvroute/")
	var st Status
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("GET /kvroute/: %v: %s", err, body)
	}
	return st
}

// A request past its band's queue_timeout, or beyond max_queued, gets 429 with Retry-After
// and an error body in its API's format; nothing of it reaches the upstream. With
// llm_feedback in the route as without it.
func TestQueueShed(t *testing.T) {
	for _, feedback := range []bool{false, true} {
		t.Run(fmt.Sprintf("llm_feedback=%v", feedback), func(t *testing.T) {
			g := newGated(t)
			policy := `flow_control {
				priority {http.request.header.X-Priority}
				band long {
					queue_timeout 1m
				}
				band short {
					queue_timeout 50ms
				}
				max_queued 1
			}`
			cfg := queueConfig(g, policy, "")
			if feedback {
				cfg = strings.Replace(cfg, "\t@llm llm_prompt\n", "\t@llm llm_prompt\n\tllm_feedback\n", 1)
			}
			startCaddy(t, cfg)
			first := occupy(t, g)
			logStart := caddyLogSize()
			shedBefore := metricValue(t, `caddy_kvroute_shed_total{band="short",reason="timeout"}`)
			// Past its band's timeout: OpenAI's format for chat.
			r := <-postAsync(context.Background(), "/v1/chat/completions", chatBody("m", "in a hurry"), "X-Req", "t1", "X-Priority", "short")
			checkShed(t, r, false)
			// Past it too, Anthropic's format for /v1/messages.
			r = <-postAsync(context.Background(), "/v1/messages", `{"model":"m","max_tokens":10,"system":"s","messages":[{"role":"user","content":"hurry"}]}`, "X-Req", "t2", "X-Priority", "short", "anthropic-version", "2023-06-01")
			checkShed(t, r, true)
			if v := metricValue(t, `caddy_kvroute_shed_total{band="short",reason="timeout"}`) - shedBefore; v != 2 {
				t.Errorf("shed_total{short,timeout} moved by %v, want 2", v)
			}
			// One waits (max_queued 1); the next is refused at once.
			waiting := enqueue(t, "/v1/chat/completions", chatBody("m", "patient"), "X-Req", "w1", "X-Priority", "long")
			r = <-postAsync(context.Background(), "/v1/chat/completions", chatBody("m", "one too many"), "X-Req", "f1", "X-Priority", "long")
			checkShed(t, r, false)
			if !strings.Contains(r.body, `"code":"queue_full"`) {
				t.Errorf("body %q: want code queue_full", r.body)
			}
			g.releaseN(t, 2)
			mustOK(t, first, waiting)
			if got, want := strings.Join(g.arrived(), ","), "occupier,w1"; got != want {
				t.Errorf("requests at the upstream %s, want %s (shed requests never sent)", got, want)
			}
			// reverse_proxy's "no upstreams available" behind the 429: logged as an error
			// without llm_feedback, swallowed with it.
			if caddyLog != nil {
				// Caddy logs the error when the handler returns, after the 429 went out: wait for
				// the three (without llm_feedback) rather than read the log once.
				errs := 0
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
					part := make([]byte, caddyLogSize()-logStart)
					n, _ := caddyLog.ReadAt(part, logStart)
					errs = strings.Count(string(part[:n]), "no upstreams available")
					if feedback || errs >= 3 || time.Now().After(deadline) {
						break
					}
				}
				if feedback && errs != 0 {
					t.Errorf("with llm_feedback: %d errors 'no upstreams available' logged for shed requests, want none", errs)
				}
				if !feedback && errs != 3 {
					t.Errorf("without llm_feedback: %d errors 'no upstreams available' logged, want 3 (one per shed request)", errs)
				}
			}
		})
	}
}

func checkShed(t *testing.T, r result, anthropic bool) {
	t.Helper()
	if r.err != nil || r.status != http.StatusTooManyRequests {
		t.Fatalf("request %s: status %d err %v body %q, want 429", r.id, r.status, r.err, r.body)
	}
	if v := r.header.Get("Retry-After"); v != retryAfter {
		t.Errorf("request %s: Retry-After %q, want %q", r.id, v, retryAfter)
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(r.body), &body); err != nil {
		t.Fatalf("request %s: body %q is not JSON: %v", r.id, r.body, err)
	}
	e, _ := body["error"].(map[string]any)
	if e == nil || e["message"] == nil {
		t.Fatalf("request %s: body %q has no error message", r.id, r.body)
	}
	if anthropic {
		if body["type"] != "error" || e["type"] != "rate_limit_error" {
			t.Errorf("request %s: body %q, want Anthropic's {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",...}}", r.id, r.body)
		}
	} else if _, has := body["type"]; has || e["type"] == nil || e["code"] == nil {
		t.Errorf("request %s: body %q, want OpenAI's {\"error\":{\"message\",\"type\",\"code\"}}", r.id, r.body)
	}
}

// A client that leaves while its request waits is dropped from the queue at once, and its
// request never reaches the upstream.
func TestQueueClientLeaves(t *testing.T) {
	g := newGated(t)
	startCaddy(t, queueConfig(g, "queue_timeout 1m", ""))
	first := occupy(t, g)
	ctx, cancel := context.WithCancel(context.Background())
	gone := postAsync(ctx, "/v1/chat/completions", chatBody("m", "impatient"), "X-Req", "gone")
	waitFor(t, func() bool { return queued() == 1 }, "the request waits")
	cancel()
	waitFor(t, func() bool { return queued() == 0 }, "the request that left is dropped")
	if r := <-gone; r.err == nil {
		t.Errorf("a cancelled request got status %d", r.status)
	}
	g.releaseN(t, 1)
	mustOK(t, first)
	next := postAsync(context.Background(), "/v1/chat/completions", chatBody("m", "next"), "X-Req", "next")
	g.releaseN(t, 1)
	mustOK(t, next)
	if got, want := strings.Join(g.arrived(), ","), "occupier,next"; got != want {
		t.Errorf("requests at the upstream %s, want %s", got, want)
	}
}

// A reload while requests wait loses none: they go, in order, one at a time, once the slot
// frees under the new config.
func TestQueueReloadKeepsWaiters(t *testing.T) {
	g := newGated(t)
	startCaddy(t, queueConfig(g, "queue_timeout 1m", ""))
	first := occupy(t, g)
	var chs []<-chan result
	for i := range 3 {
		chs = append(chs, enqueue(t, "/v1/chat/completions", chatBody("m", fmt.Sprintf("waits across a reload %d", i)), "X-Req", fmt.Sprint(i)))
	}
	load(t, queueConfig(g, "queue_timeout 2m\n\t\t\tcache_threshold 0.2", ""))
	if n := queued(); n != 3 {
		t.Errorf("%d requests wait after the reload, want 3", n)
	}
	after := enqueue(t, "/v1/chat/completions", chatBody("m", "after the reload"), "X-Req", "after")
	g.releaseN(t, 5)
	mustOK(t, append([]<-chan result{first}, append(chs, after)...)...)
	if got, want := strings.Join(g.arrived(), ","), "occupier,0,1,2,after"; got != want {
		t.Errorf("order at the upstream %s, want %s", got, want)
	}
	if g.maxActive != 1 {
		t.Errorf("%d requests at once, want 1", g.maxActive)
	}
}

// A shed request is never queued again by Caddy's retries (lb_try_duration calls Select again
// after a nil upstream): it is shed once, and nothing of it reaches the upstream.
func TestQueueShedNotRetried(t *testing.T) {
	g := newGated(t)
	startCaddy(t, queueConfig(g, "queue_timeout 1m\n\t\t\tflow_control {\n\t\t\t\tmax_queued 1\n\t\t\t}", "lb_try_duration 1s\n\t\tlb_try_interval 50ms"))
	first := occupy(t, g)
	waiting := enqueue(t, "/v1/chat/completions", chatBody("m", "patient"), "X-Req", "w1")
	before := metricValue(t, `caddy_kvroute_shed_total{band="default",reason="queue_full"}`)
	start := time.Now()
	r := <-postAsync(context.Background(), "/v1/chat/completions", chatBody("m", "one too many"), "X-Req", "f1")
	checkShed(t, r, false)
	// The 429 is whole at once; reverse_proxy calls Select again until lb_try_duration ends.
	// Meanwhile the queue stays full: a retry that queued again would be shed again.
	time.Sleep(time.Until(start.Add(1500 * time.Millisecond)))
	if v := metricValue(t, `caddy_kvroute_shed_total{band="default",reason="queue_full"}`) - before; v != 1 {
		t.Errorf("shed_total{queue_full} moved by %v for one request retried by lb_try_duration, want 1", v)
	}
	g.releaseN(t, 2)
	mustOK(t, first, waiting)
	if got, want := strings.Join(g.arrived(), ","), "occupier,w1"; got != want {
		t.Errorf("requests at the upstream %s, want %s", got, want)
	}
}

// With no max_concurrency, the batch slots learned from the engine's gauges make it full: the
// engine reported 2 running and a queue (2 slots); once the router has 2 requests in flight
// there, a third waits at the router, not in the engine, and goes when one ends.
func TestQueueLearnedSlots(t *testing.T) {
	e := newEngine(t, "u1", 1000)
	e.set(2, 1, "")
	startCaddy(t, proxyConfig(fleet{e.backend}, "", `queue_timeout 1m
			telemetry {
				interval 100ms
				timeout 100ms
			}`, ""))
	client := newClient(t, 30*time.Second)
	// The first decision starts the readers.
	if _, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", "start the readers")); resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: status %d", resp.StatusCode)
	}
	u := currentState().upstream(e.addr())
	waitFor(t, func() bool { f := u.learn.figures.Load(); return f != nil && f.Slots == 2 }, "2 slots learned")
	e.set(0, 0, "") // the engine idle: no external load
	waitFor(t, func() bool { return currentState().load(u, time.Now().UnixNano()) == 0 }, "the external load gone")

	e.setHang(true)
	hits := e.hits.Load()
	a := postAsync(context.Background(), "/v1/chat/completions", chatBody("m", "a"))
	b := postAsync(context.Background(), "/v1/chat/completions", chatBody("m", "b"))
	waitFor(t, func() bool { return e.hits.Load() == hits+2 }, "two requests reach the engine")
	c := enqueue(t, "/v1/chat/completions", chatBody("m", "c"))
	if n := e.hits.Load() - hits; n != 2 {
		t.Errorf("%d requests at the engine while one waits at the router, want 2", n)
	}
	if f := u.learn.figures.Load(); f.Slots != 2 {
		t.Errorf("slots %d while the router holds a request back, want 2 kept", f.Slots)
	}
	e.setHang(false)
	mustOK(t, a, b, c)
	if n := e.hits.Load() - hits; n != 3 {
		t.Errorf("%d requests at the engine, want 3", n)
	}
}

// A tenant's tokens are charged as in flight when its request is dispatched (the prompt's
// estimate plus output_weight × the output expected: max_tokens 1 here) and settled from the
// answer's usage through llm_feedback: 10 prompt and 5 completion tokens at weight 2 make 20.
func TestQueueTokensCorrectedByUsage(t *testing.T) {
	g := newGated(t)
	cfg := queueConfig(g, "flow_control {\n\t\t\t\ttenant {http.request.header.X-Tenant}\n\t\t\t}", "")
	cfg = strings.Replace(cfg, "\t@llm llm_prompt\n", "\t@llm llm_prompt\n\tllm_feedback\n", 1)
	startCaddy(t, cfg)
	series := `caddy_kvroute_tenant_tokens_served{tenant="usage-tenant"}`
	body := withMaxTokens(strings.Repeat("a prompt of some length. ", 40), 1)
	ch := postAsync(context.Background(), "/v1/chat/completions", body, "X-Tenant", "usage-tenant")
	waitFor(t, func() bool { return len(g.arrived()) == 1 }, "the request reaches the upstream")
	ts := tenantStatus(t, "usage-tenant")
	if ts.TokensInFlight < 200 || ts.TokensInFlight > 300 || ts.TokensServed != 0 {
		t.Errorf("at dispatch: %v tokens in flight, %v served, for a prompt of ~250 tokens and max_tokens 1: want its estimate + 2 in flight, none served", ts.TokensInFlight, ts.TokensServed)
	}
	g.releaseN(t, 1)
	mustOK(t, ch)
	waitFor(t, func() bool { return metricValue(t, series) == 20 }, fmt.Sprintf("tokens served settled at the usage's 10 + 2×5 (now %v)", metricValue(t, series)))
	if ts := tenantStatus(t, "usage-tenant"); ts.TokensServed != 20 || ts.TokensInFlight != 0 {
		t.Errorf("after the answer: %v served, %v in flight; want 20, 0", ts.TokensServed, ts.TokensInFlight)
	}
}

// tenantStatus returns tenant name's share in GET /kvroute/.
func tenantStatus(t *testing.T, name string) TenantStatus {
	t.Helper()
	if q := adminStatus(t).Queue; q != nil {
		for _, ts := range q.Tenants {
			if ts.Name == name {
				return ts
			}
		}
	}
	t.Fatalf("tenant %q not in GET /kvroute/", name)
	return TenantStatus{}
}

// Without flow_control, a request that finds the queue full (10,000 waiting; here 1) goes on
// at once, as it would without the queue: never a 429 without flow_control.
func TestQueueFullWithoutFlowControlGoesOn(t *testing.T) {
	defer func(n int) { maxQueuedAlone = n }(maxQueuedAlone)
	maxQueuedAlone = 1
	g := newGated(t)
	startCaddy(t, queueConfig(g, "queue_timeout 1m", ""))
	first := occupy(t, g)
	waiting := enqueue(t, "/v1/chat/completions", chatBody("m", "waits"), "X-Req", "w1")
	over := postAsync(context.Background(), "/v1/chat/completions", chatBody("m", "over the bound"), "X-Req", "over")
	waitFor(t, func() bool { return len(g.arrived()) == 2 }, "the request over the bound reaches the upstream at once")
	if got, want := strings.Join(g.arrived(), ","), "occupier,over"; got != want {
		t.Errorf("requests at the upstream %s, want %s", got, want)
	}
	g.releaseN(t, 3)
	mustOK(t, first, waiting, over)
}

// A request's band is the one its priority names; without one, the first band; naming no band
// (a typo, a forged value), the last: it never outranks a named band. Its tenant is its
// placeholder's value, a long one replaced by a digest.
func TestQueueFlowOf(t *testing.T) {
	fc := &FlowControl{Tenant: "{http.request.header.X-Tenant}", Priority: "{http.request.header.X-Priority}",
		Bands: []FlowBand{{Name: "hi"}, {Name: "mid"}, {Name: "lo"}}}
	p := &KVCacheAware{FlowControl: fc}
	p.opts = p.settings(false)
	for _, tc := range []struct {
		priority, tenant string
		band             int
		wantTenant       string
	}{
		{"", "acme", 0, "acme"},
		{"mid", "acme", 1, "acme"},
		{"lo", "", 2, defaultTenant}, // no tenant: the one the metrics name
		{"urgent!!", "acme", 2, "acme"},
		{"hi", strings.Repeat("t", 200), 0, boundKey(strings.Repeat("t", 200), maxTenantLen)},
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		r.Header.Set("X-Priority", tc.priority)
		r.Header.Set("X-Tenant", tc.tenant)
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddyhttp.NewTestReplacer(r)))
		band, name, tenant, timeout := p.flowOf(r)
		if band != tc.band || name != fc.Bands[tc.band].Name || tenant != tc.wantTenant || timeout != DefaultBandTimeout {
			t.Errorf("priority %q tenant %q: band %d (%s), tenant %q, timeout %v; want band %d, tenant %q, %v", tc.priority, tc.tenant, band, name, tenant, timeout, tc.band, tc.wantTenant, DefaultBandTimeout)
		}
	}
}
