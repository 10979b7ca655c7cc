package clustertest

import (
	"net"
	"net/http"
	"testing"
	"time"
)

// A replica started next to a running peer catches up before its first decision: turn 1 of a
// conversation went through replica 1, replica 2 starts, and its very first request, turn 2,
// goes to the same upstream. Replica 1 can only send turn 1 to b1; replica 2's pool is b1 b0,
// and on its own its first request would go to b0 (round_robin starts at the second
// candidate), so nothing but what replica 1 learned can send turn 2 to b1.
func TestLateReplicaFirstRequestCaughtUp(t *testing.T) {
	caddyBinary(t)
	ns := startNATS(t, nil)
	bs := newBackends(t, 2)
	extra := "\n\t\t\ttelemetry off\n\t\t\tfallback round_robin"
	r1 := startReplicaWith(t, "one", bs[1].addr(), ns.url(), replicaSecret, extra)
	c := newConversation(31)
	got, code := r1.chat(t, c.msgs, "X-Session-ID", "conversation-31")
	if code != http.StatusOK || got != "b1" {
		t.Fatalf("turn 1 via replica one: upstream %q status %d, want b1", got, code)
	}
	// Replica one's catch-up log holds turn 1's decision and binding: what a replica that
	// starts now gets from it.
	eventually(t, 10*time.Second, "replica one logs turn 1 for catch-up", func() bool {
		st := r1.status()
		return st.Cluster != nil && st.Cluster.LogEntries >= 2
	})

	r2 := startReplicaWith(t, "two", bs[1].addr()+" "+bs[0].addr(), ns.url(), replicaSecret, extra)
	// The admin API answers before the apps start: wait for the site's port, without a
	// request, then send turn 2 at once.
	eventually(t, 15*time.Second, "replica two's site port", func() bool {
		conn, err := net.DialTimeout("tcp", r2.site, time.Second)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
	c.next(2)
	got, code = r2.chat(t, c.msgs, "X-Session-ID", "conversation-31")
	if code != http.StatusOK {
		t.Fatalf("turn 2 via replica two: status %d", code)
	}
	if got != "b1" {
		st := r2.status()
		t.Errorf("turn 2, replica two's first request, went to %s; turn 1 went to b1 (replica two's cluster stats: %+v)", got, st.Cluster)
	}
}
