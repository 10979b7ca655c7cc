package clustertest

import (
	"fmt"
	"net"
	"testing"
	"time"
)

// A node that starts next to a running peer reports its first catch-up over (CaughtUp) once
// the peer's reply is applied: what the peer published before the node started is there when
// the channel closes.
func TestCaughtUpAfterThePeersReply(t *testing.T) {
	s := startNATS(t, nil)
	a := join(t, config(s.url()))
	connected(t, a)
	for i := range 50 {
		a.PublishDecision("m", "u1", fmt.Sprintf("a's conversation %d", i))
	}
	a.PublishBinding("m", a.SessionKey("s1"), "u1", time.Now())
	eventually(t, 5*time.Second, "a logged its records for catch-up", func() bool { return a.Stats().LogEntries >= 51 })

	b := join(t, config(s.url()))
	select {
	case <-b.CaughtUp():
	case <-time.After(10 * time.Second):
		t.Fatal("CaughtUp not closed 10s after joining next to a running peer")
	}
	if n := b.st.numDecisions(); n != 50 {
		t.Errorf("when CaughtUp closed, b held %d of a's 50 decisions", n)
	}
	b.st.mu.Lock()
	bound := b.st.bindings["m "+b.SessionKey("s1")]
	b.st.mu.Unlock()
	if bound != "u1" {
		t.Errorf("when CaughtUp closed, b's binding of s1 is %q, want u1", bound)
	}
}

// With no NATS server to answer, there is no peer to wait for: CaughtUp closes once the first
// connection attempt fails.
func TestCaughtUpWithoutNATS(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "nats://" + ln.Addr().String()
	ln.Close() // nothing listens there now: the connection is refused
	m := join(t, config(url))
	select {
	case <-m.CaughtUp():
	case <-time.After(10 * time.Second):
		t.Fatal("CaughtUp not closed 10s after the NATS server refused the connection")
	}
}
