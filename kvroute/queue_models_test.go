package kvroute

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/kvroute/caddy-kvroute/energy"
	"github.com/kvroute/caddy-kvroute/kvroute/flow"
)

// A request of another model that arrives while a request waits for an upstream they share
// does not take the slot that just freed there (before the dispatcher hands it on): it waits
// too, and the dispatcher hands the slot to the request that waited.
func TestQueueOtherModelDoesNotOvertake(t *testing.T) {
	timeout := caddy.Duration(time.Minute)
	pool := newPool("a:1")
	p := newPolicy(t, &KVCacheAware{QueueTimeout: &timeout, Upstreams: map[string]energy.Profile{
		"a:1": {MaxConcurrency: 1},
	}})
	wq := p.state.wq
	// The moment between a slot freeing and the dispatcher's pass: a request of model "a"
	// waits, and the upstream has a free slot.
	wt := &waiter{band: defaultBand, ready: make(chan struct{})}
	wt.item = flow.Item{Model: groupKey("a", pool), Value: wt}
	wq.mu.Lock()
	wq.q.Push(&wt.item)
	wq.groups[wt.item.Model] = &waitGroup{model: "a", pool: pool, p: p}
	wq.held.Add(1)
	wq.mu.Unlock()

	r, cancel := chatRequest("b", "another model, the same upstream")
	defer cancel()
	picked := make(chan string, 1)
	go func() {
		up := p.Select(pool, r, httptest.NewRecorder())
		if up == nil {
			picked <- ""
			return
		}
		picked <- up.Dial
	}()
	select {
	case <-wt.ready:
	case addr := <-picked:
		t.Fatalf("the request of model b took %q ahead of the one of model a that waited", addr)
	case <-time.After(30 * time.Second):
		t.Fatal("neither request went on")
	}
	wq.mu.Lock()
	granted, reserved := wt.granted, wt.reserved
	wq.mu.Unlock()
	if !granted || reserved == nil {
		t.Fatalf("the waiting request was released without a slot (granted %v, reserved %v)", granted, reserved)
	}
	waitFor(t, func() bool { wq.mu.Lock(); defer wq.mu.Unlock(); return wq.q.Len() == 1 }, "the request of model b waits behind it")
	cancel() // its client leaves
	<-picked // an upstream its transport never reaches (leftUpstream), or none
	if n := p.state.upstream("a:1").inFlight.Load(); n != 0 {
		t.Errorf("the request of model b was decided after its client left: %d in flight on a:1", n)
	}
	wq.unreserve(wt)
	if n := wq.held.Load(); n != 0 {
		t.Errorf("%d held, want 0", n)
	}
}
