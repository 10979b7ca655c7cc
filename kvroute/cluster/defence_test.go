package cluster

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// sealAt seals plain as a message from n sealed at time at.
func sealAt(n *Node, kind byte, to uint64, at time.Time, plain []byte) []byte {
	return seal(nil, n.aead, header{kind: kind, sender: n.id, seq: n.seq.Add(1), nanos: at.UnixNano(), to: to}, plain)
}

// TestJoinerRefusesWhatWasSealedBeforeIt: live messages sealed before this node joined the
// fleet (its first subscription), beyond the skew allowed for clocks, are replays: a decision,
// a binding, a forget, a reset, a load record or a sync request captured earlier applies
// nothing. History comes through the catch-up, addressed to this node: a reply applies, the
// same reply replayed to it again or to another node does not.
func TestJoinerRefusesWhatWasSealedBeforeIt(t *testing.T) {
	n, st := storeNode(t)
	other, ost := storeNode(t)
	peer, _ := newTestNode(t, testConfig())
	now := time.Now()
	n.joined.Store(now.UnixNano())
	other.joined.Store(now.UnixNano())
	old := now.Add(-joinSkew - 100*time.Millisecond)
	dec, _, _ := peer.encodeDecision("m", "u1", "an old decision", nil, nil)
	captured := []struct {
		kind  byte
		plain []byte
	}{
		{kindData, dec},
		{kindData, appendBinding(nil, "m", "k", "u1", old.UnixNano())},
		{kindData, appendForget(nil, "k")},
		{kindData, appendReset(nil)},
		{kindData, appendLoad(nil, []peerCount{{"u1", 9}})},
		{kindSyncReq, appendSyncReq(nil, true, nil)},
	}
	for i, c := range captured {
		n.receive(c.kind, sealAt(peer, c.kind, 0, old, c.plain))
		if s := n.Stats(); s.RejectedReplay != uint64(i+1) {
			t.Fatalf("captured message %d: RejectedReplay %d, want %d", i, s.RejectedReplay, i+1)
		}
	}
	if got := st.got(); len(got) != 0 || n.PeerLoad("u1") != 0 || len(n.syncJobs) != 0 || len(n.Stats().Peers) != 0 {
		t.Fatalf("messages sealed before the node joined applied: %q, load %d, sync jobs %d", got, n.PeerLoad("u1"), len(n.syncJobs))
	}

	// Within the skew, a message is read: a sender whose clock is a little behind.
	n.receive(kindData, sealAt(peer, kindData, 0, now.Add(-joinSkew/2), appendLoad(nil, []peerCount{{"u1", 2}})))
	if n.PeerLoad("u1") != 2 {
		t.Errorf("a message sealed within the join skew was refused")
	}
	// The catch-up reply brings the history.
	rep := sealTo(peer, n.id, kindSyncData, append(appendOrigin(nil, 1), appendBinding(nil, "m", "k2", "u2", time.Now().UnixNano())...))
	n.receive(kindSyncData, rep)
	if h := st.get("m", "k2"); h.upstream != "u2" {
		t.Fatalf("catch-up reply not applied: %+v", h)
	}
	// Captured, it applies neither to its recipient again nor to another node.
	n.receive(kindSyncData, rep)
	if s := n.Stats(); s.RejectedReplay != uint64(len(captured))+1 {
		t.Errorf("a reply replayed to its recipient: RejectedReplay %d", s.RejectedReplay)
	}
	other.receive(kindSyncData, rep)
	if s := other.Stats(); s.RejectedAuth != 1 || len(ost.got()) != 0 {
		t.Errorf("a reply replayed to another node: RejectedAuth %d, applied %q", s.RejectedAuth, ost.got())
	}
	// A live message sealed after the node joined applies.
	n.receive(kindData, sealAs(peer, kindData, appendForget(nil, "k2")))
	if h := st.get("m", "k2"); h.upstream != "" {
		t.Errorf("live forget not applied: %+v", h)
	}
}

