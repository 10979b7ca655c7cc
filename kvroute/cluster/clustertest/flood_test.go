package clustertest

import (
	"crypto/rand"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestGarbageFlood: someone on the NATS server without the secret floods every subject of the
// fleet with garbage and with bytes that look like the header; the node rejects and counts
// all of it, keeps its memory bounded, and still applies its real peer's decisions.
func TestGarbageFlood(t *testing.T) {
	s := startNATS(t, nil)
	a, b := join(t, config(s.url())), join(t, config(s.url()))
	connected(t, a, b)
	nc, err := nats.Connect(s.url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	subjects := []string{"kvroute.fleet-t.data", "kvroute.fleet-t.sync", "kvroute.fleet-t.to." + b.ID()}
	const flood = 30000
	junk := make([]byte, 4096)
	for i := 0; i < flood; i++ {
		n := 1 + i%len(junk)
		rand.Read(junk[:n])
		if i%2 == 0 && n > 27 {
			// A plausible header (magic, version, kind, a random sender) in front of junk.
			junk[0], junk[1], junk[2] = 'k', 1, byte(1+i%3)
		}
		if err := nc.Publish(subjects[i%len(subjects)], junk[:n]); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			a.PublishDecision("m", "u", fmt.Sprintf("real %d", i/1000))
		}
	}
	nc.Flush()
	eventually(t, 10*time.Second, "real decisions lost in the flood", func() bool { return b.st.numDecisions() == flood/1000 })
	eventually(t, 10*time.Second, "flood not all counted", func() bool {
		st := b.Stats()
		return st.Rejected()+st.DroppedSlow >= flood*9/10
	})
	st := b.Stats()
	if st.DecisionsReceived != flood/1000 || len(st.Peers) != 1 {
		t.Errorf("stats after the flood: %+v", st)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapInuse) - int64(before.HeapInuse); grown > 32<<20 {
		t.Errorf("heap grew by %d MiB over a flood of %d messages", grown>>20, flood)
	}
}
