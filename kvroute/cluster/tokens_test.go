package cluster

import (
	"fmt"
	"testing"
)

// Peers' tokens served add up per tenant, apart from their loads and queued prefill; a peer's
// latest record replaces its earlier one; a record names at most maxTenantRecords tenants,
// the most served.
func TestPeerTokensSum(t *testing.T) {
	n, _ := newTestNode(t, testConfig())
	p1, _ := newTestNode(t, testConfig())
	p2, _ := newTestNode(t, testConfig())
	if got := n.PeerTokens(); len(got) != 0 {
		t.Errorf("PeerTokens before any record: %v", got)
	}
	n.receive(kindData, sealAs(p1, kindData, appendPrefill(nil, []peerCount{{"acme", 5}})))
	n.receive(kindData, sealAs(p1, kindData, appendTokens(nil, []peerCount{{"acme", 5000}, {"globex", 700}})))
	n.receive(kindData, sealAs(p2, kindData, appendTokens(nil, []peerCount{{"acme", 1000}})))
	if got := n.PeerTokens(); got["acme"] != 6000 || got["globex"] != 700 {
		t.Errorf("PeerTokens = %v, want acme 6000, globex 700", got)
	}
	if got := n.PeerPrefill("acme"); got != 5 {
		t.Errorf("PeerPrefill(acme) = %d, want 5: the tokens served are not queued prefill", got)
	}
	n.receive(kindData, sealAs(p1, kindData, appendTokens(nil, []peerCount{{"acme", 9000}})))
	if got := n.PeerTokens(); got["acme"] != 10000 || got["globex"] != 0 {
		t.Errorf("after p1's newer record: %v, want acme 10000 and no globex", got)
	}

	many := map[string]int64{}
	for i := range maxTenantRecords + 10 {
		many[fmt.Sprint("t", i)] = int64(i + 1)
	}
	rec, _ := tokensRecord(many, nil, false)
	var got []peerCount
	if err := decodeRecords(rec, wireVersion, 1024, func(r *record) { got = append(got, r.loads...) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != maxTenantRecords {
		t.Fatalf("%d tenants in a record, want %d", len(got), maxTenantRecords)
	}
	for _, c := range got {
		if c.n <= 10 {
			t.Errorf("tenant %s (%d tokens) sent, though %d were served more", c.upstream, c.n, maxTenantRecords)
		}
	}
	if again, _ := tokensRecord(many, many, false); again != nil {
		t.Error("an unchanged map was sent again")
	}
}
