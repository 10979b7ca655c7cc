package clustertest

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestReplicaJoinerRefusesARecording is TestJoinerRefusesARecording through the built binary: a
// raw NATS client without the secret records what replica A publishes (decisions, and an admin
// reset made with POST /kvroute/reset); replica B starts later and learns five conversations
// from A through the cluster; the recording is published again, byte for byte. B refuses all
// of it, and each conversation's next turn through B still goes home.
func TestReplicaJoinerRefusesARecording(t *testing.T) {
	caddyBinary(t)
	ns := startNATS(t, nil)
	bs := newBackends(t, 4)
	rec, err := nats.Connect(ns.url())
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	tape := record(t, rec, "kvroute.replicas-test.>")

	a := startReplica(t, "A", bs, ns.url(), replicaSecret)
	for i := range 4 {
		if _, code := a.chat(t, newConversation(100+i).msgs); code != http.StatusOK {
			t.Fatalf("A: status %d", code)
		}
	}
	resp, err := http.Post("http://"+a.admin+"/kvroute/reset", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /kvroute/reset: %d", resp.StatusCode)
	}
	// The reset went out once A sent a message after it; all A sent is on the tape once the
	// tape holds as many of A's messages as A counts sent.
	st := a.status().Cluster
	eventually(t, 5*time.Second, "A publishes after the reset", func() bool { return a.status().Cluster.Sent > st.Sent })
	sent := a.status().Cluster.Sent
	eventually(t, 5*time.Second, "the recorder captured what A sent", func() bool { return tape.from(st.ID) >= int(sent) })
	msgs, lastSealed := tape.stop(t)
	eventually(t, 5*time.Second, "the recording is older than the join skew", func() bool { return time.Since(lastSealed) > joinSkew+100*time.Millisecond })

	b := startReplica(t, "B", bs, ns.url(), replicaSecret)
	b.chat(t, []string{"warm up B"})
	eventually(t, 10*time.Second, "A and B hear each other", func() bool { return a.livePeers() == 1 && b.livePeers() == 1 })
	var convs []*conversation
	for i := range 5 {
		c := newConversation(i)
		convs = append(convs, c)
		c.turn(t, a, []*replica{b}, fmt.Sprintf("conversation %d turn 0", i))
	}

	before := b.status().Cluster
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
	eventually(t, 5*time.Second, "B receives the replayed recording", func() bool {
		return b.status().Cluster.Received >= before.Received+uint64(heard)
	})
	after := b.status().Cluster
	t.Logf("B: %d replayed messages; rejected as replays %d, applied %d decisions and %d bindings meanwhile",
		len(msgs), after.RejectedReplay-before.RejectedReplay, after.DecisionsReceived-before.DecisionsReceived, after.BindingsReceived-before.BindingsReceived)
	home := 0
	for i, c := range convs {
		c.next(1)
		if got, code := b.chat(t, c.msgs); code != http.StatusOK {
			t.Fatalf("conversation %d turn 1 via B: status %d", i, code)
		} else if got == c.home {
			home++
		}
	}
	if home != len(convs) {
		t.Errorf("after the replay, %d of %d conversations went home on B", home, len(convs))
	}
	if got := after.RejectedReplay - before.RejectedReplay; got < uint64(heard) {
		t.Errorf("B refused %d of the %d replayed messages it heard as replays", got, heard)
	}
}
