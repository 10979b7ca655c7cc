package replay_test

import (
	"context"
	"fmt"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/replay"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// Start a simulated fleet, replay the chat workload and compare the hit ratio to the
// reference. Here the replay goes to one worker directly; the demo sends it to Caddy, in front
// of all the workers.
func Example() {
	cfg := llmsim.Config{CapacityBlocks: 256, StepFixed: -1, PrefillPerToken: -1, PerSeq: -1} // no waiting
	fleet, err := llmsim.StartFleet(2, cfg, 0)
	if err != nil {
		panic(err)
	}
	defer fleet.Close()

	w := workload.ChatWorkload(workload.ChatConfig{Conversations: 4, Turns: 3})
	res, err := replay.Run(context.Background(), w, replay.Options{
		BaseURL:     fleet.Workers[0].URL,
		Concurrency: 1,
		FleetBlocks: fleet.CapacityBlocks(),
		Workers:     len(fleet.Workers),
	})
	if err != nil {
		panic(err)
	}
	fmt.Printf("%d requests, %d errors, per worker %v, imbalance %.0f\n",
		res.Requests, res.Errors, res.PerWorker, res.Imbalance)
	fmt.Printf("hit ratio %.3f, reference %.3f, infinite %.3f\n",
		res.HitRatio, res.ReferenceHitRatio, res.InfiniteHitRatio)
	// Output:
	// 12 requests, 0 errors, per worker map[worker-0:12], imbalance 2
	// hit ratio 0.584, reference 0.584, infinite 0.584
}
