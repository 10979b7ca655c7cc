package kvroute

import (
	"context"
	"encoding/json"
	"net/http"
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
