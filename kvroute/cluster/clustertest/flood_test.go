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

	subjects := []string{"kvroute.fleet-t.data", "kvroute.fleet-t.sync", "kvroute.fleet-t.to." + b.ID()}
	const flood = 30000
	junk := make([]byte, 4096)
	// Two floods: the first grows what may grow (nats.go's and the embedded server's buffers,
	// which live in this process too, and the node's bounded tables), the second must not
	// grow the heap again: what the node keeps of a flood is bounded, not proportional to it.
	heap := func() int64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapInuse)
	}
	var after [2]int64
	for round := range 2 {
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
				a.PublishDecision("m", "u", fmt.Sprintf("real %d.%d", round, i/1000))
			}
		}
		nc.Flush()
		want := (round + 1) * flood / 1000
		eventually(t, 10*time.Second, "real decisions lost in the flood", func() bool { return b.st.numDecisions() == want })
		eventually(t, 10*time.Second, "flood not all counted", func() bool {
			st := b.Stats()
			return st.Rejected()+st.DroppedSlow >= uint64(round+1)*flood*9/10
		})
		st := b.Stats()
		if st.DecisionsReceived != uint64(want) || len(st.Peers) != 1 {
			t.Errorf("stats after flood %d: %+v", round+1, st)
		}
		after[round] = heap()
	}
	t.Logf("heap in use after each flood: %d, %d MiB", after[0]>>20, after[1]>>20)
	if grown := after[1] - after[0]; grown > 16<<20 {
		t.Errorf("heap grew by %d MiB over a second flood of %d messages (after the first: %d MiB in use)", grown>>20, flood, after[0]>>20)
	}
}
