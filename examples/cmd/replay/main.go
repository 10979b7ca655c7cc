// Command replay sends a workload (synthetic multi-turn chat, or the Mooncake trace) to an
// OpenAI-compatible endpoint and prints the measurements as JSON (see package
// examples/replay).
//
//	replay -url http://127.0.0.1:8080 -workload chat -fleet-blocks 65536 -workers 4
//	replay -workload mooncake -open -time-scale 0.1 -dry-run -fleet-blocks 65536
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvroute/caddy-kvroute/examples/replay"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "replay:", err)
		os.Exit(1)
	}
}

func run() error {
	var opts replay.Options
	chat := workload.DefaultChat
	flag.StringVar(&opts.BaseURL, "url", "http://127.0.0.1:8080", "base URL of the router (or of one worker)")
	kind := flag.String("workload", "chat", "workload: chat or mooncake")
	limit := flag.Int("limit", 0, "send only the first N sessions (conversations or trace requests); 0: all")

	flag.IntVar(&chat.Conversations, "conversations", chat.Conversations, "chat: conversations")
	flag.IntVar(&chat.SystemPrompts, "system-prompts", chat.SystemPrompts, "chat: distinct system prompts shared by the conversations")
	flag.IntVar(&chat.Turns, "turns", chat.Turns, "chat: turns per conversation")
	flag.StringVar(&chat.SessionHeader, "session-header", "", "chat: send the conversation id in this header (e.g. X-Session-ID); empty: none")
	flag.Uint64Var(&chat.Seed, "seed", chat.Seed, "chat: random seed")
	flag.Float64Var(&chat.Rate, "rate", chat.Rate, "chat, open loop: conversations started per second")
	flag.DurationVar(&chat.Think, "think", chat.Think, "chat, open loop: time between the turns of a conversation")

	trace := flag.String("trace", "", "mooncake: a Mooncake-format trace file, plain or gzip-compressed (default: the trace shipped in examples/workload/traces, or $KVROUTE_WORKLOADS/"+workload.TraceFile+" when that variable is set)")
	api := flag.String("api", "completions", "mooncake: send prompts as completions or as chat (one user message)")
	maxOut := flag.Int("max-output", 0, "mooncake: cap output tokens per request; 0: the trace's")
	model := flag.String("model", workload.DefaultChat.Model, "model named in the requests (empty: none)")

	flag.IntVar(&opts.Concurrency, "concurrency", 16, "closed loop: concurrent clients")
	flag.BoolVar(&opts.OpenLoop, "open", false, "open loop: send at the workload's times instead of closed loop")
	flag.Float64Var(&opts.TimeScale, "time-scale", 1, "open loop: multiply send times (0.1 = ten times faster)")
	flag.IntVar(&opts.MaxInFlight, "max-inflight", 256, "open loop: most calls in flight; later arrivals wait")
	stream := flag.Bool("stream", true, "stream responses (TTFT = first event); false: TTFT = latency")
	flag.IntVar(&opts.BlockTokens, "block", 16, "fleet's KV block size in tokens, for the reference")
	flag.IntVar(&opts.FleetBlocks, "fleet-blocks", 0, "fleet's total prefix cache capacity in blocks, for the reference hit ratio (the demo's: 1024 for chat, 262144 for mooncake); 0: skip it")
	flag.IntVar(&opts.Workers, "workers", 0, "fleet size, so that idle workers count in the imbalance; 0: workers seen")
	flag.DurationVar(&opts.Timeout, "timeout", 0, "timeout per call (default 10m)")
	dry := flag.Bool("dry-run", false, "send nothing: compute the reference and infinite-cache hit ratios offline")
	records := flag.Bool("records", false, "include every call's record in the output")
	out := flag.String("o", "-", "write the result JSON to this file (-: stdout)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: replay [flags]\n\n"+
			"Replays a workload against an OpenAI-compatible endpoint and prints the result as JSON:\n"+
			"hit ratio (and the reference of one fleet-sized LRU), TTFT and latency percentiles,\n"+
			"requests per worker. Progress goes to stderr when it is a terminal.\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", flag.Args())
	}
	opts.NoStream = !*stream
	opts.KeepRecords = *records
	chat.Model = *model

	var w workload.Workload
	switch *kind {
	case "chat":
		w = workload.ChatWorkload(chat)
	case "mooncake":
		var cfg workload.MooncakeConfig
		switch *api {
		case "completions":
			cfg.API = workload.APICompletions
		case "chat":
			cfg.API = workload.APIChat
		default:
			return fmt.Errorf("-api: want completions or chat, got %q", *api)
		}
		cfg.Model, cfg.MaxTokens = *model, *maxOut
		load := workload.Mooncake
		if *trace != "" {
			load = func() ([]workload.Request, error) { return workload.LoadMooncake(*trace) }
		}
		reqs, err := load()
		if err != nil {
			return err
		}
		w = workload.MooncakeWorkload(reqs, cfg)
	default:
		return fmt.Errorf("-workload: want chat or mooncake, got %q", *kind)
	}
	w = w.Limit(*limit)

	var res *replay.Result
	if *dry {
		res = replay.Estimate(w, opts)
	} else {
		if isTerminal(os.Stderr) {
			opts.Progress = os.Stderr
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		var err error
		if res, err = replay.Run(ctx, w, opts); err != nil {
			return err
		}
	}
	return writeResult(*out, res)
}

func writeResult(path string, res *replay.Result) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if path == "-" {
		_, err = os.Stdout.Write(b)
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// isTerminal reports whether f is a character device, as a terminal is (the standard library
// has no isatty; a pipe or a file is not a character device).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
