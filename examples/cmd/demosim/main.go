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
	"bufio"
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
	decisions := flag.String("decisions", "", "write every decision of each policy's seed-1 run to this file, one JSON object a line (fleetsim.DecisionRecord: the same records as the demo's -diagnose -decisions), and print each run's diagnosis (fleetsim -diagnose's table)")
	only := flag.String("only", "", "run only this scenario: demo-chat, demo-chat-slow, demo-mooncake-1000, demo-mooncake-closed-16-4slots or demo-conversation-closed-16-4slots")
	transit := flag.Bool("transit", true, "model the request path outside the engines as the demo measures it on this machine (fleetsim.DemoTransit); false: every hop instant")
	transitFrom := flag.String("transit-from", "", "fit the transit to a demo -diagnose -decisions file (fleetsim.FitTransit: the path outside the engines as measured in that series) instead of fleetsim.DemoTransit")
	jitter := flag.String("jitter", "added", "with -transit-from: the jitter fitted, added (each delay its median plus a draw of what the series' delays added to theirs) or lognormal (times a lognormal factor of the series' spread)")
	realtime := flag.String("realtime", "", "with -only: a demo -json file of the same scenario (-interleave -repeats N); print the simulator's same-run ratios against real time's and whether they agree (fleetsim.Agree)")
	flag.Parse()
	tr := fleetsim.DemoTransit
	if *transitFrom != "" {
		recs, err := readDecisions(*transitFrom)
		if err == nil {
			tr, err = fleetsim.FitTransit(recs)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "demosim:", err)
			os.Exit(1)
		}
		if *jitter == "lognormal" {
			tr.Extra = nil
		}
	}
	if *transit {
		fmt.Printf("transit: %v\n", tr)
	}
	if *realtime != "" && *only == "" {
		fmt.Fprintln(os.Stderr, "demosim: -realtime needs -only (the scenario the demo ran)")
		os.Exit(2)
	}
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
	var trace *json.Encoder
	if *decisions != "" {
		f, err := os.Create(*decisions)
		if err != nil {
			fmt.Fprintln(os.Stderr, "demosim:", err)
			os.Exit(1)
		}
		defer f.Close()
		trace = json.NewEncoder(f)
	}
	for _, s := range scs {
		sc := s.sc
		sc.CharsPerToken, sc.TelemetryInterval = llmsim.CharsPerToken, time.Second
		if *only != "" && *only != sc.Name {
			continue
		}
		sc.Transit = nil
		if *transit {
			t := tr
			sc.Transit = &t
		}
		figures := map[string][]fleetsim.Round{}
		b, err := fleetsim.Build(&sc, 0) // the demo's chat workload has seed 0
		if err != nil {
			fmt.Fprintln(os.Stderr, "demosim:", err)
			continue
		}
		for _, p := range fleetsim.PoliciesWith(decide.DefaultRule) {
			var fig [5][]float64 // hit, TTFT p50, p99, requests/s, imbalance by requests
			for seed := uint64(1); seed <= 5; seed++ {
				var res *fleetsim.Result
				if trace != nil && seed == 1 {
					var recs []*fleetsim.DecisionRecord
					res, recs = fleetsim.TraceRun(&sc, b, seed, s.rate, p)
					if err := writeDecisions(trace, sc.Name, p.Name, recs); err != nil {
						fmt.Fprintln(os.Stderr, "demosim:", err)
						os.Exit(1)
					}
				} else {
					res = fleetsim.Run(&sc, b, seed, s.rate, p.New(seed))
				}
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
				figures[p.Name] = append(figures[p.Name], fleetsim.Round{P50: m["ttft_p50_ms"], P99: m["ttft_p99_ms"], RPS: m["throughput_rps"]})
			}
			fmt.Printf("%-20s %-15s hit %.3f  TTFT p50 %.1f ms  p99 %.0f ms  %.1f requests/s  imbalance (requests) %.2f\n",
				sc.Name, p.Name, med(fig[0]), med(fig[1]), med(fig[2]), med(fig[3]), med(fig[4]))
		}
		fmt.Println("same-seed ratios (median, min-max) and the verdict on the medians:")
		var sim []fleetsim.Ratios
		for _, base := range twinBaselines {
			r := fleetsim.CompareRounds(figures["kv_cache_aware"], figures[base.sim])
			sim = append(sim, r)
			fleetsim.WriteRatios(os.Stdout, "kv_cache_aware", base.sim, r)
		}
		if *realtime != "" {
			if err := compareRealtime(*realtime, sim); err != nil {
				fmt.Fprintln(os.Stderr, "demosim:", err)
				os.Exit(1)
			}
		}
	}
}

// readDecisions reads a -decisions file's records.
func readDecisions(path string) ([]*fleetsim.DecisionRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []*fleetsim.DecisionRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		r := new(fleetsim.DecisionRecord)
		if err := json.Unmarshal(sc.Bytes(), r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// twinBaselines are the pairs the twin is judged on: kv_cache_aware against each, by the
// simulator's name and the demo's.
var twinBaselines = []struct{ sim, demo string }{{"sglang", "sglang_cache_aware"}, {"least_conn", "least_conn"}}

// compareRealtime reads a demo -json file and prints its same-run ratios against the
// simulator's (sim, in twinBaselines' order) and whether they agree.
func compareRealtime(path string, sim []fleetsim.Ratios) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var out struct {
		Policies []struct {
			Policy string `json:"policy"`
			Label  string `json:"lb_policy"`
			Runs   []struct {
				P50 float64 `json:"ttft_p50_ms"`
				P99 float64 `json:"ttft_p99_ms"`
				RPS float64 `json:"requests_per_second"`
			} `json:"runs"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	runs := map[string][]fleetsim.Round{}
	for _, p := range out.Policies {
		if p.Label != p.Policy {
			continue // a variant
		}
		for _, r := range p.Runs {
			runs[p.Policy] = append(runs[p.Policy], fleetsim.Round{P50: r.P50, P99: r.P99, RPS: r.RPS})
		}
	}
	fmt.Printf("against real time (%s), same-run ratios of medians of rounds, tolerance ±%.0f%%:\n", path, 100*fleetsim.AgreementTolerance)
	for i, base := range twinBaselines {
		kv, other := runs["kv_cache_aware"], runs[base.demo]
		if len(kv) == 0 || len(other) == 0 {
			return fmt.Errorf("%s: no runs of kv_cache_aware and %s", path, base.demo)
		}
		real := fleetsim.CompareRounds(kv, other)
		fleetsim.WriteRatios(os.Stdout, "real: kv_cache_aware", base.demo, real)
		a := fleetsim.Agree(sim[i], real)
		a.PolicyName, a.Versus = "kv_cache_aware", base.demo
		fleetsim.WriteAgreement(os.Stdout, a)
	}
	return nil
}

// writeDecisions prints a run's diagnosis and writes its records.
func writeDecisions(trace *json.Encoder, scenario, policy string, recs []*fleetsim.DecisionRecord) error {
	d := &fleetsim.KVDiagnosis{}
	for _, r := range recs {
		d.Add(r)
		if err := trace.Encode(struct {
			Scenario string `json:"scenario"`
			Policy   string `json:"policy"`
			*fleetsim.DecisionRecord
		}{scenario, policy, r}); err != nil {
			return err
		}
	}
	d.Write(os.Stdout, scenario+" "+policy+" seed 1")
	return nil
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
