package kvroute

import (
	"fmt"
	"testing"

	"github.com/kvroute/caddy-kvroute/energy"
	"github.com/kvroute/caddy-kvroute/kvroute/flow"
)

// BenchmarkDispatchManyTenants is one dispatch pass, under the decisions' lock, with 1,000
// tenants waiting for one model whose two upstreams are full: the pass finds no slot. Its cost
// must not grow with the tenants by a candidate list per tenant (freeSlot per flow).
func BenchmarkDispatchManyTenants(b *testing.B) {
	pool := newPool("a:1", "b:1")
	p := newPolicy(b, &KVCacheAware{Upstreams: map[string]energy.Profile{
		"a:1": {MaxConcurrency: 1}, "b:1": {MaxConcurrency: 1},
	}})
	for _, up := range pool {
		p.state.upstream(up.Dial).reserved.Add(1) // full
	}
	wq := p.state.wq
	wq.mu.Lock()
	key := groupKey("m", pool)
	wq.groups[key] = &waitGroup{model: "m", pool: pool, p: p}
	for i := range 1000 {
		wt := &waiter{ready: make(chan struct{})}
		wt.item = flow.Item{Model: key, Tenant: fmt.Sprint("tenant", i), Value: wt}
		wq.q.Push(&wt.item)
	}
	wq.mu.Unlock()
	b.Cleanup(func() {
		wq.mu.Lock()
		for wq.q.Next(func(string) bool { return true }) != nil {
		}
		clear(wq.groups)
		wq.mu.Unlock()
		for _, up := range pool {
			p.state.upstream(up.Dial).reserved.Add(-1)
		}
	})
	b.ReportAllocs()
	for b.Loop() {
		p.state.deciding.Lock()
		wq.mu.Lock()
		wq.dispatch()
		wq.mu.Unlock()
		p.state.deciding.Unlock()
	}
	if n := wq.q.Len(); n != 1000 {
		b.Fatalf("%d wait after the passes, want 1000 (no slot is free)", n)
	}
}
