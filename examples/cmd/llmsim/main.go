// Command llmsim runs simulated OpenAI-compatible LLM workers: the fleet simulator's engine
// model (vLLM's scheduler and prefix cache) on the wall clock (see package examples/llmsim).
//
//	llmsim -addr 127.0.0.1:8001 -n 4 -capacity 16384
//
// starts four workers on ports 8001 to 8004, named llmsim-0 to llmsim-3.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "llmsim:", err)
		os.Exit(1)
	}
}

func run() error {
	var cfg llmsim.Config
	addr := flag.String("addr", "127.0.0.1:8001", "listen address of the first worker; worker i listens on its port + i (port 0: free ports)")
	n := flag.Int("n", 1, "number of workers")
	flag.StringVar(&cfg.Name, "name", llmsim.DefaultName, "worker name, reported in X-Kvsim-Worker; with -n > 1, worker i is <name>-<i>")
	flag.StringVar(&cfg.Model, "model", llmsim.DefaultModel, "model served; requests naming another model get 404")
	flag.IntVar(&cfg.CapacityBlocks, "capacity", llmsim.DefaultCapacityBlocks, "KV cache per worker, in blocks: running requests and the prefix cache share it (vLLM's num_gpu_blocks; negative: unlimited)")
	flag.IntVar(&cfg.BlockTokens, "block", llmsim.DefaultBlockTokens, "KV cache block size, in tokens (1 token = 4 chars)")
	flag.IntVar(&cfg.Slots, "slots", llmsim.DefaultSlots, "batch slots (vLLM's max_num_seqs): requests running at once; others queue FIFO")
	flag.IntVar(&cfg.MaxBatchTokens, "max-batch-tokens", llmsim.DefaultMaxBatchTokens, "tokens per engine step (max_num_batched_tokens): a decode takes one, prefills the rest, in chunks")
	flag.DurationVar(&cfg.StepFixed, "step-fixed", llmsim.DefaultStepFixed, "fixed part of an engine step (negative: none)")
	flag.DurationVar(&cfg.PrefillPerToken, "prefill", llmsim.DefaultPrefillPerToken, "engine step time per prefill token (negative: none)")
	flag.DurationVar(&cfg.PerSeq, "per-seq", llmsim.DefaultPerSeq, "engine step time per sequence in the step (negative: none)")
	flag.Float64Var(&cfg.Speed, "speed", 1, "divide every simulated time by this factor")
	flag.IntVar(&cfg.DefaultMaxTokens, "max-tokens", llmsim.DefaultMaxTokens, "output tokens of a request without max_tokens")
	flag.DurationVar(&cfg.MinEventInterval, "event-interval", llmsim.DefaultMinEventInterval, "least time between two streamed events (negative: one event per token)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: llmsim [flags]\n\n"+
			"Runs simulated OpenAI-compatible LLM workers (/v1/chat/completions, /v1/completions,\n"+
			"/v1/models, /health, /metrics, POST /reset) with a vLLM-like prefix cache.\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", flag.Args())
	}
	if *n < 1 {
		return fmt.Errorf("-n: need at least one worker, got %d", *n)
	}
	if cfg.Speed <= 0 {
		return fmt.Errorf("-speed: must be positive, got %v", cfg.Speed)
	}
	host, portStr, err := net.SplitHostPort(*addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("-addr: bad port %q", portStr)
	}

	var workers []*llmsim.Worker
	defer func() {
		for _, w := range workers {
			w.Close()
		}
	}()
	for i := range *n {
		c := cfg
		p := port
		if *n > 1 {
			c.Name = cfg.Name + "-" + strconv.Itoa(i)
			if port > 0 {
				p = port + i
			}
		}
		w, err := llmsim.StartWorker(net.JoinHostPort(host, strconv.Itoa(p)), c)
		if err != nil {
			return err
		}
		workers = append(workers, w)
		fmt.Printf("worker %s listening on %s\n", c.Name, w.URL)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, w := range workers {
		w.Shutdown(shutdown)
	}
	workers = nil
	return nil
}
