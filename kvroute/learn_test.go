package kvroute

// What kvroute learns from the engines' totals, through the in-process Caddy (caddytest): a
// loopback engine that counts its prompt tokens at a known chars per token, prefills at a known
// speed, reports a known prefix-cache hit ratio, and restarts with its totals back at zero.

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
)

// countingEngine answers completions as backend does and exports vLLM's totals for what it
// was sent: prompt tokens at charsPerToken chars of routing text each, half of them prefix-
// cache hits, the other half prefilled at prefillSpeed tokens per second.
type countingEngine struct {
	*backend
	charsPerToken, prefillSpeed float64

	mu                    sync.Mutex
	prompt, hits, prefill float64
	requests              int
	start                 float64 // process_start_time_seconds
}

func newCountingEngine(t *testing.T, name string, charsPerToken, prefillSpeed float64) *countingEngine {
	t.Helper()
	e := &countingEngine{backend: &backend{name: name}, charsPerToken: charsPerToken, prefillSpeed: prefillSpeed, start: 1.7e9}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

// restart brings the engine back as a new process: totals at zero, a new start time.
func (e *countingEngine) restart() {
	e.mu.Lock()
	e.prompt, e.hits, e.prefill, e.requests = 0, 0, 0, 0
	e.start += 60
	e.mu.Unlock()
}

func (e *countingEngine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/models" {
		http.NotFound(w, r) // the readers' model list: not a request
		return
	}
	if r.URL.Path != "/metrics" {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		tokens := float64(llmreq.Parse(body, false).Runes) / e.charsPerToken
		e.mu.Lock()
		e.prompt += tokens
		e.hits += tokens / 2
		e.prefill += tokens / 2 / e.prefillSpeed
		e.requests++
		e.mu.Unlock()
		e.backend.serve(w, r)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	const l = `engine="0",model_name="learn-m"`
	fmt.Fprintf(w, `vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1
vllm:num_requests_running{%[1]s} 0
vllm:num_requests_waiting{%[1]s} 0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{%[1]s} %[2]v
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{%[1]s} %[2]v
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{%[1]s} %[3]v
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{%[1]s,le="1"} %[5]d
vllm:request_prefill_time_seconds_bucket{%[1]s,le="+Inf"} %[5]d
vllm:request_prefill_time_seconds_sum{%[1]s} %[4]v
vllm:request_prefill_time_seconds_count{%[1]s} %[5]d
process_start_time_seconds %[6]v
`, l, e.prompt, e.hits, e.prefill, e.requests, e.start)
}

func learnedOf(t *testing.T, addr string) learnedFigures {
	t.Helper()
	us := upstreamStatus(t, addr)
	if us.Learned == nil {
		t.Fatalf("no learned figures for %s", addr)
	}
	return *us.Learned
}

// TestLearnFromEngineTotals: priors before anything is learned; then the engine's chars per
// token (7, against the 4 assumed), its prefill speed, its hit ratio, and the KV bound the
// trees allow at the learned chars per token.
func TestLearnFromEngineTotals(t *testing.T) {
	e := newCountingEngine(t, "u1", 7, 2000)
	cold := newCountingEngine(t, "u2", 7, 2000)
	f := fleet{e.backend, cold.backend}
	startCaddy(t, proxyConfig(f, "", fmt.Sprintf(`telemetry {
				interval 100ms
				timeout 100ms
			}
			upstream %s {
				prefill_tokens_per_second 1234
			}`, e.addr()), ""))
	client := newClient(t, 10*time.Second)
	// The first decision starts the readers; its few tokens teach no speed.
	if _, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("learn-m", "hello")); resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: status %d", resp.StatusCode)
	}

	// Priors: the upstream block's speed, else the default; no chars per token learned.
	if l := learnedOf(t, e.addr()); l.PrefillTokensPerSecond != 1234 || l.PrefillLearned {
		t.Errorf("prior of the annotated upstream: %+v", l)
	}
	if l := learnedOf(t, cold.addr()); l.PrefillTokensPerSecond != DefaultPrefillTokensPerSecond || l.PrefillLearned {
		t.Errorf("prior of the other upstream: %+v", l)
	}
	if st := getStatus(t); len(st.CharsPerToken) != 0 {
		t.Errorf("chars per token before any reading: %v", st.CharsPerToken)
	}

	// One session keeps every request on one upstream, its prompt growing like a chat's.
	deadline := time.Now().Add(30 * time.Second)
	var st Status
	for i := 0; ; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("nothing learned after %d requests: %+v %+v", i, st.CharsPerToken, st.Upstreams[e.addr()].Learned)
		}
		msgs := make([]string, 0, i%12+1)
		for j := range cap(msgs) {
			msgs = append(msgs, coldPrompt(i/12*100+j)+strings.Repeat(" with more words", 40))
		}
		_, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("learn-m", msgs...), "X-Session-Id", "s1")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		st = getStatus(t)
		if _, ok := st.CharsPerToken["learn-m"]; ok && (st.Upstreams[e.addr()].Learned.PrefillLearned ||
			st.Upstreams[cold.addr()].Learned.PrefillLearned) {
			break
		}
	}
	home, other := e, cold
	if st.Upstreams[cold.addr()].Learned.PrefillLearned {
		home, other = cold, e
	}
	if c := st.CharsPerToken["learn-m"]; math.Abs(c-7)/7 > 0.05 {
		t.Errorf("learned %.3f chars per token, want 7 ± 5%%", c)
	}
	l := st.Upstreams[home.addr()].Learned
	if math.Abs(l.PrefillTokensPerSecond-2000)/2000 > 0.01 {
		t.Errorf("learned prefill speed %.1f, want 2000", l.PrefillTokensPerSecond)
	}
	if l.EngineHitRatio == nil || math.Abs(*l.EngineHitRatio-0.5) > 1e-6 || l.PredictedHitRatio == nil {
		t.Errorf("hit ratios %+v", l)
	}
	if l.Model != "learn-m" || !strings.Contains(l.Exports, "prompt_tokens") || !strings.Contains(l.Exports, "start_time") {
		t.Errorf("learned %+v", l)
	}
	if o := st.Upstreams[other.addr()].Learned; o.PrefillLearned {
		t.Errorf("the upstream sent nothing learned a speed: %+v", o)
	}
	// 16000 tokens of KV at the learned chars per token, 1.5 × over.
	if us := st.Upstreams[home.addr()]; us.TreeBoundChars < 16000*7*1.5*0.95 || us.TreeBoundChars > 16000*7*1.5*1.05 {
		t.Errorf("tree bound %d chars, want about %d", us.TreeBoundChars, 16000*7*3/2)
	}
	_, body := adminCall(t, http.MethodGet, "/metrics")
	for _, want := range []string{
		fmt.Sprintf(`caddy_kvroute_prefill_tokens_per_second{upstream=%q}`, home.addr()),
		`caddy_kvroute_chars_per_token{model="learn-m"}`,
		fmt.Sprintf(`caddy_kvroute_engine_cache_hits_total{upstream=%q}`, home.addr()),
		fmt.Sprintf(`caddy_kvroute_predicted_cached_chars_total{upstream=%q}`, home.addr()),
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestEngineRestartDropsItsShare: an engine whose totals go back to zero restarted with an
// empty cache: its share of the trees goes at once, the other upstream's stays, its session
// binding stays, and the restart is counted.
func TestEngineRestartDropsItsShare(t *testing.T) {
	e := newCountingEngine(t, "u1", 4, 2000)
	keep := newCountingEngine(t, "u2", 4, 2000)
	startCaddy(t, proxyConfig(fleet{e.backend, keep.backend}, "", `telemetry {
				interval 100ms
				timeout 100ms
			}`, ""))
	client := newClient(t, 10*time.Second)
	s := currentState()
	// Two sessions, one on each upstream.
	bySession := map[string]string{}
	for i := 0; len(bySession) < 2 || s.forest.TenantChars(e.addr()) == 0 || s.forest.TenantChars(keep.addr()) == 0; i++ {
		if i == 200 {
			t.Fatalf("the sessions did not spread over both upstreams: %v", bySession)
		}
		sid := fmt.Sprintf("s%d", i)
		reply, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("restart-m", coldPrompt(i)+strings.Repeat(" more", 50)), "X-Session-Id", sid)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		bySession[reply.Upstream] = sid
	}
	// Readings before the restart: a baseline for the delta.
	waitUntil(t, 10*time.Second, func() bool {
		us := upstreamStatus(t, e.addr())
		return us.Telemetry != nil && us.Telemetry.Counts["ok"] >= 2
	}, "two readings of the engine")
	kept := s.forest.TenantChars(keep.addr())
	e.restart()
	waitUntil(t, 10*time.Second, func() bool { return s.forest.TenantChars(e.addr()) == 0 },
		"the restarted engine's share of the trees to go")
	if got := s.forest.TenantChars(keep.addr()); got != kept {
		t.Errorf("the other upstream's share went from %d to %d chars", kept, got)
	}
	if n := s.sessions.perUpstream()[e.addr()]; n == 0 {
		t.Error("the restarted engine's session bindings went too")
	}
	waitUntil(t, 5*time.Second, func() bool { return upstreamStatus(t, e.addr()).Learned.Restarts == 1 }, "the restart in GET /kvroute/")
	_, body := adminCall(t, http.MethodGet, "/metrics")
	if want := fmt.Sprintf(`caddy_kvroute_engine_restarts_total{upstream=%q} 1`, e.addr()); !strings.Contains(string(body), want) {
		t.Errorf("metrics lack %s", want)
	}
	if strings.Contains(string(body), fmt.Sprintf(`caddy_kvroute_engine_restarts_total{upstream=%q}`, keep.addr())) {
		t.Error("a restart counted for the engine that did not restart")
	}
}
