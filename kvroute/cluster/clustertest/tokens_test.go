package clustertest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// tenantTokens is tenant's tokens served as r's queue counts them (GET /kvroute/), 0 when r
// does not name it.
func (r *replica) tenantTokens(t *testing.T, tenant string) float64 {
	served, _ := r.tenantShare(t, tenant)
	return served
}

// tenantShare is tenant's tokens served (settled) and in flight as r's queue counts them.
func (r *replica) tenantShare(t *testing.T, tenant string) (served, inFlight float64) {
	t.Helper()
	resp, err := http.Get("http://" + r.admin + "/kvroute/")
	if err != nil {
		t.Fatalf("%s: GET /kvroute/: %v", r.name, err)
	}
	defer resp.Body.Close()
	var st struct {
		Queue struct {
			Tenants []struct {
				Name           string  `json:"name"`
				TokensServed   float64 `json:"tokens_served"`
				TokensInFlight float64 `json:"tokens_in_flight"`
			} `json:"tenants"`
		} `json:"queue"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("%s: GET /kvroute/: %v", r.name, err)
	}
	for _, tt := range st.Queue.Tenants {
		if tt.Name == tenant {
			return tt.TokensServed, tt.TokensInFlight
		}
	}
	return 0, 0
}

// Replicas share the tokens served per tenant (flow_control's fair shares): what A served a
// tenant counts in B's queue too, so that a tenant cannot get twice its share by sending half
// its requests to each replica.
func TestReplicasShareTokensServed(t *testing.T) {
	caddyBinary(t)
	ns := startNATS(t, nil)
	bs := newBackends(t, 1)
	flow := "\n\t\t\tflow_control {\n\t\t\t\ttenant {http.request.header.X-Tenant}\n\t\t\t}"
	a := startReplicaWith(t, "A", addrs(bs), ns.url(), replicaSecret, flow)
	b := startReplicaWith(t, "B", addrs(bs), ns.url(), replicaSecret, flow)
	a.chat(t, []string{"warm up A"}, "X-Tenant", "warm-up")
	b.chat(t, []string{"warm up B"}, "X-Tenant", "warm-up")
	eventually(t, 10*time.Second, "A and B hear each other", func() bool { return a.livePeers() == 1 && b.livePeers() == 1 })

	long := strings.Repeat("a long prompt of the acme tenant. ", 100)
	for i := range 5 {
		if _, code := a.chat(t, []string{fmt.Sprintf("acme %d: %s", i, long)}, "X-Tenant", "acme"); code != http.StatusOK {
			t.Fatalf("acme's request %d on A: status %d", i, code)
		}
	}
	// A request's charge is settled when it ends, just after its answer reached the client.
	eventually(t, 10*time.Second, "A settles acme's requests", func() bool { _, f := a.tenantShare(t, "acme"); return f == 0 })
	own := a.tenantTokens(t, "acme")
	if own < 5*800 {
		t.Fatalf("A counts %v tokens served to acme for 5 prompts of ~850 tokens, want more", own)
	}
	if got := b.tenantTokens(t, "acme"); got >= own-1 {
		t.Logf("B already counts %v of A's %v", got, own)
	}
	eventually(t, 10*time.Second, "B counts what A served acme", func() bool { return b.tenantTokens(t, "acme") >= own-1 })
	if got := b.tenantTokens(t, "acme"); got > own+1 {
		t.Errorf("B counts %v tokens served to acme, A served %v: counted more than once", got, own)
	}
}
