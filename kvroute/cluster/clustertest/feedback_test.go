package clustertest

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestResponsesFollowUpAcrossReplicas: llm_feedback on one replica binds a Responses answer's
// id to the engine that stored it, and a follow-up naming it through another replica goes to
// that engine (the binding crossed as a keyed digest, like a session's).
func TestResponsesFollowUpAcrossReplicas(t *testing.T) {
	ns := startNATS(t, nil)
	var engines [2]*httptest.Server
	var ids atomic.Int64
	for i := range engines {
		name := fmt.Sprintf("e%d", i)
		engines[i] = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("X-Upstream", name)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"resp_%s_%d","object":"response","status":"completed","output":[],"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":0},"output_tokens":1}}`,
				name, ids.Add(1))
		}))
		t.Cleanup(engines[i].Close)
	}
	ups := strings.TrimPrefix(engines[0].URL, "http://") + " " + strings.TrimPrefix(engines[1].URL, "http://")
	a := startReplicaSite(t, "A", ups, ns.url(), replicaSecret, "", "llm_feedback @llm")
	b := startReplicaSite(t, "B", ups, ns.url(), replicaSecret, "", "llm_feedback @llm")
	eventually(t, 15*time.Second, "the replicas to hear each other", func() bool { return a.livePeers() == 1 && b.livePeers() == 1 })

	post := func(r *replica, body string) (string, string) {
		t.Helper()
		resp, err := client.Post("http://"+r.site+"/v1/responses", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", r.name, resp.StatusCode, raw)
		}
		id := string(raw[strings.Index(string(raw), "resp_"):])
		return resp.Header.Get("X-Upstream"), id[:strings.IndexByte(id, '"')]
	}
	before := b.status().Cluster.BindingsReceived
	home, id := post(a, `{"model":"m","input":"the first turn of a conversation"}`)
	eventually(t, 10*time.Second, "B to receive the response's binding", func() bool { return b.status().Cluster.BindingsReceived > before })
	for i := range 10 {
		got, _ := post(b, fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"follow-up %d"}`, id, i))
		if got != home {
			t.Fatalf("follow-up %d through replica B went to %s; %s, which stored %s, answered through replica A", i, got, home, id)
		}
	}
}
