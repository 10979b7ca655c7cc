package cluster

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestReceiveApplies(t *testing.T) {
	n, r := newTestNode(t, testConfig())
	peer, _ := newTestNode(t, testConfig())
	text := textOf(5000)
	dec, _, _ := peer.encodeDecision("llama", "10.0.0.1:8000", text, nil, nil)
	var plain []byte
	plain = append(plain, dec...)
	plain = appendBinding(plain, "llama", peer.SessionKey("s1"), "10.0.0.2:8000", 1)
	plain = appendLoad(plain, []peerCount{{"10.0.0.1:8000", 3}, {"10.0.0.2:8000", 4}})
	n.receive(kindData, sealAs(peer, kindData, plain))
	want := []string{
		fmt.Sprintf("decision llama 10.0.0.1:8000 5000:%s", short(text)),
		"binding llama " + n.SessionKey("s1") + " 10.0.0.2:8000",
	}
	if got := r.got(); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if got := n.PeerLoad("10.0.0.2:8000"); got != 4 {
		t.Errorf("PeerLoad = %d, want 4", got)
	}
	if s := n.Stats(); s.DecisionsReceived != 1 || s.BindingsReceived != 1 || len(s.Peers) != 1 || s.Peers[0].Load != 7 {
		t.Errorf("stats: %+v", s)
	}
	if n.SessionKey("s1") == n.SessionKey("s2") || strings.Contains(n.SessionKey("s1"), "s1") {
		t.Error("session keys must differ per id and not show it")
	}
}

func TestReceiveRejects(t *testing.T) {
	n, r := newTestNode(t, testConfig())
	peer, _ := newTestNode(t, testConfig())
	wrong := testConfig()
	wrong.Secret = "another-secret-of-16+bytes"
	intruder, _ := newTestNode(t, wrong)
	otherFleet := testConfig()
	otherFleet.Name = "fleet-b"
	neighbour, _ := newTestNode(t, otherFleet)

	good := sealAs(peer, kindData, appendReset(nil))
	n.receive(kindData, good)
	if got := len(r.got()); got != 1 {
		t.Fatalf("good message: %d calls", got)
	}
	cases := []struct {
		name    string
		kind    byte
		msg     []byte
		counter func(Stats) uint64
	}{
		{"replayed", kindData, good, func(s Stats) uint64 { return s.RejectedReplay }},
		{"wrong secret", kindData, sealAs(intruder, kindData, appendReset(nil)), func(s Stats) uint64 { return s.RejectedAuth }},
		{"other fleet", kindData, sealAs(neighbour, kindData, appendReset(nil)), func(s Stats) uint64 { return s.RejectedAuth }},
		{"truncated", kindData, truncated(sealAs(peer, kindData, appendReset(nil))), func(s Stats) uint64 { return s.RejectedAuth }},
		{"replayed, another payload", kindData, append(bytes.Clone(good[:headerLen+tagLen]), sealAs(peer, kindData, appendReset(nil))[headerLen+tagLen:]...), func(s Stats) uint64 { return s.RejectedReplay }},
		{"garbage", kindData, []byte(strings.Repeat("garbage!", 10)), func(s Stats) uint64 { return s.RejectedMalformed }},
		{"empty", kindData, nil, func(s Stats) uint64 { return s.RejectedMalformed }},
		{"wrong subject", kindSyncData, sealAs(peer, kindData, appendReset(nil)), func(s Stats) uint64 { return s.RejectedMalformed }},
		{"reset in a catch-up", kindSyncData, sealTo(peer, n.id, kindSyncData, appendReset(nil)), func(s Stats) uint64 { return s.RejectedMalformed }},
		{"catch-up for another node", kindSyncData, sealTo(peer, n.id+1, kindSyncData, appendReset(nil)), func(s Stats) uint64 { return s.RejectedAuth }},
		{"stale", kindData, seal(nil, peer.aead, header{kind: kindData, sender: peer.id, seq: peer.seq.Add(1), nanos: time.Now().Add(-time.Hour).UnixNano()}, appendReset(nil)), func(s Stats) uint64 { return s.RejectedStale }},
		{"future", kindData, seal(nil, peer.aead, header{kind: kindData, sender: peer.id, seq: peer.seq.Add(1), nanos: time.Now().Add(time.Hour).UnixNano()}, appendReset(nil)), func(s Stats) uint64 { return s.RejectedStale }},
		{"bad records", kindData, sealAs(peer, kindData, []byte{recBinding, 200}), func(s Stats) uint64 { return s.RejectedMalformed }},
		{"bomb", kindData, sealAs(peer, kindData, appendDecision(nil, "m", "u", textS2, 100, []byte("not s2 at all"))), func(s Stats) uint64 { return s.RejectedMalformed }},
	}
	for _, c := range cases {
		before := c.counter(n.Stats())
		n.receive(c.kind, c.msg)
		if got := c.counter(n.Stats()); got != before+1 {
			t.Errorf("%s: counter %d → %d, want +1", c.name, before, got)
		}
		if calls := len(r.got()); calls != 1 {
			t.Fatalf("%s: applied (%d calls)", c.name, calls)
		}
	}
	// The node's own messages coming back are ignored, not applied.
	n.receive(kindData, sealAs(n, kindData, appendReset(nil)))
	if len(r.got()) != 1 || n.Stats().Peers[0].ID != peer.ID() {
		t.Error("own message applied or counted as a peer")
	}
}

