package kvroute

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Ollama's own API (/api/chat, /api/generate) answers errors as {"error":"..."}: its clients
// (the ollama Go and Python packages) read that string, and a shed request gets it in that
// shape, with the 429 and Retry-After every shed request gets (issue 40, item 6).
func TestQueueShedOllamaShape(t *testing.T) {
	g := newGated(t)
	startCaddy(t, queueConfig(g, `flow_control {
				band short {
					queue_timeout 50ms
				}
			}`, ""))
	first := occupy(t, g)
	for _, c := range []struct{ path, body string }{
		{"/api/chat", `{"model":"m","messages":[{"role":"user","content":"in a hurry"}]}`},
		{"/api/generate", `{"model":"m","prompt":"in a hurry","stream":false}`},
	} {
		r := <-postAsync(context.Background(), c.path, c.body, "X-Req", c.path)
		if r.err != nil || r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != retryAfter {
			t.Fatalf("%s: status %d, Retry-After %q, err %v, body %q; want 429 with Retry-After %s", c.path, r.status, r.header.Get("Retry-After"), r.err, r.body, retryAfter)
		}
		var body map[string]any
		if err := json.Unmarshal([]byte(r.body), &body); err != nil {
			t.Fatalf("%s: body %q is not JSON: %v", c.path, r.body, err)
		}
		if msg, ok := body["error"].(string); !ok || msg == "" || len(body) != 1 {
			t.Errorf("%s: body %q, want Ollama's {\"error\":\"...\"}", c.path, r.body)
		}
		if ct := r.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q, want application/json", c.path, ct)
		}
	}
	g.releaseN(t, 1)
	mustOK(t, first)
}

// A client that leaves while its request waits at the router went away: Caddy's access log
// records it as 499 (Caddy's status for a client that closed its request), and Caddy logs no
// error for it, as for a client that leaves during the upstream's answer; not a 503 "no
// upstreams available", which would count against the fleet (issue 40, item 8). With
// llm_feedback in the route and without.
func TestQueueClientLeavesLogged499(t *testing.T) {
	for _, feedback := range []bool{false, true} {
		t.Run(fmt.Sprintf("llm_feedback=%v", feedback), func(t *testing.T) {
			g := newGated(t)
			dir := t.TempDir()
			errLog, accessLog := filepath.Join(dir, "caddy.log"), filepath.Join(dir, "access.log")
			cfg := queueConfig(g, "queue_timeout 1m", "")
			cfg = strings.Replace(cfg, "grace_period 5s", "grace_period 5s\n\tlog {\n\t\toutput file "+errLog+"\n\t\tformat json\n\t}", 1)
			site := "\tlog {\n\t\toutput file " + accessLog + "\n\t\tformat json\n\t}\n\t@llm llm_prompt\n"
			if feedback {
				site += "\tllm_feedback\n"
			}
			cfg = strings.Replace(cfg, "\t@llm llm_prompt\n", site, 1)
			startCaddy(t, cfg)
			first := occupy(t, g)
			ctx, cancel := context.WithCancel(context.Background())
			gone := postAsync(ctx, "/v1/chat/completions", chatBody("m", "impatient"), "X-Req", "gone")
			waitFor(t, func() bool { return queued() == 1 }, "the request waits")
			cancel()
			<-gone
			waitFor(t, func() bool { return queued() == 0 }, "the request that left is dropped")
			var entry map[string]any
			waitFor(t, func() bool { entry = logEntry(accessLog, "gone"); return entry != nil }, "the access log records the request that left")
			if st, _ := entry["status"].(float64); st != 499 {
				t.Errorf("access log: status %v for a client that left while waiting, want 499", entry["status"])
			}
			if e := logEntry(errLog, "gone"); e != nil {
				t.Errorf("Caddy logged an error for a client that left while waiting: %v %v (status %v)", e["msg"], e["err_id"], e["status"])
			}
			g.releaseN(t, 1)
			mustOK(t, first)
			if got, want := strings.Join(g.arrived(), ","), "occupier"; got != want {
				t.Errorf("requests at the upstream %s, want %s", got, want)
			}
		})
	}
}

// logEntry returns the first JSON log entry of file whose request carries X-Req id.
func logEntry(file, id string) map[string]any {
	data, _ := os.ReadFile(file)
	for _, line := range bytes.Split(data, []byte("\n")) {
		var e struct {
			Request struct {
				Headers map[string][]string `json:"headers"`
			} `json:"request"`
		}
		if json.Unmarshal(line, &e) != nil || !slices.Contains(e.Request.Headers["X-Req"], id) {
			continue
		}
		var m map[string]any
		_ = json.Unmarshal(line, &m)
		return m
	}
	return nil
}
