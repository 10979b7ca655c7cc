package kvroute

// Telemetry and health through the in-process Caddy (caddytest, on free ports: ports_test.go): an
// unannotated upstream's KV capacity read from its /metrics, an engine's long queue keeping
// cold requests away, a dead upstream left out and back after its restart, bad metrics
// endpoints changing nothing. The engines are loopback servers that export vLLM's families;
// their hit counts leave the scrapes out.

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
)

// engine is a loopback inference server: it answers completions as backend does and serves
// vLLM's metric families on /metrics, or misbehaves there as told.
type engine struct {
	*backend
	scrapes atomic.Int64

	mu       sync.Mutex
	running  int
	waiting  int
	blocks   int           // num_gpu_blocks of 16 tokens
	metrics  string        // "" (vLLM page), "404", "slow", "huge", "garbled"
	delay    time.Duration // service time of a request, as an engine's prefill takes
	listener string        // the address, kept for a restart
	// models is the body of GET /v1/models ("": 404); apiKey, when set, is the bearer token
	// it wants there (401 without); extra is appended to the vLLM page (fleet_test.go).
	models     string
	apiKey     string
	extra      string
	modelReads atomic.Int64
	authSeen   []string // the Authorization headers of every read
}

func newEngine(t testing.TB, name string, blocks int) *engine {
	return newEngineAt(t, name, "127.0.0.1:0", blocks)
}

// newEngineAt starts an engine on addr (to bring one back on its address).
func newEngineAt(t testing.TB, name, addr string, blocks int) *engine {
	t.Helper()
	e := &engine{backend: &backend{name: name}, blocks: blocks}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(e.serve))
	var l net.Listener
	var err error
	for range 100 { // the address may linger a moment after its last owner closed it
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = l
	srv.Start()
	e.srv = srv
	e.listener = l.Addr().String()
	t.Cleanup(e.kill)
	return e
}

// kill closes the listener and every connection: the upstream refuses connections from now.
func (e *engine) kill() {
	e.srv.CloseClientConnections()
	e.srv.Close()
}

func (e *engine) set(running, waiting int, metrics string) {
	e.mu.Lock()
	e.running, e.waiting, e.metrics = running, waiting, metrics
	e.mu.Unlock()
}

