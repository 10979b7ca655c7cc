package kvroute

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
)

// pdAdmitConfig is a vLLM P/D site whose decode pool holds one request at a time
// (max_concurrency 1) under flow_control: band interactive (the default) sheds after 300 ms,
// band batch (X-Priority: batch) waits up to 30 s. decodePolicy replaces the decode pool's
// lb_policy when given.
func pdAdmitConfig(prefill, decode, decodePolicy string) string {
	if decodePolicy == "" {
		decodePolicy = fmt.Sprintf(`kv_cache_aware {
			telemetry off
			flow_control {
				priority {http.request.header.X-Priority}
				band interactive {
					queue_timeout 300ms
				}
				band batch {
					queue_timeout 30s
				}
			}
			upstream %s {
				max_concurrency 1
			}
		}`, decode)
	}
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
		split always
		lb_policy kv_cache_aware {
			telemetry off
		}
	}
	reverse_proxy @llm %s {
		lb_policy %s
		flush_interval -1
	}
}
`, httpPort, httpPort, prefill, decode, decodePolicy)
}

// pdAdmitFleet is one llmsim prefill worker and one decode worker sharing a transfer registry;
// the decode worker is slow enough (20 ms a token) for a long answer to hold its one slot.
func pdAdmitFleet(t *testing.T) (*llmsim.Transfers, *llmsim.Worker, *llmsim.Worker) {
	leakCheck(t)
	tr := llmsim.NewTransfers()
	start := func(name, role string, step time.Duration) *llmsim.Worker {
		w, err := llmsim.StartWorker("127.0.0.1:0", llmsim.Config{Name: name, Role: role, Transfers: tr, Speed: 1,
			StepFixed: step, PerSeq: -1, PrefillPerToken: time.Microsecond, MinEventInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		return w
	}
	return tr, start("p0", llmsim.RolePrefill, time.Millisecond), start("d0", llmsim.RoleDecode, 20*time.Millisecond)
}

func admitChat(i, maxTokens int) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true}`,
		llmsim.DefaultModel, fmt.Sprintf("request %d: ", i)+strings.Repeat("a long document to prefill. ", 100), maxTokens)
}

