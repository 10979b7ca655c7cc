package clustertest

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
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

// TestForgedFloodOfLivePeers: someone on the NATS server without the secret floods the fleet
// with messages that claim a live peer's id, a current time and fresh sequence numbers, in the
// format of a real message (its first bytes copied from one), on the broadcast subject and on
// each replica's catch-up subject. While it lasts, the honest messages still apply: b learns
// a's decisions and counts a's load as it changes, and a replica that joins during the flood
// catches up from a. The forged messages are all rejected.
func TestForgedFloodOfLivePeers(t *testing.T) {
	s := startNATS(t, nil)
	rec, err := nats.Connect(s.url())
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	tape := record(t, rec, "kvroute.fleet-t.data")
	a, b := join(t, config(s.url())), join(t, config(s.url()))
	connected(t, a, b)
	eventually(t, 5*time.Second, "a real message captured", func() bool { return tape.from(a.ID()) > 0 })
	msgs, _ := tape.stop(t)
	proto := msgs[0].Data[:3] // magic, version, kind of a real message
	aID, err := strconv.ParseUint(a.ID(), 16, 64)
	if err != nil {
		t.Fatal(err)
	}

	nc, err := nats.Connect(s.url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var (
		mu       sync.Mutex
		subjects = []string{"kvroute.fleet-t.data", "kvroute.fleet-t.to." + b.ID()}
		kinds    = []byte{1, 3}
	)
	stop := make(chan struct{})
	flooded := make(chan int)
	var sentForged atomic.Int64
	go func() {
		msg := make([]byte, 256<<10)
		rand.Read(msg)
		n := 0
		for {
			select {
			case <-stop:
				nc.Flush()
				flooded <- n
				return
			default:
			}
			mu.Lock()
			i := n % len(subjects)
			subject, kind := subjects[i], kinds[i]
			mu.Unlock()
			copy(msg, proto)
			msg[2] = kind
			binary.BigEndian.PutUint64(msg[3:], aID)
			binary.BigEndian.PutUint64(msg[11:], uint64(1<<40+n))
			binary.BigEndian.PutUint64(msg[19:], uint64(time.Now().UnixNano()))
			if err := nc.Publish(subject, msg); err != nil {
				t.Error(err)
				flooded <- n
				return
			}
			n++
			sentForged.Store(int64(n))
		}
	}()
	start := time.Now()
	bBefore := b.Stats()
	// The honest messages go out once the flood is under way, and it goes on until they all
	// arrived and it sent minFlood messages (256 MiB). The deadlines are generous: under -race on
	// a loaded 2-core machine the embedded server relays a few dozen of these a second.
	const minFlood = 1000
	eventually(t, 60*time.Second, "the flood under way", func() bool { return sentForged.Load() >= 100 })

	const decisions = 20
	for i := range decisions {
		a.PublishDecision("m", "10.0.0.1:8000", fmt.Sprintf("decision %d during the flood", i))
	}
	eventually(t, 15*time.Second, "b learns a's decisions during the flood", func() bool { return b.st.numDecisions() == decisions })
	for _, load := range []int64{3, 5} {
		a.loads.set(map[string]int64{"10.0.0.1:8000": load})
		a.LoadChanged()
		eventually(t, 15*time.Second, fmt.Sprintf("b counts a's load of %d during the flood", load), func() bool { return b.PeerLoad("10.0.0.1:8000") == load })
	}
	c := join(t, config(s.url()))
	mu.Lock()
	subjects, kinds = append(subjects, "kvroute.fleet-t.to."+c.ID(), "kvroute.fleet-t.sync"), append(kinds, 3, 2)
	mu.Unlock()
	connected(t, c)
	eventually(t, 15*time.Second, "c, joining during the flood, catches up from a", func() bool { return c.st.numDecisions() == decisions })
	eventually(t, 15*time.Second, "b hears c, which joined during the flood", func() bool { return len(b.Stats().Peers) == 2 })
	during := sentForged.Load()
	for deadline := time.Now().Add(3 * time.Minute); sentForged.Load() < minFlood; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the flood stalled: %d sent after 3 min (%d before the honest messages were applied); b: %+v", sentForged.Load(), during, b.Stats())
		}
	}
	close(stop)
	n := <-flooded
	elapsed := time.Since(start)
	eventually(t, 15*time.Second, "b counts the forged messages", func() bool {
		st := b.Stats()
		return st.Rejected()+st.DroppedSlow-bBefore.Rejected()-bBefore.DroppedSlow >= uint64(n)*3/4
	})
	st := b.Stats()
	rejected := st.Rejected() - bBefore.Rejected()
	t.Logf("%d forged messages of 256 KiB in %v (%.0f/s), %d of them before the honest messages were all applied; b rejected %d, dropped for a slow consumer %d; b applied %d decisions",
		n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), during, rejected, st.DroppedSlow-bBefore.DroppedSlow, st.DecisionsReceived)
	// Forged sync requests are larger than any peer sends: malformed before they are opened.
	if st.DecisionsReceived != decisions || st.RejectedReplay != bBefore.RejectedReplay {
		t.Errorf("b's stats after the flood: %+v", st)
	}
}
