package kvroute

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// liveEngine is a loopback inference server whose vLLM metrics page reports the requests
// it is serving right now, whoever sent them. Requests to /plain/ wait until released.
type liveEngine struct {
	name    string
	srv     *httptest.Server
	active  atomic.Int64 // requests being served, the page's num_requests_running
	held    atomic.Int64 // of them, /plain/ requests waiting for release
	scrapes atomic.Int64
	release chan struct{}
}

func newLiveEngine(t *testing.T, name string) *liveEngine {
	e := &liveEngine{name: name, release: make(chan struct{})}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *liveEngine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

func (e *liveEngine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/models" {
		http.NotFound(w, r) // the readers' model list: not a request
		return
	}
	if r.URL.Path == "/metrics" {
		e.scrapes.Add(1)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} %d
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0
`, e.active.Load())
		return
	}
	e.active.Add(1)
	defer e.active.Add(-1)
	_, _ = io.Copy(io.Discard, r.Body)
	if strings.HasPrefix(r.URL.Path, "/plain/") {
		e.held.Add(1)
		defer e.held.Add(-1)
		select {
		case <-e.release:
		case <-r.Context().Done():
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(backendReply{Upstream: e.name})
}

// A request that another reverse_proxy of the same Caddy sends to an upstream counts once in
// the load: Caddy counts it in flight on the address, the engine's page counts it running, and
// the external term is what neither of the process's counts holds. Here 4 such requests held on
// the session's upstream u1 make its load 4, within the band of the idle u2 (4 - 0 <= 4): the
// session stays. Counted twice (8), the session would be sent to u2.
func TestLoadCountsAnotherProxysRequestsOnce(t *testing.T) {
	leakCheck(t)
	u1, u2 := newLiveEngine(t, "u1"), newLiveEngine(t, "u2")
	startCaddy(t, fmt.Sprintf(`{
	admin `+adminAddr+`
	http_port %d
	https_port `+httpsPort+`
	grace_period 1s
}
localhost:%d {
	handle /plain/* {
		reverse_proxy %s
	}
	@llm llm_prompt
	reverse_proxy @llm %s %s {
		lb_policy kv_cache_aware {
			telemetry {
				interval 100ms
				timeout 100ms
			}
			upstream %s {
				energy_per_token 1uJ
			}
			upstream %s {
				energy_per_token 100uJ
			}
		}
	}
}
`, httpPort, httpPort, u1.addr(), u1.addr(), u2.addr(), u1.addr(), u2.addr()))
	client := newClient(t, 10*time.Second)
	chat := func(i int) string {
		rep, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(i)), "X-Session-ID", "s")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return rep.Upstream
	}
	if got := chat(1); got != "u1" {
		t.Fatalf("the first turn went to %s, want u1 (the lowest energy)", got)
	}

	const held = 4 // balance_abs_threshold: in band when counted once, out when twice
	var wg sync.WaitGroup
	for i := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Post(fmt.Sprintf("%s/plain/%d", baseURL, i), "text/plain", strings.NewReader("x"))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	t.Cleanup(func() { close(u1.release); wg.Wait() })
	waitUntil(t, 10*time.Second, func() bool { return u1.held.Load() == held }, "the other proxy's requests held on u1")
	// The external term is the smaller of the last two readings: wait for two readings taken
	// after all were held, and for the second to be taken in.
	waitUntil(t, 10*time.Second, func() bool {
		tel := upstreamStatus(t, u1.addr()).Telemetry
		return tel != nil && tel.Figures.Running == held
	}, "a reading of the held requests")
	from := u1.scrapes.Load()
	waitUntil(t, 10*time.Second, func() bool { return u1.scrapes.Load() >= from+3 }, "two more readings")

	us := upstreamStatus(t, u1.addr())
	if got := chat(2); got != "u1" {
		t.Errorf("with %d requests of another reverse_proxy on u1 (load %d, external %d), the session went to %s, want u1 (4 - 0 is within the band)",
			held, us.Load, us.Telemetry.External, got)
	}
	if us.Load != held || us.Telemetry.External != 0 {
		t.Errorf("u1: load %d, external %d; want load %d (the held requests, once), external 0", us.Load, us.Telemetry.External, held)
	}
}
