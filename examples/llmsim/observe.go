package llmsim

import (
	"net/http"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
)

// HeaderRequestID is the request header whose value names a request in an Observer's calls
// (a router's id of the request: Caddy's {http.request.uuid} sent with header_up).
const HeaderRequestID = "X-Request-Id"

// Arrival is a request as a worker takes it, with what its engine held at that moment: for a
// decision trace (the demo's -diagnose) that sets what a router believed beside what was
// true at the engine.
type Arrival struct {
	ID     string // the request's X-Request-Id ("" without one)
	Worker string // the worker's name
	At     time.Time
	Prompt Prompt
	Output int
	View   View // the worker's engine as the request arrived
}

// View is what an engine holds for a request that would be queued now: its batch (requests
// running and waiting, and its batch slots, max_num_seqs), the request's prompt tokens its
// cache holds, and the time it would take to give the request its first token (the fleet
// simulator's forward run of the engine's scheduler, engine.PredictTTFT: the greedy oracle's
// prediction).
type View struct {
	Running, Waiting, Slots int
	Cached                  int
	TTFT                    time.Duration
}

// Observer sees the requests a worker takes (Server.Observe): Arrived as each arrives, before
// its engine queues it; FirstToken when its first token is produced (at, in the engine's time
// on the wall clock; cached, the prompt tokens found at admission); Finished once the answer
// is written to its end (at, the engine's last token; written, when the handler had written
// it). They run on the request's handler: what they do delays it.
type Observer interface {
	Arrived(w *Server, a *Arrival)
	FirstToken(id string, at time.Time, cached int)
	Finished(id string, at, written time.Time)
}

// Observe makes o see the worker's requests from now on (nil: none, the default).
func (s *Server) Observe(o Observer) {
	if o == nil {
		s.observer.Store(nil)
		return
	}
	s.observer.Store(&o)
}

// View returns the worker's engine now for a request of prompt p for output tokens.
func (s *Server) View(p Prompt, output int) View {
	d := s.eng
	r := engine.Request{Tokens: p.Tokens, Hashes: p.Hashes, Output: output}
	d.mu.Lock()
	defer d.mu.Unlock()
	// What the engine holds now: the steps due end first, as a request arriving now would
	// see them end (a late stepping goroutine's lag is not the engine's state).
	now := d.now()
	d.catchUp(now)
	rd := d.eng.Reading()
	return View{Running: rd.Running, Waiting: rd.Waiting, Slots: d.cfg.MaxNumSeqs,
		Cached: d.eng.Lookup(&r), TTFT: d.eng.PredictTTFT(&r, now)}
}

// arrival is the Arrival of r, of prompt p for output tokens, at arrived.
func (s *Server) arrival(r *http.Request, p Prompt, output int, arrived time.Time) *Arrival {
	return &Arrival{ID: r.Header.Get(HeaderRequestID), Worker: s.cfg.Name, At: arrived, Prompt: p, Output: output, View: s.View(p, output)}
}
