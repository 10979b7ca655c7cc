package kvroute

import (
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
)

// BenchmarkSelectTelemetry measures one decision (4 KiB bodies, 8 upstreams) with telemetry
// off and on, side by side in one run. With telemetry on, the 8 upstreams are loopback
// engines read at the default interval, each reporting a queue of its own, so that the
// decision adds their external load.
func BenchmarkSelectTelemetry(b *testing.B) {
	bodies := benchBodies(64, 4<<10)
	engines := make([]*engine, 8)
	addrs := make([]string, len(engines))
	for i := range engines {
		engines[i] = newEngine(b, fmt.Sprintf("u%d", i+1), 1000)
		engines[i].set(2, 1, "")
		addrs[i] = engines[i].addr()
	}
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("telemetry=%v", on), func(b *testing.B) {
			cfg := &KVCacheAware{Telemetry: &Telemetry{Off: !on}}
			p := newPolicy(b, cfg)
			setStateLogger(p, zap.NewNop()) // the readers' info lines would break the benchmark's output
			pool := newPool(addrs...)
			m := &LLMPrompt{MaxBody: DefaultMaxBody}
			selectOnce := func(i int) {
				r, cancel := benchRequest(bodies[i%len(bodies)], "")
				m.MatchWithError(r)
				if p.Select(pool, r, nil) == nil {
					b.Fatal("no upstream")
				}
				cancel()
			}
			if on {
				selectOnce(0) // starts the readers; every upstream is dynamic here
				waitForReadings(b, p, pool)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				selectOnce(i)
			}
		})
	}
}

func waitForReadings(b *testing.B, p *KVCacheAware, pool reverseproxy.UpstreamPool) {
	for _, up := range pool {
		p.state.seeDynamic(p.state.upstream(up.Dial), time.Now().UnixNano())
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, up := range pool {
		for p.state.upstream(up.Dial).engine.Load() == nil {
			if time.Now().After(deadline) {
				b.Fatalf("no reading of %s", up.Dial)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
