// Command demosim runs the fleet simulator (examples/fleetsim) on the demo's own workloads and
// engine parameters, for the calibration of one against the other (docs/benchmarks.md): the
// demo's chat workload (workload.DefaultChat, seed 0) with 16 closed-loop clients on 4 engines
// of -blocks KV blocks, the same with the last two engines 4× slower in every part of their
// step (the demo's -slow 2), and the first 1,000 Mooncake requests open loop at the demo's pace
// (time scale 0.1) on engines 10× faster (its -speed 10); and the same 1,000 requests closed loop
// with 16 clients on engines of 4 batch slots and 4,096 tokens a step (the demo's -workload
// mooncake -open=false -max-num-seqs 4 -max-batch-tokens 4096 -limit 1000: the scorecard's
// mooncake-cold-16-4slots, fleetsim.DemoMooncakeClosed); and the same fleet and clients on the
// first 1,000 requests of the conversation look-alike, seed 0 (the demo's -workload
// conversation -max-num-seqs 4 -max-batch-tokens 4096: fleetsim.DemoConversationClosed). Every
// policy runs with 5 router seeds; it prints the medians.
//
//	demosim [-blocks N] [-only NAME]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/fleetsim"
	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
	"github.com/kvroute/caddy-kvroute/examples/workload"
	"github.com/kvroute/caddy-kvroute/kvroute/decide"
)

func main() {
	blocks := flag.Int("blocks", 1024, "chat: KV blocks per engine (the demo's -cache-blocks)")
	speed := flag.Float64("mooncake-speed", 10, "mooncake: the engines' speed (the demo's -speed; step times divided by it), and for the open-loop scenario the time scale's inverse")
	closedN := flag.Int("mooncake-closed-requests", 1000, "demo-mooncake-closed-16-4slots: the trace's first N requests (the demo's -limit)")
	convN := flag.Int("conversation-requests", 1000, "demo-conversation-closed-16-4slots: the look-alike's first N requests (the demo's -limit)")
	only := flag.String("only", "", "run only this scenario: demo-chat, demo-chat-slow, demo-mooncake-1000, demo-mooncake-closed-16-4slots or demo-conversation-closed-16-4slots")
	flag.Parse()
	// The demo's sim fleet: llmsim's defaults.
	chatEng := engine.Config{MaxNumSeqs: llmsim.DefaultSlots, MaxBatchTokens: llmsim.DefaultMaxBatchTokens, CapacityBlocks: *blocks,
		StepFixed: llmsim.DefaultStepFixed, PerPrefillToken: llmsim.DefaultPrefillPerToken, PerSeq: llmsim.DefaultPerSeq}
	slow := fleet(4, chatEng)
	slow[2], slow[3] = slowed(slow[2], 4), slowed(slow[3], 4)
	moonEng := chatEng
	moonEng.CapacityBlocks = workload.MooncakeFleetBlocks / 4
	div := func(d time.Duration) time.Duration { return time.Duration(float64(d) / *speed) }
	moonEng.StepFixed, moonEng.PerPrefillToken, moonEng.PerSeq = div(moonEng.StepFixed), div(moonEng.PerPrefillToken), div(moonEng.PerSeq)
	chatW := func(n int, seed uint64) (*fleetsim.Workload, error) { return fleetsim.ChatWorkload(n, seed), nil }
	moonW := func(n int, _ uint64) (*fleetsim.Workload, error) { return fleetsim.MooncakeWorkload(n) }
	moonRate := 0.0
	reqs, err := workload.Mooncake()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demosim:", err)
		os.Exit(1)
	}
	var span time.Duration
	for _, r := range reqs[:min(1000, len(reqs))] {
		span = max(span, r.Timestamp)
	}
	moonRate = 1000 / (span.Seconds() / *speed) // the demo's time scale 0.1 at its speed 10
	scs := []struct {
		sc   fleetsim.Scenario
		rate float64
	}{
		{fleetsim.Scenario{Name: "demo-chat", Requests: 512, Workload: chatW, Engines: fleet(4, chatEng), Clients: 16}, 0},
		{fleetsim.Scenario{Name: "demo-chat-slow", Requests: 512, Workload: chatW, Engines: slow, Clients: 16}, 0},
		{fleetsim.Scenario{Name: "demo-mooncake-1000", Requests: 1000, Workload: moonW, Engines: fleet(4, moonEng)}, moonRate},
		{*fleetsim.DemoMooncakeClosed(*speed, *closedN), 0},
		{*fleetsim.DemoConversationClosed(*speed, *convN), 0},
	}
	for _, s := range scs {
		sc := s.sc
		sc.CharsPerToken, sc.TelemetryInterval = llmsim.CharsPerToken, time.Second
		if *only != "" && *only != sc.Name {
			continue
		}
		b, err := fleetsim.Build(&sc, 0) // the demo's chat workload has seed 0
		if err != nil {
			fmt.Fprintln(os.Stderr, "demosim:", err)
			continue
		}
		for _, p := range fleetsim.PoliciesWith(decide.DefaultRule) {
			var fig [5][]float64 // hit, TTFT p50, p99, requests/s, imbalance by requests
			for seed := uint64(1); seed <= 5; seed++ {
				res := fleetsim.Run(&sc, b, seed, s.rate, p.New(seed))
				var m map[string]float64
				js, _ := json.Marshal(fleetsim.Measure(res, time.Second))
				json.Unmarshal(js, &m)
				per := make([]int, len(sc.Engines))
				for _, r := range res.Requests {
					if r.Engine >= 0 {
						per[r.Engine]++
					}
				}
				mean := float64(len(res.Requests)) / float64(len(per))
				for i, v := range []float64{m["hit_ratio"], m["ttft_p50_ms"], m["ttft_p99_ms"], m["throughput_rps"], float64(slices.Max(per)) / mean} {
					fig[i] = append(fig[i], v)
				}
			}
			fmt.Printf("%-20s %-15s hit %.3f  TTFT p50 %.1f ms  p99 %.0f ms  %.1f requests/s  imbalance (requests) %.2f\n",
				sc.Name, p.Name, med(fig[0]), med(fig[1]), med(fig[2]), med(fig[3]), med(fig[4]))
		}
	}
}

func fleet(n int, c engine.Config) []engine.Config {
	out := make([]engine.Config, n)
	for i := range out {
		out[i] = c
	}
	return out
}

func slowed(c engine.Config, k time.Duration) engine.Config {
	c.StepFixed, c.PerPrefillToken, c.PerSeq = k*c.StepFixed, k*c.PerPrefillToken, k*c.PerSeq
	return c
}

func med(x []float64) float64 {
	y := slices.Clone(x)
	slices.Sort(y)
	return y[len(y)/2]
}