func postAdmit(t *testing.T, ctx context.Context, body, priority string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if priority != "" {
		req.Header.Set("X-Priority", priority)
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

// TestDisaggregateDecodePoolAdmitsFirst: under protocol vllm, a request the decode pool cannot
// take costs no prefill. With the decode pool's one slot busy, two requests its flow_control
// sheds (429) leave the prefill engine untouched, and one that waits in its queue is
// prefilled only once a slot is its: every transfer a prefill served is taken. Before, the
// prefill leg ran first: each shed request cost a prefill whose KV no decode engine took
// (vLLM's prefill engine holds such blocks until VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s by
// default), and the waiting one held its KV while it waited (issue 40).
func TestDisaggregateDecodePoolAdmitsFirst(t *testing.T) {
	tr, p, d := pdAdmitFleet(t)
	startCaddy(t, pdAdmitConfig(p.Addr, d.Addr, ""))

	// The first request holds the decode slot (300 tokens at 20 ms) until it is cancelled.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	firstDone := make(chan struct{})
	go func() {
		defer close(firstDone)
		postAdmit(t, ctx, admitChat(0, 300), "")
	}()
	waitUntil(t, 5*time.Second, func() bool { return tr.Taken.Load() == 1 }, "the first request's decode leg took its transfer")

	for i := 1; i <= 2; i++ {
		if code, got := postAdmit(t, context.Background(), admitChat(i, 4), ""); code != http.StatusTooManyRequests {
			t.Errorf("request %d with the decode pool full: status %d (%.200s), want 429", i, code, got)
		}
	}
	if n, pending := tr.Prefills.Load(), tr.Pending(); n != 1 || pending != 0 {
		t.Errorf("after two requests the decode pool shed: %d prefills served, %d transfers never taken; want 1 (the first request's) and 0", n, pending)
	}

	// One that waits (band batch) is prefilled once the decode pool has a slot for it.
	waited := make(chan int, 1)
	go func() {
		code, _ := postAdmit(t, context.Background(), admitChat(3, 4), "batch")
		waited <- code
	}()
	time.Sleep(500 * time.Millisecond) // it waits in the decode pool's queue meanwhile
	if n := tr.Prefills.Load(); n != 1 {
		t.Errorf("a request waiting for a decode slot was prefilled: %d prefills served, want 1", n)
	}
	cancel()
	<-firstDone
	select {
	case code := <-waited:
		if code != http.StatusOK {
			t.Errorf("the request that waited: status %d, want 200", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the request that waited never got its answer")
	}
	if n, taken, pending, refused := tr.Prefills.Load(), tr.Taken.Load(), tr.Pending(), tr.Refused.Load(); n != 2 || taken != 2 || pending != 0 || refused != 0 {
		t.Errorf("%d prefills served, %d transfers taken, %d never taken, %d refused; want 2, 2, 0, 0", n, taken, pending, refused)
	}
	if s := d.Stats(); s.Requests != 1 {
		t.Errorf("the decode engine served %d requests to the end, want 1 (the one that waited; the first was cancelled)", s.Requests)
	}
}

// TestDisaggregateDecodePoolOtherPolicy: a decode pool under another lb_policy has no admission
// to wait for: the prefill leg runs when the decode engine's connection reads the body, and
// every request is split as before, each transfer taken.
func TestDisaggregateDecodePoolOtherPolicy(t *testing.T) {
	tr, p, d := pdAdmitFleet(t)
	startCaddy(t, pdAdmitConfig(p.Addr, d.Addr, "round_robin"))
	split := disaggCounts[disaggSplit].Load()
	for i := range 4 {
		if code, got := postAdmit(t, context.Background(), admitChat(i, 2), ""); code != http.StatusOK || !strings.Contains(got, "[DONE]") {
			t.Fatalf("request %d: status %d (%.200s), want 200 and a whole stream", i, code, got)
		}
	}
	if n, taken, pending, refused := tr.Prefills.Load(), tr.Taken.Load(), tr.Pending(), tr.Refused.Load(); n != 4 || taken != 4 || pending != 0 || refused != 0 {
		t.Errorf("%d prefills served, %d transfers taken, %d never taken, %d refused; want 4, 4, 0, 0", n, taken, pending, refused)
	}
	if n := disaggCounts[disaggSplit].Load() - split; n != 4 {
		t.Errorf("split counted %d, want 4", n)
	}
}

// llmdMetric sums the samples of an llm-d simulator's metric (all labels).
func llmdMetric(t *testing.T, addr, name string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := io.Copy(&b, resp.Body); err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			n += v
		}
	}
	return int(n)
}

// llmdSuccesses is the requests an llm-d simulator served to the end.
func llmdSuccesses(t *testing.T, addr string) int {
	return llmdMetric(t, addr, "vllm:request_success_total")
}

// TestDisaggregateDecodePoolAdmitsFirstLlmd: TestDisaggregateDecodePoolAdmitsFirst with llm-d's
// simulator as the prefill and the decode engine (vLLM's API and metrics; its transfer
// parameters are dummies, so what is counted is the prefills it served): with the decode
// pool full, shed requests cost the prefill engine nothing.
func TestDisaggregateDecodePoolAdmitsFirstLlmd(t *testing.T) {
	p := llmdSim(t)
	d := llmdSim(t, "--inter-token-latency", "20ms")
	startCaddy(t, pdAdmitConfig(p, d, ""))
	chat := func(i, maxTokens int) string {
		return fmt.Sprintf(`{"model":"llama-3.1-8b","messages":[{"role":"user","content":%q}],"max_tokens":%d,"ignore_eos":true,"stream":true}`,
			fmt.Sprintf("request %d: ", i)+strings.Repeat("a long document to prefill. ", 100), maxTokens)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	firstDone := make(chan struct{})
	go func() {
		defer close(firstDone)
		postAdmit(t, ctx, chat(0, 1000), "")
	}()
	waitUntil(t, 5*time.Second, func() bool { return llmdMetric(t, d, "vllm:num_requests_running") == 1 }, "the first request decoding")
	for i := 1; i <= 2; i++ {
		if code, got := postAdmit(t, context.Background(), chat(i, 4), ""); code != http.StatusTooManyRequests {
			t.Errorf("request %d with the decode pool full: status %d (%.200s), want 429", i, code, got)
		}
	}
	if n := llmdSuccesses(t, p); n != 1 {
		t.Errorf("after two requests the decode pool shed, the prefill engine served %d prefills, want 1", n)
	}
	cancel()
	<-firstDone
	if code, got := postAdmit(t, context.Background(), chat(3, 4), "batch"); code != http.StatusOK {
		t.Errorf("a request once the decode pool is free: status %d (%.200s), want 200", code, got)
	}
	if n, m := llmdSuccesses(t, p), llmdSuccesses(t, d); n != 2 || m != 1 {
		t.Errorf("prefills served %d, decodes served to the end %d; want 2 and 1", n, m)
	}
}
