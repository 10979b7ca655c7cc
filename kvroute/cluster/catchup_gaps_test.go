package cluster

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// A batch lost while this node was away, more than windowBits of the peer's messages before the
// newest live one, is applied from the catch-up reply, not skipped as a duplicate.
func TestCatchUpAppliesAGapBeyondTheWindow(t *testing.T) {
	cfg := testConfig()
	cfg.FlushDelay = time.Millisecond
	a, aw := sender(t, cfg)
	c, r := newTestNode(t, testConfig())
	a.PublishDecision("m", "u1", "heard")
	deliver(c, kindData, flushed(t, a, aw, 1))
	deliver(c, kindSyncData, reply(t, a, aw, c, 0)) // synced
	c.lostConnection()
	a.PublishDecision("m", "u1", "lost while away")
	flushed(t, a, aw, 2)  // never delivered
	a.seq.Add(windowBits) // a busy peer: >4096 messages while c was away
	a.PublishDecision("m", "u1", "after reconnect")
	deliver(c, kindData, flushed(t, a, aw, 3))
	s := c.seen()
	deliver(c, kindSyncData, reply(t, a, aw, c, s[0].seq))
	t.Logf("applied %q, duplicates %d", r.got(), c.Stats().Duplicates)
	for _, g := range r.got() {
		if strings.Contains(g, "lost while away") {
			return
		}
	}
	t.Error("the decision published while c was away was never applied")
}

// A live message dropped by the flood limit was seen, not applied: the reply applies it.
func TestCatchUpAppliesWhatTheFloodLimitDropped(t *testing.T) {
	cfg := testConfig()
	cfg.FlushDelay = time.Millisecond
	a, aw := sender(t, cfg)
	ccfg := testConfig()
	ccfg.PeerRate = 1
	c, r := newTestNode(t, ccfg)
	var live []wireMsg
	for i := range 4 {
		a.PublishDecision("m", "u1", fmt.Sprintf("d%d", i))
		live = append(live, flushed(t, a, aw, i+1)...)
	}
	deliver(c, kindData, live)
	fl := c.Stats().DroppedFlood
	time.Sleep(3 * time.Second) // refill
	aw.take()
	deliver(c, kindSyncData, reply(t, a, aw, c, 0))
	t.Logf("flood dropped %d; applied %q, duplicates %d", fl, r.got(), c.Stats().Duplicates)
	if len(r.got()) != 4 {
		t.Errorf("applied %d of 4 decisions", len(r.got()))
	}
}

// A fragmented live record whose first fragment was lost is applied from the reply.
func TestCatchUpAppliesARecordWhoseFragmentWasLost(t *testing.T) {
	cfg := testConfig()
	cfg.FlushDelay = time.Millisecond
	cfg.MaxText = 4 << 20
	a, aw := sender(t, cfg)
	ccfg := testConfig()
	ccfg.MaxText = 4 << 20
	c, r := newTestNode(t, ccfg)
	big := make([]byte, 3<<20)
	for i := range big {
		big[i] = byte('a' + rand.IntN(26))
	}
	a.PublishDecision("m", "u1", string(big))
	live := flushed(t, a, aw, 1)
	t.Logf("%d live messages", len(live))
	deliver(c, kindData, live[1:]) // first fragment lost
	aw.take()
	deliver(c, kindSyncData, reply(t, a, aw, c, 0))
	t.Logf("applied %d, duplicates %d, fraglost %d", len(r.got()), c.Stats().Duplicates, c.Stats().FragmentsLost)
	if len(r.got()) != 1 {
		t.Errorf("the fragmented decision was never applied")
	}
}
