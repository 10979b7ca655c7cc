// Command demo compares kvroute's kv_cache_aware load-balancing policy with Caddy's built-in
// policies (and, when the Caddy binary has them, the benchmark-only peers sglang_cache_aware
// and prefix_hash) on a fleet of simulated LLM workers.
//
// For every policy it writes a Caddyfile (the llm_prompt matcher and a reverse_proxy to the
// workers with that lb_policy), runs the given Caddy binary on it, replays a workload through
// it on a fleet with empty caches, and stops it. It then prints one comparison table and
// writes a self-contained HTML report. Before the table, a short walkthrough shows which worker
// kv_cache_aware picks for the turns of a conversation and for unrelated prompts.
//
//	./xcaddy.sh demo                               # builds caddy-demo, runs this
//	go run ./examples/cmd/demo -caddy ./caddy -policies kv_cache_aware,round_robin
//	go run ./examples/cmd/demo -caddy ./caddy -workload mooncake -limit 1000
//	go run ./examples/cmd/demo -caddy ./caddy -sweep
//	go run ./examples/cmd/demo -caddy ./caddy -overhead -policies none
//	go run ./examples/cmd/demo -caddy ./caddy -fleet llmd
//
// Other modes: -sweep runs kv_cache_aware over a grid of its options; -overhead measures the
// requests per second Caddy serves with kv_cache_aware and its matcher against round_robin,
// on a trivial upstream; -fleet llmd runs llm-d's vLLM simulator instead of ours.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, errHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// run is the whole demo: modules check, fleet, walkthrough, comparison (or sweep), overhead,
// then the table, the JSON and the HTML report.
func run(ctx context.Context, cfg *config) error {
	start := time.Now()
	bin, err := newCaddyBinary(cfg.caddy)
	if err != nil {
		return err
	}
	policies, notes, err := selectPolicies(cfg, bin)
	if err != nil {
		return err
	}
	if cfg.replicas > 0 {
		policies = expandReplicas(policies, cfg.replicas, cfg.outage > 0, cfg.late > 0)
	}
	if cfg.compareTelemetry {
		policies = withTelemetryOff(policies)
	}
	if cfg.compareFeedback {
		if !bin.has(moduleFeedback) {
			return fmt.Errorf("-compare-feedback: %s has no %s module (./xcaddy.sh build)", cfg.caddy, moduleFeedback)
		}
		policies = withFeedback(policies)
	}
	for _, n := range notes {
		fmt.Println("note:", n)
	}
	out := &output{Params: cfg.params()}

	if len(cfg.flow) > 0 && len(policies) > 0 {
		if err := runFlow(ctx, cfg, bin, policies, out); err != nil {
			return err
		}
	} else if len(policies) > 0 || cfg.sweep {
		w, err := cfg.workload()
		if err != nil {
			return err
		}
		fl, err := startFleet(ctx, cfg)
		if err != nil {
			return err
		}
		defer fl.Close()
		b := &bench{cfg: cfg, bin: bin, fleet: fl, workload: w}
		if cfg.diagnose {
			b.arr = newArrivals(fl.(*simFleet).Workers)
			if cfg.diagTrace != "" {
				f, err := os.Create(cfg.diagTrace)
				if err != nil {
					return err
				}
				defer f.Close()
				b.trace = json.NewEncoder(f)
			}
		}
		fmt.Printf("fleet: %d %s workers at %v, %d KV blocks of %d tokens each (fleet %d)\n",
			len(fl.Addrs()), fl.Kind(), fl.Addrs(), fl.CapacityBlocks()/len(fl.Addrs()),
			fl.BlockTokens(), fl.CapacityBlocks())
		if cfg.slow > 0 {
			fmt.Printf("slow workers (%g× the prefill and decode time): %s\n", cfg.slowFactor, slowNames(cfg.workers, cfg.slow))
		}
		fmt.Printf("workload: %s, %d sessions, %d calls; %s\n\n", w.Name, len(w.Sessions), w.Calls(), cfg.loopDescription())

		if cfg.walkthrough && bin.has(moduleKV) {
			steps, err := b.walkthrough(ctx)
			if err != nil {
				return fmt.Errorf("walkthrough: %w", err)
			}
			out.Walkthrough = steps
		}
		if cfg.sweep {
			sw, err := b.sweep(ctx)
			if err != nil {
				return err
			}
			out.Sweep = sw
			fmt.Println()
			printSweep(os.Stdout, sw)
		} else {
			results, err := b.compare(ctx, policies)
			if err != nil {
				return err
			}
			out.Policies = results
			out.Addrs = fl.Addrs()
			out.Notes = append(notes, footnotes(results, cfg)...)
			fmt.Println()
			printComparison(os.Stdout, results, fl.Addrs(), cfg)
			printEnergy(os.Stdout, results, cfg)
			printLearned(os.Stdout, results, b.extras, cfg, b.fleetCharsPerToken())
			pairedRatios(os.Stdout, results, b.extras)
			twinRatios(os.Stdout, results)
			feedbackRatios(os.Stdout, results, b.extras)
		}
	}
	if cfg.overhead {
		if !bin.has(moduleKV) || !bin.has(moduleMatcher) {
			return errors.New("-overhead needs a Caddy with kv_cache_aware and llm_prompt (./xcaddy.sh build)")
		}
		oh, err := measureOverhead(ctx, cfg, bin)
		if err != nil {
			return fmt.Errorf("overhead: %w", err)
		}
		out.Overhead = oh
		fmt.Println()
		printOverhead(os.Stdout, oh)
	}
	out.WallSeconds = time.Since(start).Seconds()

	if cfg.jsonPath != "" {
		if err := writeJSON(cfg.jsonPath, out); err != nil {
			return err
		}
		fmt.Println("\nresults:", cfg.jsonPath)
	}
	if cfg.report != "" && (len(out.Policies) > 0 || len(out.Flow) > 0 || out.Sweep != nil || out.Overhead != nil) {
		if err := writeReport(cfg.report, out); err != nil {
			return err
		}
		fmt.Println("report:", cfg.report)
	}
	fmt.Printf("done in %s\n", time.Since(start).Round(time.Second))
	return ctx.Err()
}