func truncated(msg []byte) []byte { return msg[:len(msg)-1] }

func TestReceiveFlood(t *testing.T) {
	cfg := testConfig()
	cfg.PeerRate = 100
	n, r := newTestNode(t, cfg)
	peer, _ := newTestNode(t, cfg)
	start := time.Now()
	for i := 0; i < 1000; i++ {
		n.receive(kindData, sealAs(peer, kindData, appendForget(nil, "k")))
	}
	elapsed := time.Since(start)
	applied := len(r.got())
	// The burst is twice the rate, and the bucket refills at the rate while the flood runs:
	// a few milliseconds, or a second under -race on a loaded machine, which must not fail it.
	refill := int(elapsed.Seconds()*float64(cfg.PeerRate)) + 1
	if applied < 200 || applied > 200+refill {
		t.Errorf("applied %d of 1000 flooded messages in %v, want 200 (the burst) to %d (the burst and what refilled meanwhile)", applied, elapsed, 200+refill)
	}
	if applied >= 1000 {
		t.Fatalf("the flood took %v: too slow to tell the limit from none", elapsed)
	}
	if s := n.Stats(); s.DroppedFlood != uint64(1000-applied) {
		t.Errorf("DroppedFlood = %d, want %d", s.DroppedFlood, 1000-applied)
	}
}

func TestReceivePeerBound(t *testing.T) {
	cfg := testConfig()
	cfg.MaxPeers = 3
	n, _ := newTestNode(t, cfg)
	for i := 0; i < 10; i++ {
		p, _ := newTestNode(t, cfg)
		n.receive(kindData, sealAs(p, kindData, appendLoad(nil, []peerCount{{"u", 1}})))
	}
	s := n.Stats()
	if len(s.Peers) != 3 || s.DroppedPeers != 7 || n.PeerLoad("u") != 3 {
		t.Errorf("peers %d, dropped %d, load %d; want 3, 7, 3", len(s.Peers), s.DroppedPeers, n.PeerLoad("u"))
	}
}

