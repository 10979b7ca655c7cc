package clustertest

import (
	"fmt"
	"testing"
	"time"
)

// A replica publishes before its first connection is up (its node opens on its first decision,
// and the first handshake takes a moment): its peers that were there before it must still learn
// those decisions, from its catch-up log. The proxy holds the handshake until the decision was
// flushed, and dropped for want of a connection.
func TestDecisionsBeforeFirstConnectReachEarlierPeers(t *testing.T) {
	s := startNATS(t, nil)
	b := join(t, config(s.url()))
	connected(t, b)

	p := startProxy(t, fmt.Sprintf("127.0.0.1:%d", s.opts.Port))
	p.paused.Store(true)
	a := join(t, config(p.url()))
	a.PublishDecision("m", "10.0.0.1:8000", "a decision made before the first connection")
	eventually(t, 5*time.Second, "the decision was flushed before a connected", func() bool { return a.Stats().DroppedPublish > 0 })
	p.paused.Store(false)
	connected(t, a)
	eventually(t, 10*time.Second, "b learns a's decision made before a connected", func() bool { return b.st.numDecisions() == 1 })
}
