package cluster

import (
	"errors"
	"testing"
)

// Peers' queued prefill tokens add up per upstream, apart from their in-flight counts, and a
// peer's latest record replaces its earlier one.
func TestPeerPrefillSums(t *testing.T) {
	n, _ := newTestNode(t, testConfig())
	p1, _ := newTestNode(t, testConfig())
	p2, _ := newTestNode(t, testConfig())
	n.receive(kindData, sealAs(p1, kindData, appendLoad(nil, []peerCount{{"u1", 3}})))
	n.receive(kindData, sealAs(p1, kindData, appendPrefill(nil, []peerCount{{"u1", 5000}, {"u2", 700}})))
	n.receive(kindData, sealAs(p2, kindData, appendPrefill(nil, []peerCount{{"u1", 1000}})))
	if got := n.PeerPrefill("u1"); got != 6000 {
		t.Errorf("PeerPrefill(u1) = %d, want 6000", got)
	}
	if got := n.PeerLoad("u1"); got != 3 {
		t.Errorf("PeerLoad(u1) = %d, want 3: the tokens are not requests", got)
	}
	n.receive(kindData, sealAs(p1, kindData, appendPrefill(nil, nil)))
	if got, got2 := n.PeerPrefill("u1"), n.PeerPrefill("u2"); got != 1000 || got2 != 0 {
		t.Errorf("after p1's empty record: u1 %d (want 1000), u2 %d (want 0)", got, got2)
	}
}

// A replica of the version before the record treats it as an unknown record; it travels in a
// message of its own, so nothing else is lost. Decoded here as such a reader would: the
// record's type is refused, and with it nothing but itself.
func TestPrefillRecordOwnMessage(t *testing.T) {
	rec, last := prefillRecord(map[string]int64{"u1": 42}, nil, false)
	if rec == nil || last["u1"] != 42 {
		t.Fatalf("first record: %v, remembered %v", rec, last)
	}
	if again, _ := prefillRecord(map[string]int64{"u1": 42}, last, false); again != nil {
		t.Errorf("an unchanged map was sent again")
	}
	var got []*record
	if err := decodeRecords(rec, wireVersion, 1024, func(r *record) { c := *r; got = append(got, &c) }); err != nil || len(got) != 1 || got[0].typ != recPrefill || got[0].loads[0] != (peerCount{"u1", 42}) {
		t.Fatalf("decoded %v, %v", got, err)
	}
	old := append([]byte{}, rec...)
	old[0] = 0xee // what an older reader sees: a type it does not know
	if err := decodeRecords(old, wireVersion, 1024, func(*record) {}); !errors.Is(err, errMalformed) {
		t.Errorf("unknown record: %v", err)
	}
}