// The TTL is checked at a time given to expire, not by sleeping past it: receiving rebuilds the
// loads at the real time, so a TTL short enough to sleep past could expire b while the test
// waits for its turn on a loaded machine.
func TestPeerLoadExpires(t *testing.T) {
	cfg := testConfig()
	cfg.LoadTTL = time.Minute
	n, _ := newTestNode(t, cfg)
	a, _ := newTestNode(t, cfg)
	b, _ := newTestNode(t, cfg)
	n.receive(kindData, sealAs(a, kindData, appendLoad(nil, []peerCount{{"u1", 2}, {"u2", 1}})))
	n.receive(kindData, sealAs(b, kindData, appendLoad(nil, []peerCount{{"u1", 5}})))
	if got := n.PeerLoad("u1"); got != 7 {
		t.Fatalf("PeerLoad(u1) = %d, want 7", got)
	}
	// A newer record replaces the peer's counts; an upstream left out counts 0.
	n.receive(kindData, sealAs(a, kindData, appendLoad(nil, []peerCount{{"u1", 1}})))
	if got, got2 := n.PeerLoad("u1"), n.PeerLoad("u2"); got != 6 || got2 != 0 {
		t.Fatalf("after update: u1 %d u2 %d, want 6 0", got, got2)
	}
	time.Sleep(time.Millisecond) // b speaks strictly later than a did
	bHeard := time.Now()         // b's counts are at least this recent
	n.receive(kindData, sealAs(b, kindData, appendLoad(nil, []peerCount{{"u1", 5}})))
	// One TTL after b spoke: a's counts, heard before, are past their TTL, b's are not.
	n.expire(bHeard.Add(cfg.LoadTTL))
	if got := n.PeerLoad("u1"); got != 5 {
		t.Errorf("after a's TTL: PeerLoad(u1) = %d, want 5 (b only)", got)
	}
	n.expire(time.Now().Add(cfg.LoadTTL + time.Second))
	if got := n.PeerLoad("u1"); got != 0 {
		t.Errorf("after b's TTL: PeerLoad(u1) = %d, want 0", got)
	}
}

func TestReceiveFragments(t *testing.T) {
	n, r := newTestNode(t, testConfig())
	peer, _ := newTestNode(t, testConfig())
	text := textOf(100000)
	rec := appendDecision(nil, "m", "u", textRaw, len(text), []byte(text))
	frags := func(id uint64, size int) [][]byte {
		var out [][]byte
		total := uint64((len(rec) + size - 1) / size)
		for i := uint64(0); i < total; i++ {
			chunk := rec[int(i)*size : min(len(rec), int(i+1)*size)]
			out = append(out, sealAs(peer, kindData, appendFragment(nil, fragment{id: id, index: i, total: total, chunk: chunk})))
		}
		return out
	}
	for _, m := range frags(1, 30000) {
		n.receive(kindData, m)
	}
	if got := r.got(); len(got) != 1 || !strings.HasPrefix(got[0], "decision m u 100000:") {
		t.Fatalf("reassembled: %q", got)
	}
	// A missing fragment loses the record, counted, and the next one still works.
	fs := frags(2, 30000)
	for i, m := range fs {
		if i != 1 {
			n.receive(kindData, m)
		}
	}
	if len(r.got()) != 1 || n.Stats().FragmentsLost == 0 {
		t.Errorf("record with a missing fragment: calls %d, lost %d", len(r.got()), n.Stats().FragmentsLost)
	}
	for _, m := range frags(3, 30000) {
		n.receive(kindData, m)
	}
	if len(r.got()) != 2 {
		t.Errorf("after a lost record: %d calls, want 2", len(r.got()))
	}
	// Fragments that add up to more than a record may hold are refused, not buffered.
	cfg := testConfig()
	cfg.MaxText = 1000
	small, sr := newTestNode(t, cfg)
	for _, m := range frags(4, 1000) {
		small.receive(kindData, m)
	}
	if len(sr.got()) != 0 || small.Stats().RejectedMalformed == 0 {
		t.Errorf("oversized fragments: calls %d", len(sr.got()))
	}
}

