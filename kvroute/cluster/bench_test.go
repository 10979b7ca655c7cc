package cluster

import (
	"strconv"
	"testing"
)

// BenchmarkPeerLoad is the per-request cost of reading the peers' load of one upstream, from
// many goroutines at once as Select runs.
func BenchmarkPeerLoad(b *testing.B) {
	n, _ := newTestNode(b, testConfig())
	for p := 0; p < 8; p++ {
		peer, _ := newTestNode(b, testConfig())
		var loads []peerCount
		for u := 0; u < 16; u++ {
			loads = append(loads, peerCount{"10.0.0." + strconv.Itoa(u) + ":8000", int64(p + u)})
		}
		n.receive(kindData, sealAs(peer, kindData, appendLoad(nil, loads)))
	}
	if n.PeerLoad("10.0.0.3:8000") == 0 {
		b.Fatal("no load")
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var sum int64
		for pb.Next() {
			sum += n.PeerLoad("10.0.0.3:8000")
		}
		_ = sum
	})
}

// BenchmarkPublishDecisionQueue is the caller's cost of PublishDecision alone, from many
// goroutines; nothing drains the queue here, so most calls take the full-queue path, which
// must cost no more than the enqueue.
func BenchmarkPublishDecisionQueue(b *testing.B) {
	n, _ := newTestNode(b, testConfig())
	text := textOf(8000)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n.PublishDecision("llama", "10.0.0.1:8000", text)
		}
	})
}

// BenchmarkSessionKey is the per-request cost of the keyed digest of a session id.
func BenchmarkSessionKey(b *testing.B) {
	n, _ := newTestNode(b, testConfig())
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = n.SessionKey("conv-1234-5678")
		}
	})
}