func (e *engine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/models" || r.URL.Path == "/metrics" {
		e.mu.Lock()
		e.authSeen = append(e.authSeen, r.Header.Get("Authorization"))
		e.mu.Unlock()
	}
	if r.URL.Path == "/v1/models" {
		e.modelReads.Add(1)
		e.mu.Lock()
		models, key := e.models, e.apiKey
		e.mu.Unlock()
		switch {
		case key != "" && r.Header.Get("Authorization") != "Bearer "+key:
			http.Error(w, `{"error":"Unauthorized"}`, http.StatusUnauthorized)
		case models == "":
			http.NotFound(w, r)
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, models)
		}
		return
	}
	if r.URL.Path != "/metrics" {
		e.mu.Lock()
		d := e.delay
		e.mu.Unlock()
		if d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		e.backend.serve(w, r)
		return
	}
	e.scrapes.Add(1)
	e.mu.Lock()
	running, waiting, blocks, mode, extra := e.running, e.waiting, e.blocks, e.metrics, e.extra
	e.mu.Unlock()
	switch mode {
	case "404":
		http.NotFound(w, r)
	case "501": // llama.cpp's server without --metrics
		http.Error(w, `{"error":{"code":501,"message":"This server does not support metrics endpoint. Start it with `+"`--metrics`"+`","type":"not_supported_error"}}`, http.StatusNotImplemented)
	case "slow":
		select { // far beyond the scrape timeout, and beyond what any request may take
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
	case "huge": // 50 MB of valid comments: only the size is wrong
		line := []byte("# " + strings.Repeat("x", 1021) + "\n")
		for i := 0; i < 50<<10; i++ {
			if _, err := w.Write(line); err != nil {
				return
			}
		}
	case "garbled":
		junk := make([]byte, 64<<10)
		_, _ = rand.Read(junk)
		_, _ = w.Write(junk)
	default:
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",num_gpu_blocks="%d"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} %d
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} %d
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
%s`, blocks, running, waiting, extra)
	}
}

// telemetryConfig is proxyConfig with fast telemetry (or the given telemetry option).
func telemetryConfig(engines []*engine, telemetryOpt, extra string, annotations ...string) string {
	f := make(fleet, len(engines))
	for i, e := range engines {
		f[i] = e.backend
	}
	opt := telemetryOpt
	if opt == "" {
		opt = "telemetry {\n\t\t\t\tinterval 100ms\n\t\t\t\ttimeout 100ms\n\t\t\t}"
	}
	return proxyConfig(f, "", opt+"\n\t\t\t"+strings.Join(annotations, "\n\t\t\t"), extra)
}

func upstreamStatus(t *testing.T, addr string) UpstreamStatus {
	t.Helper()
	return getStatus(t).Upstreams[addr]
}

// kickOff sends one request, which starts the background work (the first decision does).
func kickOff(t *testing.T, client *http.Client) {
	t.Helper()
	if _, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", "hello")); resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: status %d", resp.StatusCode)
	}
}

// An unannotated upstream's KV capacity comes from its /metrics (block_size × num_gpu_blocks)
// and bounds what the tree believes it holds; a kv_capacity annotation wins over it.
func TestTelemetryKVCapacityFromMetrics(t *testing.T) {
	for _, annotated := range []bool{false, true} {
		t.Run(fmt.Sprintf("annotated=%v", annotated), func(t *testing.T) {
			leakCheck(t)                // first: its check runs after the engines have closed
			e := newEngine(t, "u1", 10) // 160 tokens: the tree keeps 1.5 × 160 × 4 = 960 chars
			var ann []string
			if annotated {
				ann = append(ann, fmt.Sprintf("upstream %s {\n\t\t\t\tkv_capacity 100000\n\t\t\t}", e.addr()))
			}
			startCaddy(t, telemetryConfig([]*engine{e}, "", "", ann...))
			client := newClient(t, 10*time.Second)
			kickOff(t, client)
			waitUntil(t, 5*time.Second, func() bool {
				us := upstreamStatus(t, e.addr())
				return us.Telemetry != nil && us.Telemetry.Figures.KVCapacityTokens == 160
			}, "the engine's KV capacity in GET /kvroute/")
			us := upstreamStatus(t, e.addr())
			if us.Telemetry.Engine != telemetry.EngineVLLM || us.Telemetry.ReadAt == nil {
				t.Errorf("telemetry status %+v: want engine vllm and a reading time", us.Telemetry)
			}
			want := int64(160)
			if annotated {
				want = 100000
			}
			if us.KVCapacityTokens != want {
				t.Errorf("kv_capacity_tokens %d, want %d", us.KVCapacityTokens, want)
			}
			for i := range 10 { // 10 × ~500 chars on the one upstream
				body := chatBody("m", coldPrompt(i)+strings.Repeat(" and some more words", 24))
				if _, resp := send(t, client, baseURL+"/v1/chat/completions", body); resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
			}
			s := currentState()
			s.forest.Evict()
			chars := s.forest.TenantChars(e.addr())
			if !annotated && chars > 960 {
				t.Errorf("the upstream holds %d chars in the tree, beyond the 960 its reported capacity allows", chars)
			}
			if annotated && chars <= 960 {
				t.Errorf("kv_capacity 100000 annotated: the tree was cut to %d chars by the engine's figure", chars)
			}
			if e.hits.Load() != 11 {
				t.Errorf("the engine counts %d requests, want 11 (scrapes are not requests)", e.hits.Load())
			}
			if e.scrapes.Load() == 0 {
				t.Error("no scrape reached the engine")
			}
		})
	}
}

// An engine that reports a long queue (traffic this router did not send) gets no cold
// requests while its reading is fresh; without the reading it gets its share.
func TestTelemetryLongQueueGetsNoColdRequests(t *testing.T) {
	leakCheck(t)
	engines := []*engine{newEngine(t, "u1", 1000), newEngine(t, "u2", 1000), newEngine(t, "u3", 1000)}
	busy := engines[0]
	busy.set(8, 40, "")
	startCaddy(t, telemetryConfig(engines, "", ""))
	client := newClient(t, 10*time.Second)
	kickOff(t, client)
	waitUntil(t, 5*time.Second, func() bool { return upstreamStatus(t, busy.addr()).Load >= 40 }, "the engine's queue in the load")
	if m := metricValue(t, fmt.Sprintf(`caddy_kvroute_engine_waiting{upstream=%q}`, busy.addr())); m != 40 {
		t.Errorf("caddy_kvroute_engine_waiting %v, want 40", m)
	}
	before := busy.hits.Load()
	for i := range 30 {
		if _, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(100+i))); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if n := busy.hits.Load() - before; n != 0 {
		t.Errorf("the engine with 48 requests of its own got %d of 30 cold requests", n)
	}

	// The control: the queue drains, and the same upstream takes its share again.
	busy.set(0, 0, "")
	waitUntil(t, 5*time.Second, func() bool { return upstreamStatus(t, busy.addr()).Load == 0 }, "the drained queue")
	before = busy.hits.Load()
	for i := range 30 {
		send(t, client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(200+i)))
	}
	if n := busy.hits.Load() - before; n < 3 {
		t.Errorf("after its queue drained, the engine got %d of 30 cold requests (want a share)", n)
	}
}

// With Caddy's defaults (no retries, no health checks: examples/configs/minimal.Caddyfile), an
// upstream killed under 20 concurrent conversations fails only requests routed to it before it
// was down (those in flight at the kill and the few that make it down), none once it is down;
// its conversations move, and it gets traffic again once restarted. With telemetry and without.
//
// The test waits for states (traffic on the victim, the victim down, turns of every
// conversation after that), never for a time: on a loaded machine a request answered before
// the kill may be read long after it, and the few that make the upstream down take longer.
func TestHealthDeadUpstreamLeftOutAndBack(t *testing.T) {
	for _, tc := range []struct {
		name, telemetry, extra string
		retries                bool // the retries hide the failures of requests decided after the kill
	}{
		{"telemetry", "", "", false},
		{"requests only", "telemetry off", "", false},
		// Retried attempts count too (noteRetry).
		{"retries", "telemetry off", "lb_retries 2", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			engines := []*engine{newEngine(t, "u1", 1000), newEngine(t, "u2", 1000), newEngine(t, "u3", 1000)}
			startCaddy(t, telemetryConfig(engines, tc.telemetry, tc.extra))
			client := newClient(t, 10*time.Second)
			url := baseURL + "/v1/chat/completions"
			for _, e := range engines {
				e.delay = 20 * time.Millisecond // so that the kill catches requests in flight
			}
			victim := engines[1]
			decisions := func() (n uint64) { // requests routed to the victim so far
				for _, d := range upstreamStatus(t, victim.addr()).Decisions {
					n += d
				}
				return n
			}

			const conversations = 20
			var (
				mu                   sync.Mutex
				phase                int // 0 before the kill, 1 once killed, 2 once seen down
				failed, late, onDead int
				afterDown            [conversations]int // turns sent once the victim was seen down
			)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for i := range conversations {
				wg.Add(1)
				go func() {
					defer wg.Done()
					msgs := []string{strings.Repeat(fmt.Sprintf("System prompt %d of a long conversation. ", i), 30), "q0"}
					for turn := 0; ; turn++ {
						select {
						case <-stop:
							return
						default:
						}
						mu.Lock()
						sentIn := phase
						mu.Unlock()
						upstream, code := trySend(client, url, chatBody("m", msgs...), fmt.Sprintf("s%d", i))
						mu.Lock()
						if code != http.StatusOK {
							failed++
							if sentIn == 2 {
								late++ // decided after the victim was down, yet failed
							}
						} else if sentIn >= 1 && upstream == victim.name {
							onDead++ // sent after the kill, answered by the dead upstream: impossible
						}
						if sentIn == 2 {
							afterDown[i]++
						}
						mu.Unlock()
						msgs = append(msgs, "an answer", fmt.Sprintf("question %d", turn))
						time.Sleep(5 * time.Millisecond)
					}
				}()
			}
			defer func() { // a failed wait below must not leave the conversations running
				select {
				case <-stop:
				default:
					close(stop)
				}
				wg.Wait()
			}()
			waitUntil(t, 20*time.Second, func() bool { return victim.hits.Load() >= 10 }, "conversations on "+victim.name+" to lose")
			mu.Lock()
			failedBefore := failed
			mu.Unlock()
			// In this order: a request routed to the victim before atKill and still in flight at
			// the kill is in inFlightAtKill; one routed after is in the decisions since atKill.
			atKill := decisions()
			inFlightAtKill := currentState().upstream(victim.addr()).inFlight.Load()
			victim.kill()
			killed := time.Now()
			mu.Lock()
			phase = 1
			mu.Unlock()
			afterKill := decisions()
			waitUntil(t, 20*time.Second, func() bool { return upstreamStatus(t, victim.addr()).Health.State == "down" }, "the killed upstream down")
			t.Logf("down %v after the kill", time.Since(killed).Round(time.Millisecond))
			mu.Lock()
			phase = 2
			mu.Unlock()
			atDown := decisions()
			waitUntil(t, 30*time.Second, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return slices.Min(afterDown[:]) >= 3
			}, "three turns of every conversation once the upstream was down")
			close(stop)
			wg.Wait()

			if failedBefore > 0 {
				t.Errorf("%d requests failed before the kill", failedBefore)
			}
			failed -= failedBefore
			// Every failure is a request routed to the victim before it was seen down: in
			// flight at the kill, or decided since. With retries, only those decided before the
			// kill ended can fail: a later one is retried elsewhere.
			routed := int(atDown - atKill)
			if tc.retries {
				routed = int(afterKill - atKill)
			}
			t.Logf("%d requests failed after the kill; %d were in flight on the killed upstream, %d routed to it until the kill ended, %d until it was seen down", failed, inFlightAtKill, afterKill-atKill, atDown-atKill)
			if limit := int(inFlightAtKill) + routed; failed > limit {
				t.Errorf("%d requests failed after the kill, want at most the %d in flight at the kill or routed to it since", failed, limit)
			}
			if late > 0 {
				t.Errorf("%d requests sent once the upstream was down failed", late)
			}
			if onDead > 0 {
				t.Errorf("%d answers came from the killed upstream", onDead)
			}
			if st := upstreamStatus(t, victim.addr()).Health; st.State != "down" {
				t.Fatalf("health of the killed upstream: %+v, want down", st)
			}
			if m := metricValue(t, fmt.Sprintf(`caddy_kvroute_upstream_down{upstream=%q}`, victim.addr())); m != 1 {
				t.Errorf("caddy_kvroute_upstream_down %v, want 1", m)
			}

			back := newEngineAt(t, victim.name, victim.listener, 1000)
			restarted := time.Now()
			waitUntil(t, 10*time.Second, func() bool { return upstreamStatus(t, back.addr()).Health.State == "up" }, "the restarted upstream back")
			t.Logf("back %v after the restart", time.Since(restarted).Round(time.Millisecond))
			for i := range 30 {
				if _, resp := send(t, client, url, chatBody("m", coldPrompt(300+i))); resp.StatusCode != http.StatusOK {
					t.Fatalf("after the restart: status %d", resp.StatusCode)
				}
			}
			if back.hits.Load() == 0 {
				t.Error("the restarted upstream got none of 30 cold requests")
			}
		})
	}
}

// trySend posts a chat turn with a session header and returns the upstream that answered and
// the status (0 when the request failed on the client's side); unlike send, it may run in any
// goroutine.
func trySend(client *http.Client, url, body, session string) (string, int) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return "", 0
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", session)
	resp, err := client.Do(req)
	if err != nil {
		return "", 0
	}
	defer resp.Body.Close()
	var rep backendReply
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil && resp.StatusCode == http.StatusOK {
		return "", 0
	}
	return rep.Upstream, resp.StatusCode
}

// Metrics endpoints that are absent, slow, huge or garbled change nothing but counters: the
// upstream stays up, with no capacity and no external load, and requests are not delayed.
func TestTelemetryBadEndpointsChangeNothing(t *testing.T) {
	leakCheck(t)
	modes := []string{"404", "slow", "huge", "garbled"}
	engines := make([]*engine, len(modes))
	for i, m := range modes {
		engines[i] = newEngine(t, m, 1000)
		engines[i].set(50, 50, m) // figures that would count, were they read
	}
	startCaddy(t, telemetryConfig(engines, "", ""))
	client := newClient(t, 10*time.Second)
	kickOff(t, client)
	waitUntil(t, 10*time.Second, func() bool {
		for _, e := range engines {
			tel := upstreamStatus(t, e.addr()).Telemetry
			if tel == nil || tel.Failures < 3 {
				return false
			}
		}
		return true
	}, "three failed reads of every endpoint")
	wantOutcome := map[string]string{"404": "not_found", "slow": "stale", "huge": "too_large", "garbled": "garbled"}
	for _, e := range engines {
		us := upstreamStatus(t, e.addr())
		// Reading 4 MiB of the huge page may outlast the 100 ms timeout on a loaded machine:
		// stale is as harmless as too_large.
		if us.Telemetry.Outcome != wantOutcome[e.name] && !(e.name == "huge" && us.Telemetry.Outcome == "stale") {
			t.Errorf("%s: outcome %v, want %v", e.name, us.Telemetry.Outcome, wantOutcome[e.name])
		}
		if us.Health.State != "up" || us.KVCapacityTokens != 0 || us.Telemetry.External != 0 {
			t.Errorf("%s: %+v: want up, no capacity, no external load", e.name, us)
		}
		if m := metricValue(t, fmt.Sprintf(`caddy_kvroute_telemetry_scrape_errors_total{upstream=%q}`, e.addr())); m < 3 {
			t.Errorf("%s: caddy_kvroute_telemetry_scrape_errors_total %v, want >= 3", e.name, m)
		}
	}
	got := map[string]int{}
	for i := range 40 {
		start := time.Now()
		rep, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(400+i)))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		// Waiting on the slow endpoint would take a minute: 30 s leaves room for a loaded
		// machine and still tells.
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("a request took %v", d)
		}
		got[rep.Upstream]++
	}
	for _, m := range modes {
		if got[m] == 0 {
			t.Errorf("the upstream with a %s metrics endpoint got none of 40 cold requests: %v", m, got)
		}
	}
}

// The telemetry options: checked with the file:line, and process-wide (policies of one config
// must agree).
func TestTelemetryOptions(t *testing.T) {
	f := fleet{&backend{name: "x", srv: &httptest.Server{URL: "http://127.0.0.1:1"}}}
	for _, tc := range []struct{ policy, want string }{
		{"telemetry {\n\t\t\t\tinterval 10ms\n\t\t\t}", "interval: must be at least 100ms"},
		{"telemetry {\n\t\t\t\tinterval 1s\n\t\t\t\ttimeout 2s\n\t\t\t}", "timeout: must be positive and at most the interval"},
		{"telemetry {\n\t\t\t\tpath metrics\n\t\t\t}", "path: want an absolute URL path"},
		{"telemetry {\n\t\t\t\tspeed 1\n\t\t\t}", `unrecognized option "speed"`},
		{"telemetry on", "want `off` or a block"},
		{"telemetry off {\n\t\t\t\tinterval 1s\n\t\t\t}", "takes no block"},
		{"upstream 127.0.0.1:1 {\n\t\t\t\tmetrics_url ftp://x/metrics\n\t\t\t}", "metrics_url: bad URL"},
	} {
		cfg := proxyConfig(f, "", tc.policy, "")
		_, _, err := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}.Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "Caddyfile:1") {
			t.Errorf("%q: error %v, want %q and the file:line", tc.policy, err, tc.want)
		}
	}
	for _, ok := range []string{"telemetry off", "telemetry {\n\t\t\t\tpath /m\n\t\t\t\tinterval 2s\n\t\t\t\ttimeout 1s\n\t\t\t}", "telemetry {\n\t\t\t}"} {
		cfg := proxyConfig(f, "", ok, "")
		if _, _, err := (caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}).Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"}); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}

	a := processOptions{telemetry: Telemetry{Interval: 2e9}.settingsOf(), telemetryGiven: true}
	b := processOptions{telemetry: (*Telemetry)(nil).settings(), telemetryGiven: true}
	if err := a.merge(b); err == nil || !strings.Contains(err.Error(), "telemetry") {
		t.Errorf("two policies with different telemetry: %v, want a conflict naming telemetry", err)
	}
	c := processOptions{}
	if err := c.merge(a); err != nil || c.telemetry.interval != 2e9 {
		t.Errorf("a policy leaving telemetry out takes the config's: %v, %+v", err, c.telemetry)
	}
}

func (t Telemetry) settingsOf() telemetrySettings { return (&t).settings() }

// The warning names the options, and is given only when the proxy has neither retries nor
// health checks.
func TestHealthWarnsWithoutRetriesOrHealthChecks(t *testing.T) {
	for _, tc := range []struct {
		extra string
		warn  bool
	}{
		{"", true},
		{"lb_retries 2", false},
		{"lb_try_duration 5s", false},
		{"health_uri /health", false},
		{"fail_duration 30s", false},
		{"lb_try_interval 1s", true},
	} {
		h := adaptHandler(t, "reverse_proxy 127.0.0.1:1 {\n\tlb_policy kv_cache_aware\n\t"+tc.extra+"\n}")
		if got := unprotected(h); got != tc.warn {
			t.Errorf("%q: unprotected %v, want %v", tc.extra, got, tc.warn)
		}
	}
}

// adaptHandler reads a reverse_proxy directive as Caddy's Caddyfile adapter does.
func adaptHandler(t *testing.T, directive string) *reverseproxy.Handler {
	t.Helper()
	h := new(reverseproxy.Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(directive)); err != nil {
		t.Fatalf("%q: %v", directive, err)
	}
	return h
}

// One reader per upstream for the process: two policies naming the same upstreams, and reloads,
// read each upstream once per interval; `telemetry off` in a reload stops the readers.
func TestTelemetryOneReaderPerUpstream(t *testing.T) {
	leakCheck(t)
	engines := []*engine{newEngine(t, "u1", 1000), newEngine(t, "u2", 1000)}
	addrs := engines[0].addr() + " " + engines[1].addr()
	config := func(telemetry string) string {
		policy := fmt.Sprintf("lb_policy kv_cache_aware {\n\t\t\t\t%s\n\t\t\t}", telemetry)
		return fmt.Sprintf(`{
	admin `+adminAddr+`
	http_port %d
	https_port `+httpsPort+`
	grace_period 1s
}
localhost:%d {
	handle /a/* {
		reverse_proxy %s {
			%s
		}
	}
	handle {
		reverse_proxy %s {
			%s
		}
	}
}
`, httpPort, httpPort, addrs, policy, addrs, policy)
	}
	fast := "telemetry {\n\t\t\t\t\tinterval 100ms\n\t\t\t\t\ttimeout 100ms\n\t\t\t\t}"
	startCaddy(t, config(fast))
	client := newClient(t, 10*time.Second)
	for _, path := range []string{"/a/v1/chat/completions", "/v1/chat/completions"} {
		if _, resp := send(t, client, baseURL+path, chatBody("m", "hello")); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", path, resp.StatusCode)
		}
	}
	// One reader at 100 ms (±10% jitter) takes at least 10 × 90 ms for ten reads; two would
	// take about half that. A loaded machine only makes reads later, so the time ten reads
	// take is checked against its lower bound, not a count in a fixed time.
	const reads = 10
	readTime := func() time.Duration {
		scrapes := engines[0].scrapes.Load
		from := scrapes() + 1 // the next read starts the clock
		waitUntil(t, 20*time.Second, func() bool { return scrapes() >= from }, "a read of the engine")
		start := time.Now()
		waitUntil(t, 20*time.Second, func() bool { return scrapes() >= from+reads }, fmt.Sprintf("%d reads of the engine", reads))
		return time.Since(start)
	}
	// Less the polls' 10 ms at either end.
	const oneReader = reads*90*time.Millisecond - 20*time.Millisecond
	if d := readTime(); d < oneReader {
		t.Errorf("two policies: the engine was read %d times in %v, want one reader (at least %v)", reads, d, oneReader)
	}
	if keys := currentState().tel.current.Load().Keys(); len(keys) != 2 {
		t.Errorf("readers %v, want one per upstream", keys)
	}
	load(t, config(fast))
	if d := readTime(); d < oneReader {
		t.Errorf("after a reload: the engine was read %d times in %v, want one reader (at least %v)", reads, d, oneReader)
	}
	load(t, config("telemetry off"))
	// The reader stops with s.tel.mu held, waiting for its read in flight: once the lock is
	// free again, no read of it is left but one whose request the engine has yet to handle.
	waitUntil(t, 10*time.Second, func() bool { return currentState().tel.current.Load() == nil }, "the reader to stop")
	currentState().tel.mu.Lock()
	currentState().tel.mu.Unlock()
	before := engines[0].scrapes.Load()
	time.Sleep(10 * 100 * time.Millisecond) // ten intervals in which a reader would read
	if n := engines[0].scrapes.Load() - before; n > 1 {
		t.Errorf("telemetry off: the engine was read %d times in ten intervals", n)
	}
	if us := upstreamStatus(t, engines[0].addr()); us.Telemetry != nil || us.KVCapacityTokens != 0 {
		t.Errorf("telemetry off: the status still shows telemetry %+v, capacity %d", us.Telemetry, us.KVCapacityTokens)
	}
}

// An engine that serves no /metrics (a 404: SGLang without --enable-metrics, llama.cpp's server
// without --metrics) leaves the upstream without a KV bound: one warning says so, naming the
// flags, however many reads follow; the admin API shows the outcome and no bound.
func TestTelemetryNoMetricsWarnsOnce(t *testing.T) {
	for _, mode := range []string{"404", "501"} {
		t.Run(mode, func(t *testing.T) { testNoMetricsWarnsOnce(t, mode) })
	}
}

func testNoMetricsWarnsOnce(t *testing.T, mode string) {
	e := newEngine(t, "u1", 10)
	e.set(0, 0, mode)
	p := newPolicy(t, &KVCacheAware{Telemetry: &Telemetry{Interval: caddy.Duration(100 * time.Millisecond), Timeout: caddy.Duration(100 * time.Millisecond)}})
	core, logs := observer.New(zap.WarnLevel)
	setStateLogger(p, zap.New(core))
	pick(t, p, newPool(e.addr()), "m", "hello") // the first decision starts the readers
	noMetrics := func() int {
		return logs.FilterMessageSnippet("--enable-metrics").FilterMessageSnippet("--metrics").Len()
	}
	waitFor(t, func() bool { return noMetrics() == 1 }, "the warning naming the engines' flags")
	n := e.scrapes.Load() + 3
	waitUntil(t, 20*time.Second, func() bool { return e.scrapes.Load() >= n }, "three more reads")
	if got := logs.Len(); got != 1 {
		t.Errorf("%d warnings, want one: %v", got, logs.All())
	}
	if f := logs.All()[0].ContextMap(); f["upstream"] != e.addr() {
		t.Errorf("the warning names %v, want %s", f["upstream"], e.addr())
	}
	us := p.state.status().Upstreams[e.addr()]
	if us.Telemetry == nil || us.Telemetry.Outcome != "not_found" || us.KVCapacityTokens != 0 || us.TreeBoundChars != 0 {
		t.Errorf("the status shows %+v, telemetry %+v", us, us.Telemetry)
	}
}

// One info line when an upstream's telemetry appears and one when it goes away, however many
// reads follow; the figures go with it.
func TestTelemetryLogsAppearAndGoAway(t *testing.T) {
	e := newEngine(t, "u1", 10)
	p := newPolicy(t, &KVCacheAware{Telemetry: &Telemetry{Interval: caddy.Duration(100 * time.Millisecond), Timeout: caddy.Duration(100 * time.Millisecond)}})
	core, logs := observer.New(zap.InfoLevel)
	setStateLogger(p, zap.New(core))
	pick(t, p, newPool(e.addr()), "m", "hello") // the first decision starts the readers
	count := func(msg string) int { return logs.FilterMessage(msg).Len() }
	const appeared, lost = "telemetry: reading the upstream's engine", "telemetry: lost the upstream's engine figures"
	moreReads := func(what string) { // reads that could log the line again
		n := e.scrapes.Load() + 3
		waitUntil(t, 20*time.Second, func() bool { return e.scrapes.Load() >= n }, what)
	}
	waitFor(t, func() bool { return count(appeared) == 1 }, "the appear line")
	moreReads("three more good reads")
	e.set(0, 0, "404")
	waitFor(t, func() bool { return count(lost) == 1 }, "the go-away line")
	moreReads("three more 404 reads")
	if a, l := count(appeared), count(lost); a != 1 || l != 1 {
		t.Errorf("%d appear and %d go-away lines, want one each", a, l)
	}
	if f := logs.FilterMessage(appeared).All()[0].ContextMap(); f["engine"] != "vllm" || f["kv_capacity_tokens"] != int64(160) {
		t.Errorf("the appear line says %v", f)
	}
}
