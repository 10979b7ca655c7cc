package fleetsim

import (
	"fmt"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
)

// Grow scales a fleet out while a scenario runs: the last Engines of Scenario.Engines are not
// there when the run starts and join, cold (empty caches, started at that moment, nothing
// learned about them), just before the run sends the request that follows Share of its
// requests (halfway: 0.5). Each router then learns of them as a Caddy reload onto the longer
// upstream list would bring them (Reloader). Counting sends, not time, puts the join at the
// same point of the workload in open and closed loop, and in a run cut short (-requests).
type Grow struct {
	Engines int
	Share   float64
}

// Reloader is a router that takes a longer engine list while it runs: the engines it was
// started with, in the same order, then the new ones. A router keeps what it knows of the
// engines it had, as its counterpart in Caddy does across a reload: kvroute's state outlives
// configs (its trees, learned figures and counts, per upstream address), and Caddy's hosts
// keep their request counts. Every router of a scenario that grows must be one.
type Reloader interface {
	Reload(now time.Duration, engines []EngineInfo)
}

// grow brings the joining engines in: new processes at now, told to the router.
func (s *sim) grow() {
	for i := s.active; i < len(s.engines); i++ {
		s.account(i)
		s.engines[i] = engine.New(s.sc.Engines[i], s.now)
		s.account(i)
	}
	s.active = len(s.engines)
	r, ok := s.router.(Reloader)
	if !ok {
		panic(fmt.Sprintf("fleetsim: %s grows its fleet and the router %T takes no reload (Reloader)", s.sc.Name, s.router))
	}
	r.Reload(s.now, s.ids)
	if o, ok := s.router.(Omniscient); ok {
		o.See(s.engines)
	}
}

// Reload extends the counts of requests in flight with the new engines (Caddy's hosts keep
// theirs across a reload).
func (f *inflight) Reload(_ time.Duration, engines []EngineInfo) {
	for _, e := range engines[len(f.ids):] {
		f.ids = append(f.ids, e.ID)
		f.n = append(f.n, 0)
	}
}

// Reload: a reload provisions a new round_robin, whose turn starts again at the first
// upstream.
func (r *roundRobin) Reload(now time.Duration, engines []EngineInfo) {
	r.inflight.Reload(now, engines)
	r.next = 0
}

// Reload adds the engines as SGLang's router adds workers (POST /add_worker): its trees are
// kept, and the new workers are available at once.
func (s *sglangRouter) Reload(now time.Duration, engines []EngineInfo) {
	s.inflight.Reload(now, engines)
	s.available = nil
}

// Reload adds the engines to kvroute's router as a reload does in Caddy: the shared state
// keeps what it learned of the upstreams it had (trees, bindings, counts, learned figures),
// and a new upstream starts with nothing learned and no reading.
func (k *kvRouter) Reload(_ time.Duration, engines []EngineInfo) {
	for _, e := range engines[len(k.ids):] {
		k.ids = append(k.ids, e.ID)
		k.up = append(k.up, kvUpstream{})
	}
}
