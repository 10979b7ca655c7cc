package kvroute

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// A reload that raises max_concurrency while a request waits hands it the new slot at once:
// it does not wait for the occupier (the waiting group is judged by the live config).
func TestQueueReloadRaisesCapacity(t *testing.T) {
	g := newGated(t)
	startCaddy(t, queueConfig(g, "queue_timeout 1m", ""))
	first := occupy(t, g)
	waiting := enqueue(t, "/v1/chat/completions", chatBody("m", "waits for more room"), "X-Req", "waiter")
	load(t, strings.Replace(queueConfig(g, "queue_timeout 1m", ""), "max_concurrency 1", "max_concurrency 2", 1))
	waitFor(t, func() bool { return len(g.arrived()) == 2 }, "the waiter reaches the upstream's new slot while the occupier holds the old one")
	g.releaseN(t, 2)
	mustOK(t, first, waiting)
}

// A reload that adds an idle upstream while a request waits sends it there at once.
func TestQueueReloadAddsUpstream(t *testing.T) {
	g := newGated(t)
	g2 := newGated(t)
	startCaddy(t, queueConfig(g, "queue_timeout 1m", ""))
	first := occupy(t, g)
	waiting := enqueue(t, "/v1/chat/completions", chatBody("m", "waits for another engine"), "X-Req", "waiter")
	cfg := queueConfig(g, fmt.Sprintf("queue_timeout 1m\n\t\t\tupstream %s {\n\t\t\t\tmax_concurrency 1\n\t\t\t}", g2.addr()), "")
	cfg = strings.Replace(cfg, "reverse_proxy @llm "+g.addr(), "reverse_proxy @llm "+g.addr()+" "+g2.addr(), 1)
	load(t, cfg)
	waitFor(t, func() bool { return len(g2.arrived()) == 1 }, "the waiter reaches the idle upstream the reload added")
	g2.releaseN(t, 1)
	g.releaseN(t, 1)
	mustOK(t, first, waiting)
	if q := queued(); q != 0 {
		t.Errorf("%d requests wait, want 0", q)
	}
}

// queue_timeout 0 written at the policy with flow_control: late binding without flow_control
// is off, and flow_control's band still waits its default (10s), not shed at once.
func TestQueueExplicitZeroWithFlowControl(t *testing.T) {
	g := newGated(t)
	startCaddy(t, queueConfig(g, "queue_timeout 0\n\t\t\tflow_control {\n\t\t\t\ttenant {http.request.header.X-Tenant}\n\t\t\t}", ""))
	first := occupy(t, g)
	ch := postAsync(context.Background(), "/v1/chat/completions", chatBody("m", "waits in the default band"), "X-Req", "waiter")
	waitFor(t, func() bool {
		select {
		case r := <-ch:
			t.Fatalf("the request was answered at once (status %d, body %q), want it to wait", r.status, r.body)
		default:
		}
		return queued() == 1
	}, "the request waits at the router")
	g.releaseN(t, 2)
	mustOK(t, first, ch)
}

// A panic in the decision of a request handed a slot gives the slot back: nothing stays
// reserved or held (the next request is not kept waiting for it).
func TestQueuePanicAfterGrantFreesSlot(t *testing.T) {
	g := newGated(t)
	startCaddy(t, queueConfig(g, "queue_timeout 1m", ""))
	first := occupy(t, g)
	var once sync.Once
	hook := func() { once.Do(func() { panic("test: a panic in the re-decision") }) }
	testHookRedecide.Store(&hook)
	t.Cleanup(func() { testHookRedecide.Store(nil) })
	waiting := enqueue(t, "/v1/chat/completions", chatBody("m", "panics once handed a slot"), "X-Req", "panics")
	g.releaseN(t, 1)
	mustOK(t, first)
	if r := <-waiting; r.err == nil && r.status == http.StatusOK {
		t.Errorf("the request that panicked was answered %d", r.status)
	}
	wq := currentState().wq
	waitFor(t, func() bool { return wq.held.Load() == 0 }, "nothing held once the request that panicked is gone")
	u := currentState().upstream(g.addr())
	if n := u.reserved.Load(); n != 0 {
		t.Errorf("%d slots reserved on the upstream, want 0", n)
	}
	after := postAsync(context.Background(), "/v1/chat/completions", chatBody("m", "after the panic"), "X-Req", "after")
	g.releaseN(t, 1)
	mustOK(t, after)
}
