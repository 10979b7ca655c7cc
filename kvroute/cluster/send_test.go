package cluster

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestFlusherUnderLoad runs the flusher with items, load changes and ticks all racing, with no
// connection (every message is dropped and counted), so that every order the select can take
// happens.
func TestFlusherUnderLoad(t *testing.T) {
	cfg := testConfig()
	cfg.LoadInterval = 2 * time.Millisecond
	cfg.LoadTTL = 10 * time.Millisecond
	cfg.FlushDelay = time.Millisecond
	var moving atomic.Int64
	r := &recorder{}
	n, _, err := newNode(cfg, r, func() map[string]int64 { return map[string]int64{"u": moving.Add(1)} }, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.wg.Add(1)
	go n.flusher()
	// At least 300 ms of racing, and on until the flusher has both encoded and dropped
	// something: a loaded machine may not schedule it at all in the first 300 ms.
	worked := func() bool { st := n.Stats(); return st.TextBytes > 0 && st.DroppedPublish > 0 }
	start := time.Now()
	published := 0
	for time.Since(start) < 300*time.Millisecond || (!worked() && time.Since(start) < 20*time.Second) {
		n.PublishDecision("m", "u", textOf(300))
		n.PublishBinding("m", "k", "u", time.Time{})
		n.LoadChanged()
		published++
		if published%64 == 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	// What is still queued at Close is neither encoded nor counted: let the flusher catch up.
	for deadline := time.Now().Add(20 * time.Second); len(n.queue) > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	n.Close()
	st := n.Stats()
	if st.TextBytes == 0 || st.DroppedPublish == 0 {
		t.Errorf("flusher did nothing: %+v", st)
	}
	if got := st.TextBytes/300 + st.DroppedQueue; got < uint64(published)/2 {
		t.Errorf("%d decisions published, %d encoded and %d dropped", published, st.TextBytes/300, st.DroppedQueue)
	}
}
