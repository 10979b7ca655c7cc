package cluster

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// wire collects the messages a node seals, by subject, in the order it sent them.
type wire struct {
	mu   sync.Mutex
	msgs []wireMsg
}

type wireMsg struct {
	subject string
	msg     []byte
}

func (w *wire) take() []wireMsg {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.msgs
	w.msgs = nil
	return out
}

// sender is a node whose real flusher and catch-up server run, its messages caught on a wire
// instead of NATS.
func sender(t *testing.T, cfg Config) (*Node, *wire) {
	t.Helper()
	n, w := idleSender(t, cfg)
	n.wg.Add(1)
	go n.flusher()
	return n, w
}

// idleSender is sender before its flusher starts: what is published meanwhile waits in the
// queue, and the first batch holds all of it, however slowly the test runs.
func idleSender(t *testing.T, cfg Config) (*Node, *wire) {
	t.Helper()
	n, _ := newTestNode(t, cfg)
	w := &wire{}
	n.out = func(subject string, msg []byte) {
		w.mu.Lock()
		w.msgs = append(w.msgs, wireMsg{subject, bytes.Clone(msg)})
		w.mu.Unlock()
	}
	return n, w
}

// flushed waits until n's flusher put entries log entries in its catch-up log and returns the
// live messages it sent.
func flushed(t *testing.T, n *Node, w *wire, entries int) []wireMsg {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		if _, e := n.own.size(); e >= entries {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flusher logged fewer than %d entries", entries)
		}
		time.Sleep(time.Millisecond)
	}
	return w.take()
}

// reply is n's real answer to a catch-up request of to that holds nothing from n after since.
func reply(t *testing.T, n *Node, w *wire, to *Node, since uint64) []wireMsg {
	t.Helper()
	if !n.serveSync(syncJob{to: to.id, since: since}) {
		t.Fatal("serveSync: node closing")
	}
	// The flusher keeps running meanwhile (a load message every load_interval): only the
	// messages on the reply's subject are the reply; the others stay on the wire.
	return w.takeSubject(n.prefix + "to." + to.idHex)
}

// takeSubject removes and returns the messages sent on subject, leaving the others.
func (w *wire) takeSubject(subject string) []wireMsg {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out, rest []wireMsg
	for _, m := range w.msgs {
		if m.subject == subject {
			out = append(out, m)
		} else {
			rest = append(rest, m)
		}
	}
	w.msgs = rest
	return out
}

func deliver(n *Node, kind byte, msgs []wireMsg) {
	for _, m := range msgs {
		n.receive(kind, m.msg)
	}
}

// store is a Handler that keeps bindings as the session store does: a peer's binding only
// when BindingNewer says it replaces the one held.
type store struct {
	recorder
	mu sync.Mutex
	m  map[string]heldBinding
}

type heldBinding struct {
	upstream string
	at       time.Time
}

func (s *store) Binding(model, sk, upstream string, at time.Time) bool {
	s.recorder.Binding(model, sk, upstream, at)
	s.mu.Lock()
	defer s.mu.Unlock()
	k := model + " " + sk
	if h, ok := s.m[k]; !ok || BindingNewer(at, upstream, h.at, h.upstream) {
		s.m[k] = heldBinding{upstream, at}
		return true
	}
	return false
}

// Forget drops the session's bindings, as the session store does.
func (s *store) Forget(sk string) {
	s.recorder.Forget(sk)
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.m {
		if strings.HasSuffix(k, " "+sk) {
			delete(s.m, k)
		}
	}
}

func (s *store) get(model, sk string) heldBinding {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[model+" "+sk]
}

