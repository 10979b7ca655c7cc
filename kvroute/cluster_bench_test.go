package kvroute

import (
	"fmt"
	"net"
	"testing"

	"go.uber.org/zap"
)

// BenchmarkSelectCluster measures a decision with the cluster off and on (a node that
// publishes every decision and binding; its NATS is absent, so what it costs beyond the
// request path is the background flusher's). Compare with benchstat -col /cluster.
func BenchmarkSelectCluster(b *testing.B) {
	bodies := benchBodies(64, 4<<10)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	dead := "nats://" + ln.Addr().String()
	ln.Close()
	for _, session := range []bool{false, true} {
		for _, on := range []bool{false, true} {
			name := fmt.Sprintf("session=%v/cluster=%v", session, map[bool]string{false: "off", true: "on"}[on])
			b.Run(name, func(b *testing.B) {
				p := new(KVCacheAware)
				if on {
					p.Cluster = &ClusterConfig{URLs: []string{dead}, Name: "bench", Secret: testClusterSecret}
				}
				p = newPolicy(b, p)
				setStateLogger(p, zap.NewNop()) // "cluster: joining" would break benchstat's lines
				pool := newPool("u1:1", "u2:1", "u3:1", "u4:1", "u5:1", "u6:1", "u7:1", "u8:1")
				m := &LLMPrompt{MaxBody: DefaultMaxBody}
				b.SetBytes(int64(len(bodies[0])))
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					id := ""
					if session {
						id = fmt.Sprintf("session-%d", i%1000)
					}
					r, cancel := benchRequest(bodies[i%len(bodies)], id)
					if ok, _ := m.MatchWithError(r); !ok {
						b.Fatal("matcher did not match")
					}
					if p.Select(pool, r, nil) == nil {
						b.Fatal("no upstream")
					}
					cancel()
				}
				b.StopTimer()
				if on && p.state.node() == nil {
					b.Fatal("cluster on, but no node ran")
				}
			})
		}
	}
}