// TestSeenOnlyAfterSync: a live message from a peer says nothing of what it published before,
// so a catch-up request still asks that peer for everything until it answered once.
func TestSeenOnlyAfterSync(t *testing.T) {
	n, _ := newTestNode(t, testConfig())
	old, _ := newTestNode(t, testConfig())
	fresh, _ := newTestNode(t, testConfig())
	n.receive(kindData, sealAs(old, kindData, appendLoad(nil, nil)))
	if s := n.seen(); len(s) != 0 {
		t.Fatalf("seen after a live message only: %v", s)
	}
	// A request after a reconnect is no sign of a fresh start either.
	n.receive(kindSyncReq, sealAs(old, kindSyncReq, appendSyncReq(nil, false, nil)))
	if s := n.seen(); len(s) != 0 {
		t.Fatalf("seen after a peer's reconnect request: %v", s)
	}
	<-n.syncJobs
	n.receive(kindSyncData, sealTo(old, n.id, kindSyncData, nil))
	n.receive(kindSyncReq, sealAs(fresh, kindSyncReq, appendSyncReq(nil, true, nil)))
	s := n.seen()
	if len(s) != 2 {
		t.Fatalf("seen after a reply and a request: %v", s)
	}
	for _, e := range s {
		if (e.peer == old.id && e.seq != 3) || (e.peer == fresh.id && e.seq != 1) {
			t.Errorf("seen %v", s)
		}
	}
	if j := <-n.syncJobs; j.to != fresh.id || j.since != 0 {
		t.Errorf("sync job %+v", j)
	}
}

// TestFragmentBudget: many peers each holding a half-assembled record may not multiply memory.
func TestFragmentBudget(t *testing.T) {
	cfg := testConfig()
	cfg.MaxText = 10000
	n, _ := newTestNode(t, cfg)
	chunk := make([]byte, maxRecord(cfg.MaxText)*3/4)
	for i := 0; i < 5; i++ {
		p, _ := newTestNode(t, cfg)
		n.receive(kindData, sealAs(p, kindData, appendFragment(nil, fragment{id: 1, index: 0, total: 2, chunk: chunk})))
	}
	n.rmu.Lock()
	held := n.fragBytes
	n.rmu.Unlock()
	if held > 2*maxRecord(cfg.MaxText) || held == 0 {
		t.Errorf("5 peers' partial records hold %d bytes, bound %d", held, 2*maxRecord(cfg.MaxText))
	}
	if lost := n.Stats().FragmentsLost; lost != 3 {
		t.Errorf("FragmentsLost = %d, want 3", lost)
	}
}

func TestSessionKey(t *testing.T) {
	n, _ := newTestNode(t, testConfig())
	other, _ := newTestNode(t, testConfig())
	wrong := testConfig()
	wrong.Secret = "some-other-secret-value"
	x, _ := newTestNode(t, wrong)
	k := n.SessionKey("conv-1")
	if len(k) != 32 || k != other.SessionKey("conv-1") || k == n.SessionKey("conv-2") || k == x.SessionKey("conv-1") {
		t.Errorf("session keys: %q %q %q %q", k, other.SessionKey("conv-1"), n.SessionKey("conv-2"), x.SessionKey("conv-1"))
	}
	if huge := strings.Repeat("x", 1<<20); n.SessionKey(huge) == k {
		t.Error("a megabyte id digests like conv-1")
	}
	if a := testing.AllocsPerRun(100, func() { _ = n.SessionKey("conv-1") }); a > 1 && !raceEnabled {
		t.Errorf("SessionKey allocates %v times, want 1 (its result)", a)
	}
}

// TestFirstRequestAfterLoss: a peer whose first request says it lost what it published before
// its first connection is asked for its log, not taken as holding nothing from before.
func TestFirstRequestAfterLoss(t *testing.T) {
	n, _ := newTestNode(t, testConfig())
	fresh, _ := newTestNode(t, testConfig())
	n.receive(kindSyncReq, sealAs(fresh, kindSyncReq, appendSyncRequest(nil, true, true, nil)))
	if s := n.seen(); len(s) != 0 {
		t.Errorf("a peer that lost its first messages counts as synced: %v", s)
	}
	select {
	case <-n.syncKick:
	default:
		t.Error("no catch-up request of its own after a peer's first request with losses")
	}
	if j := <-n.syncJobs; j.to != fresh.id || j.since != 0 {
		t.Errorf("sync job %+v: the peer's request must still be answered", j)
	}
}
