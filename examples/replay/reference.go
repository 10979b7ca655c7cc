package replay

import (
	"cmp"
	"slices"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// HitRatios replays prompts in order against one LRU cache of fleetBlocks blocks (the
// reference; 0 when fleetBlocks <= 0) and against an unlimited cache.
func HitRatios(prompts []llmsim.Prompt, fleetBlocks int) (reference, infinite float64) {
	h := newHitCounter(fleetBlocks)
	for _, p := range prompts {
		h.add(p)
	}
	return h.ratios()
}

// hitCounter counts the hits of a sequence of prompts on the reference and infinite caches.
type hitCounter struct {
	ref, inf              *llmsim.BlockCache
	total, refHit, infHit int64
}

func newHitCounter(fleetBlocks int) *hitCounter {
	h := &hitCounter{inf: llmsim.NewBlockCache(0)}
	if fleetBlocks > 0 {
		h.ref = llmsim.NewBlockCache(fleetBlocks)
	}
	return h
}

func (h *hitCounter) add(p llmsim.Prompt) {
	h.total += int64(p.Tokens)
	if h.ref != nil {
		h.refHit += int64(h.ref.Access(p))
	}
	h.infHit += int64(h.inf.Access(p))
}

func (h *hitCounter) ratios() (reference, infinite float64) {
	return ratio(h.refHit, h.total), ratio(h.infHit, h.total)
}

// Estimate computes offline, sending nothing, the prompt tokens and the reference and
// infinite hit ratios of w, in the order a replay with opts would send the calls if they all
// took the same time: by At in open loop, Concurrency clients in lockstep in closed loop.
// A real replay's order differs a little (calls take different times); use Estimate to size
// caches, and Run's figures to compare routers.
func Estimate(w workload.Workload, opts Options) *Result {
	opts = opts.withDefaults()
	start := time.Now()
	h := newHitCounter(opts.FleetBlocks)
	for _, c := range sendOrder(w, opts) {
		h.add(opts.Prompt(c.Resolve()))
	}
	res := summarize(nil, opts, 0)
	res.Workload = w.Name
	res.Requests = w.Calls()
	res.PromptTokens = h.total
	res.ReferenceHitRatio, res.InfiniteHitRatio = h.ratios()
	res.WallSeconds = time.Since(start).Seconds()
	return res
}

// sendOrder returns the calls of w in an idealized send order (see Estimate).
func sendOrder(w workload.Workload, opts Options) []workload.Call {
	out := make([]workload.Call, 0, w.Calls())
	if opts.OpenLoop {
		for _, s := range w.Sessions {
			out = append(out, s.Calls...)
		}
		slices.SortStableFunc(out, func(a, b workload.Call) int { return cmp.Compare(a.At, b.At) })
		return out
	}
	type client struct{ session, turn int }
	clients := make([]client, opts.Concurrency)
	for k := range clients {
		clients[k].session = -1
	}
	next := 0
	for len(out) < cap(out) {
		for k := range clients {
			c := &clients[k]
			for c.session < 0 && next < len(w.Sessions) {
				if len(w.Sessions[next].Calls) > 0 {
					c.session, c.turn = next, 0
				}
				next++
			}
			if c.session < 0 {
				continue
			}
			calls := w.Sessions[c.session].Calls
			out = append(out, calls[c.turn])
			if c.turn++; c.turn == len(calls) {
				c.session = -1
			}
		}
	}
	return out
}
