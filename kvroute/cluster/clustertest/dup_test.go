package clustertest

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestReconnectUnderTrafficAppliesOnce: b's connection is cut while a publishes without pause.
// On reconnecting, b asks a for what it missed since the connection went; the batches a
// publishes from b's resubscription to a's reply reach b both live and in the reply (b's
// traffic to NATS is slowed by 20 ms so that there are always some). Each decision must be
// applied once.
func TestReconnectUnderTrafficAppliesOnce(t *testing.T) {
	s := startNATS(t, nil)
	p := startProxy(t, fmt.Sprintf("127.0.0.1:%d", s.opts.Port))
	a, b := join(t, config(s.url())), join(t, config(p.url()))
	connected(t, a, b)
	a.PublishDecision("m", "u1", "hello")
	eventually(t, 3*time.Second, "b hears a", func() bool { return b.st.numDecisions() == 1 })

	stop := make(chan struct{})
	var wg sync.WaitGroup
	published := 1
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			a.PublishDecision("m", "u1", fmt.Sprintf("decision %d", published))
			published++
			time.Sleep(200 * time.Microsecond)
		}
	}()
	time.Sleep(200 * time.Millisecond)
	before := b.Stats().SyncRequests
	p.upDelay.Store(int64(20 * time.Millisecond))
	p.cut()
	eventually(t, 5*time.Second, "b reconnects and asks a", func() bool {
		st := b.Stats()
		return st.Connected && st.SyncRequests > before
	})
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	dropped := func() int { st := a.Stats(); return int(st.DroppedQueue + st.DroppedPublish) }
	eventually(t, 5*time.Second, "b has all a published, live or caught up", func() bool {
		b.st.mu.Lock()
		defer b.st.mu.Unlock()
		seen := map[string]bool{}
		for _, d := range b.st.decisions {
			seen[d.text] = true
		}
		return len(seen) >= published-dropped()
	})
	time.Sleep(300 * time.Millisecond)
	distinct, twice := b.st.applied()
	st := b.Stats()
	t.Logf("a published %d (%d dropped); b applied %d, %d distinct, %d catch-up records, %d duplicates skipped",
		published, dropped(), st.DecisionsReceived, distinct, st.SyncReceivedRecords, st.Duplicates)
	if twice != 0 {
		t.Errorf("%d decisions applied twice", twice)
	}
	if st.Duplicates == 0 {
		t.Error("no record heard both live and in the catch-up reply: the test did not test")
	}
}
