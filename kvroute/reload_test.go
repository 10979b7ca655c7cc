package kvroute

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
)

// selectAsync runs one Select of p in the background and reports the upstream it chose.
func selectAsync(p *KVCacheAware, pool reverseproxy.UpstreamPool, prompt string) <-chan string {
	done := make(chan string, 1)
	go func() {
		r, cancel := chatRequest("m", prompt)
		defer cancel()
		up := p.Select(pool, r, httptest.NewRecorder())
		if up == nil {
			done <- ""
			return
		}
		done <- up.Dial
	}()
	return done
}

// held is a seam that blocks until the test releases it, and says when it was entered.
type held struct {
	entered chan struct{}
	release chan struct{}
}

func newHeld() *held { return &held{entered: make(chan struct{}, 16), release: make(chan struct{})} }

func (h *held) wait() {
	select {
	case h.entered <- struct{}{}:
	default: // entered is only read once
	}
	<-h.release
}

// awaitSelect waits for the Select started by selectAsync while h holds the work the reload
// started; it fails the test if the Select is still waiting after a generous deadline (then it
// releases h, so that the test ends).
func awaitSelect(t *testing.T, done <-chan string, h *held, what string) string {
	t.Helper()
	select {
	case up := <-done:
		return up
	case <-time.After(10 * time.Second):
		close(h.release)
		<-done
		t.Fatalf("the first Select after a reload waited for %s (still waiting after 10s)", what)
		return ""
	}
}

// After a reload that changes the cluster, the first request does not wait for the old NATS
// connection to close: closing (and connecting) run in the background.
func TestReloadClusterChangeDoesNotHoldSelect(t *testing.T) {
	url := deadNATS(t)
	cfg := func(name string) *ClusterConfig {
		return &ClusterConfig{URLs: []string{url}, Name: name, Secret: testClusterSecret}
	}
	pool := newPool("10.0.0.1:8000", "10.0.0.2:8000")
	p := newPolicy(t, &KVCacheAware{Cluster: cfg("f")})
	pick(t, p, pool, "m", "hello")
	first := p.state.node()
	if first == nil {
		t.Fatal("no node after the first decision")
	}
	h := newHeld()
	closeHeld := func(n *cluster.Node) {
		h.wait()
		_ = n.Close()
	}
	p.state.closeNodeHook.Store(&closeHeld)
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
	})

	q := newPolicy(t, &KVCacheAware{Cluster: cfg("g")}) // a reload with another cluster
	if got := awaitSelect(t, selectAsync(q, pool, "hello after the reload"), h, "the old NATS connection to close"); got == "" {
		t.Fatal("the first Select after the reload chose no upstream")
	}
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the reload never closed the old node")
	}
	close(h.release)
	waitUntil(t, 10*time.Second, func() bool {
		n := q.state.node()
		return n != nil && n != first
	}, "the node of the new cluster")
}

// After a reload that shrinks max_tree_size, the first request does not pay the eviction pass:
// the new bound is in force at once, the pass runs in the background.
func TestReloadShrinkDoesNotHoldSelect(t *testing.T) {
	pool := newPool("10.0.0.1:8000", "10.0.0.2:8000")
	p := newPolicy(t, &KVCacheAware{MaxTreeSize: 1 << 20})
	pick(t, p, pool, "m", "hello")
	q := newPolicy(t, &KVCacheAware{MaxTreeSize: 10000}) // a reload, not routing yet
	for i := range 200 {
		p.state.forest.Tree("m").Insert(fmt.Sprintf("conversation %d: %s", i, strings.Repeat("words ", 500)), "10.0.0.1:8000")
	}
	if c := p.state.forest.Chars(); c < 500000 {
		t.Fatalf("the trees hold %d chars, want over 500000", c)
	}
	h := newHeld()
	shrinkHeld := func() {
		h.wait()
		p.state.forest.Evict()
	}
	p.state.shrinkHook.Store(&shrinkHeld)
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
	})

	if got := awaitSelect(t, selectAsync(q, pool, "hello after the reload"), h, "the eviction pass of the smaller max_tree_size"); got == "" {
		t.Fatal("the first Select after the reload chose no upstream")
	}
	close(h.release)
	waitUntil(t, 10*time.Second, func() bool { return q.state.forest.Chars() <= 10000 }, "the trees within the new max_tree_size")
}