// TestForgedFloodCostsNoPayload: someone without the secret forges messages that claim live
// peers' ids (and a joiner's, and catch-up replies to this node) with a current time and a
// fresh sequence number. Each is turned away on its header, before its payload is decrypted or
// a buffer allocated for it, and the honest messages among them all apply: live decisions and
// loads, a new peer's first sync request, a catch-up reply.
func TestForgedFloodCostsNoPayload(t *testing.T) {
	n, r := newTestNode(t, testConfig())
	live, _ := newTestNode(t, testConfig())
	joiner, _ := newTestNode(t, testConfig())
	n.receive(kindData, sealAs(live, kindData, appendLoad(nil, nil)))

	const size = 1 << 20
	seq := uint64(1 << 40)
	forge := func(sender uint64, kind byte) []byte {
		seq++
		return forged(sender, seq, kind, size)
	}
	msgs := []struct {
		kind byte
		msg  []byte
	}{{kindData, forge(live.id, kindData)}, {kindSyncData, forge(live.id, kindSyncData)}, {kindData, forge(joiner.id, kindData)}, {kindSyncReq, forge(joiner.id, kindSyncReq)}}
	honest := 0
	for i := 0; i < 400; i++ {
		m := msgs[i%len(msgs)]
		binary.BigEndian.PutUint64(m.msg[11:], seq+uint64(i))
		binary.BigEndian.PutUint64(m.msg[19:], uint64(time.Now().UnixNano()))
		n.receive(m.kind, m.msg)
		if i%40 == 0 {
			honest++
			n.receive(kindData, sealAs(live, kindData, appendLoad(appendDecision(nil, "m", "u", textRaw, 6, []byte(fmt.Sprintf("real%02d", honest))), []peerCount{{"u", int64(honest)}})))
		}
	}
	n.receive(kindSyncReq, sealAs(joiner, kindSyncReq, appendSyncReq(nil, true, nil)))
	n.receive(kindSyncData, sealTo(live, n.id, kindSyncData, appendDecision(nil, "m", "u", textRaw, 5, []byte("reply"))))
	got := strings.Join(r.got(), "\n")
	if c := strings.Count(got, "decision m u"); c != honest+1 || n.PeerLoad("u") != int64(honest) || len(n.syncJobs) != 1 {
		t.Fatalf("honest messages in the flood: %d decisions applied of %d, load %d (want %d), sync jobs %d:\n%s", c, honest+1, n.PeerLoad("u"), honest, len(n.syncJobs), got)
	}
	if s := n.Stats(); s.RejectedAuth+s.RejectedMalformed != 400 {
		t.Errorf("forged messages rejected: auth %d, malformed %d, want 400 in all", s.RejectedAuth, s.RejectedMalformed)
	}
	if raceEnabled {
		return
	}
	// What a forged message costs in memory: nothing proportional to its size.
	m := forge(live.id, kindData)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const rounds = 100
	for i := 0; i < rounds; i++ {
		binary.BigEndian.PutUint64(m[11:], seq+uint64(1000+i))
		binary.BigEndian.PutUint64(m[19:], uint64(time.Now().UnixNano()))
		n.receive(kindData, m)
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / rounds; per > 1024 {
		t.Errorf("a forged message of %d bytes claiming a live peer allocates %d bytes", size, per)
	}
	if a := testing.AllocsPerRun(100, func() {
		seq++
		binary.BigEndian.PutUint64(m[11:], seq)
		n.receive(kindData, m)
	}); a != 0 {
		t.Errorf("a forged message claiming a live peer: %v allocations, want 0", a)
	}
}

// TestLegacyBudget: version 2 messages have no header tag, so what is opened of them is
// bounded, all senders together; an honest one within the budget still applies.
func TestLegacyBudget(t *testing.T) {
	n, r := newTestNode(t, testConfig())
	peer, _ := newTestNode(t, testConfig())
	v2 := func(plain []byte) []byte {
		return seal(nil, peer.aead, header{version: 2, kind: kindData, sender: peer.id, seq: peer.seq.Add(1), nanos: time.Now().UnixNano()}, plain)
	}
	n.receive(kindData, v2(appendForget(nil, "k")))
	if len(r.got()) != 1 {
		t.Fatal("a version 2 message does not apply")
	}
	start := time.Now()
	junk := make([]byte, 1<<20)
	const floods = 64
	for i := 0; i < floods; i++ {
		m := forged(peer.id, uint64(1<<40+i), kindData, len(junk))
		m[1] = 2
		n.receive(kindData, m)
	}
	elapsed := time.Since(start)
	s := n.Stats()
	opened := s.RejectedAuth << 20
	if bound := uint64(2*legacyRate + elapsed.Seconds()*legacyRate + 1<<20); opened > bound || s.DroppedFlood == 0 {
		t.Errorf("version 2 flood of %d MiB in %v: %d MiB opened (bound %d MiB), %d dropped", floods, elapsed, opened>>20, bound>>20, s.DroppedFlood)
	}
}

// TestOversizedSyncRequest: a sync request larger than any peer sends is turned away unopened.
func TestOversizedSyncRequest(t *testing.T) {
	n, _ := newTestNode(t, testConfig())
	peer, _ := newTestNode(t, testConfig())
	seen := make([]seenSeq, maxSeen+1)
	n.receive(kindSyncReq, sealAs(peer, kindSyncReq, appendSyncReq(nil, false, seen)))
	if s := n.Stats(); s.RejectedMalformed != 1 || len(n.syncJobs) != 0 {
		t.Errorf("oversized sync request: malformed %d, jobs %d", s.RejectedMalformed, len(n.syncJobs))
	}
	n.receive(kindSyncReq, sealAs(peer, kindSyncReq, appendSyncReq(nil, false, seen[:maxSeen])))
	if len(n.syncJobs) != 1 {
		t.Error("the largest sync request a peer sends is refused")
	}
}

// TestLateBindingAfterForget: a binding made before an admin forgot its session (or reset the
// fleet), brought late by a third peer's catch-up reply, does not bring the session back; a
// binding made after does apply. Refused bindings are not counted as applied.
func TestLateBindingAfterForget(t *testing.T) {
	n, st := storeNode(t)
	admin, _ := newTestNode(t, testConfig())
	third, _ := newTestNode(t, testConfig())
	made := time.Now().Add(-time.Second).UnixNano()
	n.receive(kindData, sealAs(third, kindData, appendBinding(nil, "m", "k", "u1", made)))
	n.receive(kindData, sealAs(admin, kindData, appendForget(nil, "k")))
	if h := st.get("m", "k"); h.upstream != "" {
		t.Fatalf("forget not applied: %+v", h)
	}
	// Its origin: a message of the third peer this node never heard live.
	n.receive(kindSyncData, sealTo(third, n.id, kindSyncData, append(appendOrigin(nil, third.seq.Add(1)), appendBinding(nil, "m", "k", "u1", made)...)))
	if h := st.get("m", "k"); h.upstream != "" {
		t.Errorf("a late reply restored a forgotten binding: %+v", h)
	}
	s := n.Stats()
	if s.BindingsReceived != 1 || s.BindingsRefused != 1 {
		t.Errorf("bindings applied %d, refused %d; want 1, 1", s.BindingsReceived, s.BindingsRefused)
	}
	n.receive(kindData, sealAs(third, kindData, appendBinding(nil, "m", "k", "u2", time.Now().UnixNano())))
	if h := st.get("m", "k"); h.upstream != "u2" {
		t.Errorf("a binding made after the forget: %+v", h)
	}
	// An older binding than the one held is refused by the Handler, and counted so.
	n.receive(kindData, sealAs(third, kindData, appendBinding(nil, "m", "k", "u3", time.Now().Add(-time.Minute).UnixNano())))
	if s := n.Stats(); s.BindingsReceived != 2 || s.BindingsRefused != 2 || st.get("m", "k").upstream != "u2" {
		t.Errorf("older binding: applied %d, refused %d, held %+v", s.BindingsReceived, s.BindingsRefused, st.get("m", "k"))
	}
	// A binding that follows a forget in the same message was made after it.
	n.receive(kindData, sealAs(admin, kindData, appendBinding(appendForget(nil, "k7"), "m", "k7", "u7", time.Now().UnixNano())))
	if h := st.get("m", "k7"); h.upstream != "u7" {
		t.Errorf("a binding after a forget in one message: %+v", h)
	}
	// A reset buries every binding made before it; a local forget buries too.
	n.receive(kindData, sealAs(admin, kindData, appendReset(nil)))
	n.receive(kindSyncData, sealTo(third, n.id, kindSyncData, append(appendOrigin(nil, third.seq.Add(1)), appendBinding(nil, "m", "k9", "u1", made)...)))
	n.PublishForget("k8")
	n.receive(kindSyncData, sealTo(third, n.id, kindSyncData, append(appendOrigin(nil, third.seq.Add(1)), appendBinding(nil, "m", "k8", "u1", time.Now().Add(-time.Millisecond).UnixNano())...)))
	if h9, h8 := st.get("m", "k9"), st.get("m", "k8"); h9.upstream != "" || h8.upstream != "" {
		t.Errorf("bindings made before a reset or a local forget: %+v %+v", h9, h8)
	}
	// A version 1 peer's live binding, dated by its message, made after the reset, applies.
	v1 := appendString(appendString(appendString([]byte{recBinding}, "m"), "k6"), "u6")
	n.receive(kindData, seal(nil, third.aead, header{version: 1, kind: kindData, sender: third.id, seq: third.seq.Add(1), nanos: time.Now().Add(n.cfg.FlushDelay).UnixNano()}, v1))
	if h := st.get("m", "k6"); h.upstream != "u6" {
		t.Errorf("a version 1 live binding after a reset: %+v", h)
	}
}

// TestReturningPeerAskedFromWhereItLeft: a peer dropped after a long silence, whose history
// this node held, is asked on its return only for what followed, not for its whole log.
func TestReturningPeerAskedFromWhereItLeft(t *testing.T) {
	n, _ := newTestNode(t, testConfig())
	peer, _ := newTestNode(t, testConfig())
	n.receive(kindSyncData, sealTo(peer, n.id, kindSyncData, nil))    // seq 1: synced
	n.receive(kindData, sealAs(peer, kindData, appendLoad(nil, nil))) // seq 2
	n.expire(time.Now().Add(2*n.cfg.ReplayWindow + n.cfg.LoadTTL + time.Second))
	if len(n.Stats().Peers) != 0 {
		t.Fatal("silent peer not dropped")
	}
	if s := n.seen(); len(s) != 1 || s[0] != (seenSeq{peer.id, 2}) {
		t.Fatalf("seen after the peer was dropped: %v, want it at 2", s)
	}
	peer.seq.Add(10)
	n.receive(kindData, sealAs(peer, kindData, appendLoad(nil, nil))) // seq 13: it is back
	if s := n.seen(); len(s) != 1 || s[0] != (seenSeq{peer.id, 2}) {
		t.Fatalf("seen after the peer came back: %v, want it at 2 until it answers", s)
	}
}
