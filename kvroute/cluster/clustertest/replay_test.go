package clustertest

import (
	"bytes"
	"encoding/binary"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// recording is what a raw NATS client without the secret captured of a fleet's subjects, byte
// for byte.
type recording struct {
	mu   sync.Mutex
	msgs []*nats.Msg
	sub  *nats.Subscription
}

func record(t testing.TB, nc *nats.Conn, subject string) *recording {
	t.Helper()
	r := &recording{}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		r.mu.Lock()
		r.msgs = append(r.msgs, &nats.Msg{Subject: m.Subject, Data: bytes.Clone(m.Data)})
		r.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	r.sub = sub
	return r
}

// from is how many messages of the tape the node whose id is id sent.
func (r *recording) from(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if len(m.Data) >= 27 && strconv.FormatUint(binary.BigEndian.Uint64(m.Data[3:11]), 16) == id {
			n++
		}
	}
	return n
}

// stop ends the recording and returns it, and when its newest message was sealed (the time in
// its clear header).
func (r *recording) stop(t testing.TB) ([]*nats.Msg, time.Time) {
	t.Helper()
	if err := r.sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var last int64
	for _, m := range r.msgs {
		if len(m.Data) >= 27 {
			last = max(last, int64(binary.BigEndian.Uint64(m.Data[19:27])))
		}
	}
	return r.msgs, time.Unix(0, last)
}

// joinSkew is how far before a node joined a message may be sealed and still be read
// (cluster's joinSkew): a recording replayed into a joiner must be older than that.
const joinSkew = time.Second

// TestJoinerRefusesARecording: someone with NATS access but not the secret records what a
// replica publishes (decisions, a binding, an admin forget and reset, loads, its sync request),
// and replays it, byte for byte, into a replica that joined later and learned the fleet's state
// through the catch-up. None of it applies: no reset, no forget, no old decision, binding or
// load; the joiner counts every replayed message as a replay.
func TestJoinerRefusesARecording(t *testing.T) {
	s := startNATS(t, nil)
	rec, err := nats.Connect(s.url())
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	tape := record(t, rec, "kvroute.fleet-t.>")

	a := join(t, config(s.url()))
	// w, a replica with the secret, witnesses what a publishes, so the test knows when it
	// went out.
	w := join(t, config(s.url()))
	connected(t, a, w)
	a.loads.set(map[string]int64{"10.0.0.1:8000": 7})
	a.LoadChanged()
	eventually(t, 5*time.Second, "w counts a's load", func() bool { return w.PeerLoad("10.0.0.1:8000") == 7 })
	a.PublishDecision("m", "10.0.0.1:8000", "old decision, reset since")
	a.PublishBinding("m", a.SessionKey("old"), "10.0.0.1:8000", time.Now())
	a.PublishForget(a.SessionKey("forgotten"))
	a.PublishReset()
	a.PublishDecision("m", "10.0.0.2:8000", "kept decision")
	a.PublishBinding("m", a.SessionKey("kept"), "10.0.0.2:8000", time.Now())
	a.loads.set(nil)
	a.LoadChanged()
	eventually(t, 5*time.Second, "w applies a's records", func() bool {
		d, _ := w.st.applied()
		w.st.mu.Lock()
		defer w.st.mu.Unlock()
		return d == 2 && w.st.resets == 1 && len(w.st.forgets) == 1 && w.st.bindings["m "+w.SessionKey("kept")] == "10.0.0.2:8000" && w.PeerLoad("10.0.0.1:8000") == 0
	})
	// Everything a sent is on the tape (the recorder subscribed before a started).
	sent := a.Stats().Sent
	eventually(t, 5*time.Second, "the recorder captured all a sent", func() bool { return tape.from(a.ID()) >= int(sent) })
	msgs, lastSealed := tape.stop(t)
	// What the recording holds was all sealed before b joins, by more than the skew a joiner
	// allows for clocks.
	eventually(t, 5*time.Second, "the recording is older than the join skew", func() bool { return time.Since(lastSealed) > joinSkew+100*time.Millisecond })

	b := join(t, config(s.url()))
	connected(t, b)
	eventually(t, 5*time.Second, "b catches up from a", func() bool {
		d, _ := b.st.applied()
		b.st.mu.Lock()
		defer b.st.mu.Unlock()
		return d == 1 && b.st.bindings["m "+b.SessionKey("kept")] == "10.0.0.2:8000"
	})
	before := b.Stats()
	// Replies addressed to a node that is gone are on no subject b listens to.
	heard := 0
	for _, m := range msgs {
		if !strings.Contains(m.Subject, ".to.") {
			heard++
		}
		if err := rec.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := rec.Flush(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "b receives the replayed recording", func() bool {
		return b.Stats().Received >= before.Received+uint64(heard)
	})
	after := b.Stats()
	b.st.mu.Lock()
	defer b.st.mu.Unlock()
	var texts []string
	for _, d := range b.st.decisions {
		texts = append(texts, d.text)
	}
	if len(texts) != 1 || texts[0] != "kept decision" || b.st.resets != 0 || len(b.st.forgets) != 0 || len(b.st.bindings) != 1 {
		t.Errorf("replayed recording of %d messages applied on the joiner: decisions %q, resets %d, forgets %d, bindings %v",
			len(msgs), texts, b.st.resets, len(b.st.forgets), b.st.bindings)
	}
	if got := b.PeerLoad("10.0.0.1:8000"); got != 0 {
		t.Errorf("replayed load record applied: b counts %d of a's requests, a holds none", got)
	}
	if refused := after.RejectedReplay - before.RejectedReplay; refused != uint64(heard) {
		t.Errorf("b refused %d of the %d replayed messages it heard as replays (stats %+v)", refused, heard, after)
	}
}
