package kvroute

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestBinaryDisaggregateIssue32: issue 32's items 1, 2 and 4 through the Caddy that
// `./xcaddy.sh build` builds, with engines on loopback: a body over max_body reaches the decode
// engine without the client's P/D fields (vllm); both SGLang engines refusing a prompt give the
// client the decode engine's 400 byte for byte; a prefill engine dying mid-prefill while the
// decode engine has sent only its header gives the client a prompt 502.
func TestBinaryDisaggregateIssue32(t *testing.T) {
	caddyBinary(t)
	fl := new(pdFleet)
	vp := newPDEngine(t, fl, "p1", true)
	vd := newRawDecoder(t)
	rp, rd := newSGEngine(t), newSGEngine(t)
	const refusal = `{"object":"error","message":"This model's maximum context length is 8192 tokens.","type":"BadRequestError","param":null,"code":400}`
	for _, e := range []*sgEngine{rp, rd} {
		e.mu.Lock()
		e.status, e.errBody = http.StatusBadRequest, refusal
		e.mu.Unlock()
	}
	rd.mu.Lock()
	rd.errBody = strings.Replace(refusal, "This", "decode: this", 1)
	rd.mu.Unlock()
	kp, kd := newSGEngine(t), newSGEngine(t)
	kp.set(true, 0)
	kd.mu.Lock()
	kd.headFirst, kd.hold = true, true
	kd.mu.Unlock()

	admin, vllmPort, refusePort, killPort := freePort(t), freePort(t), freePort(t), freePort(t)
	cfg := fmt.Sprintf(`{
	admin localhost:%d
}
:%d {
	@llm llm_prompt {
		max_body 2KiB
	}
	llm_disaggregate @llm %s {
		split always
	}
	reverse_proxy @llm %s
}
:%d {
	@llm llm_prompt
	llm_disaggregate @llm %s {
		protocol sglang
	}
	reverse_proxy @llm %s
}
:%d {
	@llm llm_prompt
	llm_disaggregate @llm %s {
		protocol sglang
	}
	reverse_proxy @llm %s {
		flush_interval -1
	}
}
`, admin, vllmPort, vp.addr(), vd.addr(), refusePort, rp.addr(), rd.addr(), killPort, kp.addr(), kd.addr())
	startBinary(t, cfg, admin)
	client := &http.Client{Timeout: 15 * time.Second}
	post := func(port int, body string) (int, string, time.Duration) {
		start := time.Now()
		resp, err := client.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("POST: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), time.Since(start)
	}

	// Item 1: over max_body, streamed through the filter.
	body := longChat(false, ","+forgedKV+","+forgedXargs)
	if code, got, _ := post(vllmPort, body); code != http.StatusOK {
		t.Fatalf("vllm, body over max_body: status %d %s", code, got)
	}
	if b := vd.next(t); string(b.body) != longChat(false, `,"vllm_xargs":{"keep":1}`) {
		t.Errorf("vllm, body over max_body: the decode engine got %.200s...%s, want it without the client's P/D fields", b.body, b.body[max(0, len(b.body)-200):])
	}

	// Item 2: both engines refuse.
	if code, got, _ := post(refusePort, longChat(true, "")); code != http.StatusBadRequest || got != strings.Replace(refusal, "This", "decode: this", 1) {
		t.Errorf("sglang, both engines refuse: status %d body %q, want 400 and the decode engine's body", code, got)
	}

	// Item 4: the prefill engine dies mid-prefill; the decode engine sent its header only.
	type res struct {
		code int
		at   time.Time
	}
	done := make(chan res, 1)
	go func() {
		code, _, _ := post(killPort, longChat(true, ""))
		done <- res{code, time.Now()}
	}()
	for _, e := range []*sgEngine{kp, kd} {
		select {
		case <-e.arrived:
		case <-time.After(10 * time.Second):
			t.Fatal("a leg never arrived")
		}
	}
	killed := time.Now()
	kp.srv.CloseClientConnections()
	r := <-done
	if took := r.at.Sub(killed); r.code != http.StatusBadGateway || took > 5*time.Second {
		t.Errorf("sglang, prefill engine died before the first byte: status %d after %v, want 502 within 5s", r.code, took)
	}
}
