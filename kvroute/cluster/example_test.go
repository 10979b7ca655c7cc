package cluster_test

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
)

// fleetState stands for the router's shared state: trees, session store, in-flight counts.
type fleetState struct {
	mu       sync.Mutex
	inflight map[string]int64
}

// The Handler's methods apply a peer's observation as the local decision path would: insert
// text into model's tree under upstream, bind or forget a session, drop everything.
func (s *fleetState) Decision(model, upstream, text string) {}
func (s *fleetState) Binding(model, sessionKey, upstream string, at time.Time) bool {
	return true
}
func (s *fleetState) Forget(sessionKey string) {}
func (s *fleetState) Reset()                   {}

// loads is the LoadSource: a copy, since the node reads it on its own goroutine.
func (s *fleetState) loads() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]int64, len(s.inflight))
	for u, n := range s.inflight {
		m[u] = n
	}
	return m
}

// The policy publishes each decision after making it, and adds the peers' counts to its own
// when it computes an upstream's load; neither waits on NATS.
func ExampleOpen() {
	st := &fleetState{inflight: map[string]int64{}}
	node, err := cluster.Open(cluster.Config{
		URLs:   []string{"nats://127.0.0.1:4222"},
		Name:   "fleet-a",
		Secret: "a secret of at least 16 bytes",
	}, st, st.loads, slog.Default())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer node.Close()

	// In Select, after choosing 10.0.0.1:8000 for a request of session "conv-42":
	sk := node.SessionKey("conv-42") // the key the session store uses, on every replica
	node.PublishDecision("llama-3.1-8b", "10.0.0.1:8000", "system: ...\nuser: ...")
	node.PublishBinding("llama-3.1-8b", sk, "10.0.0.1:8000", time.Now())
	st.mu.Lock()
	st.inflight["10.0.0.1:8000"]++
	own := st.inflight["10.0.0.1:8000"]
	st.mu.Unlock()
	node.LoadChanged()

	// Load of an upstream = own + peers (+ external, with telemetry).
	load := own + node.PeerLoad("10.0.0.1:8000")
	_ = load
}