func storeNode(t *testing.T) (*Node, *store) {
	t.Helper()
	s := &store{m: map[string]heldBinding{}}
	n, _, err := newNode(testConfig(), s, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, s
}

// TestBindingsConvergeToNewest: a session bound on A to u1, then rebound on B to u2; a replica
// that hears B's binding first and A's older one later (live, or in catch-up replies from
// both) must end on u2 like everyone else, and so must one that hears them in order.
func TestBindingsConvergeToNewest(t *testing.T) {
	cfg := testConfig()
	cfg.FlushDelay = time.Millisecond
	a, aw := sender(t, cfg)
	b, bw := sender(t, cfg)
	sk := a.SessionKey("conv-1")
	t1 := time.Now().Add(-time.Second)
	t2 := t1.Add(time.Millisecond)
	a.PublishBinding("m", sk, "u1", t1)
	aLive := flushed(t, a, aw, 1)
	b.PublishBinding("m", sk, "u2", t2)
	bLive := flushed(t, b, bw, 1)
	if len(aLive) != 1 || len(bLive) != 1 {
		t.Fatalf("live messages: a %d, b %d, want 1 each", len(aLive), len(bLive))
	}

	for _, tc := range []struct {
		name  string
		order func(c *Node) (first, second []wireMsg, kind byte)
	}{
		{"live, newest first", func(*Node) ([]wireMsg, []wireMsg, byte) { return bLive, aLive, kindData }},
		{"catch-up, newest first", func(c *Node) ([]wireMsg, []wireMsg, byte) {
			return reply(t, b, bw, c, 0), reply(t, a, aw, c, 0), kindSyncData
		}},
		{"catch-up, oldest first", func(c *Node) ([]wireMsg, []wireMsg, byte) {
			return reply(t, a, aw, c, 0), reply(t, b, bw, c, 0), kindSyncData
		}},
	} {
		c, st := storeNode(t)
		first, second, kind := tc.order(c)
		deliver(c, kind, first)
		deliver(c, kind, second)
		if got := len(st.got()); got != 2 {
			t.Errorf("%s: %d bindings handed over, want 2", tc.name, got)
		}
		if h := st.get("m", sk); h.upstream != "u2" || !h.at.Equal(t2) {
			t.Errorf("%s: bound to %s at %v, want u2 at %v (the newest binding)", tc.name, h.upstream, h.at, t2)
		}
	}
	// Mixed: B's binding live, then A's older one in a catch-up reply.
	c, st := storeNode(t)
	deliver(c, kindData, bLive)
	deliver(c, kindSyncData, reply(t, a, aw, c, 0))
	if h := st.get("m", sk); h.upstream != "u2" {
		t.Errorf("live then catch-up: bound to %s, want u2", h.upstream)
	}
}

func TestBindingNewer(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cases := []struct {
		at     time.Time
		up     string
		heldAt time.Time
		held   string
		want   bool
	}{
		{t0.Add(1), "a", t0, "b", true},
		{t0, "b", t0.Add(1), "a", false},
		{t0, "b", t0, "a", true}, // a tie goes to the greater upstream, on every replica
		{t0, "a", t0, "b", false},
		{t0, "a", t0, "a", false},
		{time.Time{}, "a", t0, "b", false}, // unknown time replaces nothing held
		{t0, "a", time.Time{}, "b", true},
	}
	for _, c := range cases {
		if got := BindingNewer(c.at, c.up, c.heldAt, c.held); got != c.want {
			t.Errorf("BindingNewer(%v %s, %v %s) = %v, want %v", c.at, c.up, c.heldAt, c.held, got, c.want)
		}
	}
}

// TestLiveAndCatchUpAppliedOnce: after a NATS restart a replica can hear a peer's batch live
// and again in the catch-up reply to the request it sent on reconnecting, in either order. The
// decisions and bindings of that batch are applied once (the rest counted as duplicates),
// while a forget in the live batch, which no reply carries, still applies.
func TestLiveAndCatchUpAppliedOnce(t *testing.T) {
	cfg := testConfig()
	cfg.FlushDelay = 20 * time.Millisecond
	a, aw := idleSender(t, cfg)
	text := textOf(3000)
	a.PublishDecision("m", "u1", text)
	a.PublishBinding("m", a.SessionKey("s1"), "u1", time.Time{})
	a.PublishForget(a.SessionKey("gone"))
	a.wg.Add(1)
	go a.flusher() // one batch: a flush between two of the publishes would split it
	live := flushed(t, a, aw, 2)
	if len(live) != 1 {
		t.Fatalf("%d live messages, want 1 batch", len(live))
	}
	want := []string{
		fmt.Sprintf("decision m u1 3000:%s", short(text)),
		"binding m " + a.SessionKey("s1") + " u1",
		"forget " + a.SessionKey("gone"),
	}
	for _, liveFirst := range []bool{true, false} {
		c, r := newTestNode(t, testConfig())
		catchUp := reply(t, a, aw, c, 0)
		if liveFirst {
			deliver(c, kindData, live)
			deliver(c, kindSyncData, catchUp)
		} else {
			deliver(c, kindSyncData, catchUp)
			deliver(c, kindData, live)
		}
		// Either way: the batch's decision and binding once, its forget (live only) once.
		if got := r.got(); !reflect.DeepEqual(got, want) {
			t.Errorf("live first %v: applied %q\nwant %q", liveFirst, got, want)
		}
		s := c.Stats()
		if s.Duplicates != 2 || s.DecisionsReceived != 1 || s.BindingsReceived != 1 || s.Rejected() != 0 {
			t.Errorf("live first %v: duplicates %d, decisions %d, bindings %d, rejected %d; want 2, 1, 1, 0",
				liveFirst, s.Duplicates, s.DecisionsReceived, s.BindingsReceived, s.Rejected())
		}
	}
}

// TestCatchUpOfUnheardApplies: what a reply brings that was never heard live (a joiner's
// history, a batch lost while NATS was down) is applied, and a second reply covering the same
// messages (two requests close together) is not applied again.
func TestCatchUpOfUnheardApplies(t *testing.T) {
	cfg := testConfig()
	cfg.FlushDelay = time.Millisecond
	a, aw := sender(t, cfg)
	for i := range 3 {
		a.PublishDecision("m", "u1", fmt.Sprintf("conversation %d", i))
		flushed(t, a, aw, i+1)
	}
	a.PublishDecision("m", "u1", "conversation 3")
	live := flushed(t, a, aw, 4)
	c, r := newTestNode(t, testConfig())
	deliver(c, kindData, live) // only the last batch was heard live
	deliver(c, kindSyncData, reply(t, a, aw, c, 0))
	// served remembers what c was sent: clear it to serve the same records again.
	clear(a.served)
	deliver(c, kindSyncData, reply(t, a, aw, c, 0))
	got := r.got()
	if len(got) != 4 || c.Stats().Duplicates != 1+4 {
		t.Errorf("applied %d decisions (%q), duplicates %d; want 4, 5", len(got), got, c.Stats().Duplicates)
	}
}

// TestOldPeerRecords: a version 1 peer's message (bindings without a time, no origin records)
// is read: a live binding takes its message's time, a catch-up one an unknown time; a version
// 1 message with an origin record is malformed, and nothing panics.
func TestOldPeerRecords(t *testing.T) {
	n, st := storeNode(t)
	peer, _ := newTestNode(t, testConfig())
	sealV1 := func(kind byte, to uint64, plain []byte) []byte {
		return seal(nil, peer.aead, header{version: 1, kind: kind, sender: peer.id, seq: peer.seq.Add(1), nanos: time.Now().UnixNano(), to: to}, plain)
	}
	v1Binding := func(sk, upstream string) []byte {
		b := append([]byte{recBinding}, 1, 'm')
		b = appendString(b, sk)
		return appendString(b, upstream)
	}
	before := time.Now()
	n.receive(kindData, sealV1(kindData, 0, v1Binding("k1", "u1")))
	if h := st.get("m", "k1"); h.upstream != "u1" || h.at.Before(before.Add(-time.Second)) || h.at.After(time.Now()) {
		t.Errorf("old peer's live binding: %+v", h)
	}
	// A catch-up binding of unknown time applies where none is held, and replaces nothing.
	n.receive(kindSyncData, sealV1(kindSyncData, n.id, append(v1Binding("k2", "u2"), v1Binding("k1", "u9")...)))
	if h1, h2 := st.get("m", "k1"), st.get("m", "k2"); h1.upstream != "u1" || h2.upstream != "u2" || !h2.at.IsZero() {
		t.Errorf("old peer's catch-up bindings: k1 %+v, k2 %+v", h1, h2)
	}
	bad := n.Stats().RejectedMalformed
	n.receive(kindSyncData, sealV1(kindSyncData, n.id, appendOrigin(nil, 1)))
	if n.Stats().RejectedMalformed != bad+1 {
		t.Error("origin record in a version 1 message accepted")
	}
	// Version 4 is not read.
	v3 := seal(nil, peer.aead, header{version: 4, kind: kindData, sender: peer.id, seq: peer.seq.Add(1), nanos: time.Now().UnixNano()}, appendReset(nil))
	n.receive(kindData, v3)
	if n.Stats().RejectedMalformed != bad+2 || strings.Contains(strings.Join(st.got(), ","), "reset") {
		t.Error("version 4 message accepted")
	}
}

// TestBindingFromTheFuture: a binding dated beyond the replay window after its message cannot
// win for longer than a message may be early.
func TestBindingFromTheFuture(t *testing.T) {
	n, st := storeNode(t)
	peer, _ := newTestNode(t, testConfig())
	far := time.Now().Add(time.Hour).UnixNano()
	n.receive(kindData, sealAs(peer, kindData, appendBinding(nil, "m", "k", "u", far)))
	if h := st.get("m", "k"); h.upstream != "" || n.Stats().RejectedStale != 1 {
		t.Errorf("future binding applied: %+v, stale %d", h, n.Stats().RejectedStale)
	}
}

// TestReconnectAsksFromBeforeTheGap: live messages that arrive after a reconnect but before the
// catch-up request goes out must not hide what the peer sent while this node was away: the
// request asks from what was heard when the connection went, until the peer answers.
func TestReconnectAsksFromBeforeTheGap(t *testing.T) {
	n, _ := newTestNode(t, testConfig())
	peer, _ := newTestNode(t, testConfig())
	n.receive(kindData, sealAs(peer, kindData, appendLoad(nil, nil))) // seq 1
	n.receive(kindSyncData, sealTo(peer, n.id, kindSyncData, nil))    // seq 2: synced
	n.receive(kindData, sealAs(peer, kindData, appendLoad(nil, nil))) // seq 3
	n.lostConnection()
	peer.seq.Add(5)                                                   // seqs 4-8 lost
	n.receive(kindData, sealAs(peer, kindData, appendLoad(nil, nil))) // seq 9, after the reconnect
	if s := n.seen(); len(s) != 1 || s[0].seq != 3 {
		t.Fatalf("seen after a reconnect: %v, want the peer at 3 (when the connection went)", s)
	}
	n.lostConnection() // a second blip before the answer keeps the first gap
	if s := n.seen(); len(s) != 1 || s[0].seq != 3 {
		t.Fatalf("seen after a second disconnect: %v, want 3", s)
	}
	n.receive(kindSyncData, sealTo(peer, n.id, kindSyncData, nil)) // seq 10: the answer
	if s := n.seen(); len(s) != 1 || s[0].seq != 10 {
		t.Fatalf("seen after the peer answered: %v, want 10", s)
	}
}
