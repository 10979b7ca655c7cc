package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/fleetsim"
	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/replay"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// errHelp is returned by parseFlags after -h printed the usage.
var errHelp = flag.ErrHelp

// Per-workload defaults (examples/README.md, "Fleet sizes"). The chat workload is
// workload.DefaultChat (64 conversations of 8 turns over 8 system prompts) in closed loop with
// 16 clients: about 20 s per policy through Caddy. Its workers' KV cache holds the running
// requests and the prefix cache in one pool (vLLM's, and the fleet simulator's engine): 1,024
// blocks each, the 256 blocks of a prefix cache whose fleet-sized LRU hits about 0.41-0.50
// against 0.85 for an infinite cache, so that placement matters, beside a full batch of 8
// requests of 96 blocks (the mean prompt is 1,606 tokens, the mean answer 125). The Mooncake
// trace runs open loop by default, ten times faster than recorded, on workers ten times faster
// than real, each with 65,536 blocks; -open=false replays it closed loop, -concurrency clients
// each sending the trace's next request when its previous answer ends.
const (
	chatBlocksPerWorker     = workload.ChatFleetBlocks/4 + llmsim.DefaultSlots*96
	mooncakeBlocksPerWorker = workload.MooncakeFleetBlocks / 4
	mooncakeSpeed           = 10
	mooncakeTimeScale       = 0.1
	defaultConcurrency      = 16
	// conversationRequests is -workload conversation's default -limit: the requests demosim's
	// demo-conversation-closed-16-4slots sends.
	conversationRequests = 1000
)

// config is the demo's command line.
type config struct {
	caddy    string
	fleet    string // sim | llmd
	workers  int
	blocks   int         // KV blocks per worker; 0: the workload's default
	engine   engineFlags // sim fleet: the engine's parameters besides blocks
	speed    float64     // simulated worker speed; 0: the workload's default
	policies string      // comma list; empty: all available
	repeats  int

	kind          string // chat | mooncake | a flow workload (flowWorkloads)
	chat          workload.ChatConfig
	sessionHeader bool
	concurrency   int
	openLoop      bool
	openSet       bool // -open given on the command line (mooncake: else open loop)
	trace         string
	limit         int
	sample        int
	timeScale     float64
	maxOutput     int

	kvOptions   []string
	kvCapacity  bool
	telemetry   bool
	sideLoad    int
	energy      []workerEnergy // -energy: per worker, in order; nil: no annotation
	sweep       bool
	walkthrough bool

	overhead         bool
	overheadClients  int
	overheadDuration time.Duration
	overheadRounds   int

	slow             int           // -slow: the last N workers are slowFactor× slower
	slowFactor       float64       // -slow-factor
	restartAt        time.Duration // -restart-at: 0 off
	compareTelemetry bool          // -compare-telemetry
	compareFeedback  bool          // -compare-feedback
	interleave       bool          // -interleave

	replicas   int    // -replicas: 0 off
	natsServer string // nats-server binary for -replicas' cluster
	outage     time.Duration
	outageAt   time.Duration
	late       time.Duration // -late-replica: 0 off

	// The flow workloads (issue 35, flow.go): the scenarios -workload names, the first class's
	// requests (0: the family's default), the fleet's capacity in requests per second (0:
	// estimated from the sim fleet's per-token times) and goodput's TTFT bound.
	flow         []flowScenario
	flowRequests int
	capacity     float64
	slo          time.Duration
	keepRecords  bool // every run keeps its records (the flow workloads split them by class)
	maxInFlight  int  // open loop: calls in flight at most (0: the replay's 256)

	// -diagnose: every decision seen both ways (diagnose.go); diagTrace: where its records go.
	diagnose  bool
	diagTrace string

	jsonPath string
	report   string
	llmdBin  string
	verbose  bool

	given map[string]bool // the flags given on the command line
	// defaultPolicies, when set, are the policies run without -policies (the Ollama fleet's:
	// each run costs real prefills on the machine's CPUs).
	defaultPolicies []string
}

// parseFlags parses the command line into a config, defaults filled in per workload.
func parseFlags(args []string) (*config, error) {
	cfg := &config{chat: workload.DefaultChat}
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.StringVar(&cfg.caddy, "caddy", "", "Caddy binary with kvroute built in (required; ./xcaddy.sh build makes ./caddy, ./xcaddy.sh demo makes ./caddy-demo with the peer policies)")
	fs.StringVar(&cfg.fleet, "fleet", "sim", "worker fleet: sim (our simulator, in process), llmd (llm-d-inference-sim processes, built on first use) or ollama (real Ollama engines serving a tiny model, CPU-only: examples/ollama, built on first use with cgo, which needs a C/C++ compiler; unless given, its chat runs 12 conversations of 4 turns over 3 system prompts with 4 clients, 3 interleaved rounds of kv_cache_aware, sglang_cache_aware, least_conn and round_robin: a few minutes)")
	fs.IntVar(&cfg.workers, "workers", 4, "workers in the fleet")
	fs.IntVar(&cfg.blocks, "cache-blocks", 0, fmt.Sprintf("KV cache per worker in blocks, running requests and prefix cache together as in vLLM (default: chat %d, mooncake %d)", chatBlocksPerWorker, mooncakeBlocksPerWorker))
	fs.IntVar(&cfg.engine.maxNumSeqs, "max-num-seqs", llmsim.DefaultSlots, "sim fleet: requests in a worker's batch at most (vLLM's max_num_seqs; the fleet simulator's engine.Config.MaxNumSeqs)")
	fs.IntVar(&cfg.engine.maxBatchTokens, "max-batch-tokens", llmsim.DefaultMaxBatchTokens, "sim fleet: tokens per engine step (max_num_batched_tokens): a decode takes one, prefills the rest, in chunks")
	fs.IntVar(&cfg.engine.blockTokens, "block-tokens", llmsim.DefaultBlockTokens, "sim fleet: KV block size in tokens")
	fs.DurationVar(&cfg.engine.stepFixed, "step-fixed", llmsim.DefaultStepFixed, "sim fleet: fixed part of an engine step (a step lasts step-fixed + prefill-per-token × its prefill tokens + per-seq × its sequences, divided by -speed; -slow's workers × -slow-factor)")
	fs.DurationVar(&cfg.engine.prefillPerToken, "prefill-per-token", llmsim.DefaultPrefillPerToken, "sim fleet: engine step time per prefill token")
	fs.DurationVar(&cfg.engine.perSeq, "per-seq", llmsim.DefaultPerSeq, "sim fleet: engine step time per sequence in the step")
	fs.Float64Var(&cfg.speed, "speed", 0, fmt.Sprintf("sim fleet: simulated time runs this many times faster (default: chat 1, mooncake %d)", mooncakeSpeed))
	fs.StringVar(&cfg.policies, "policies", "", "comma list of policies to run (kv_cache_aware, round_robin, least_conn, random, header, sglang_cache_aware, prefix_hash, and the variants kv_cost, kv_thresholds and kv_energy: kv_cache_aware with decision cost, decision thresholds, or decision cost with objective energy (see -energy); kv_cache_aware or a variant followed by a colon and Caddyfile lines separated by semicolons adds them to its block, each in place of a line there (or from -kv-options) that sets the same option, to compare settings in one run (e.g. kv_cost,kv_cost:ttft_slack 1, quoted for the shell); none: skip the comparison); default: all the Caddy binary has but the variants")
	fs.IntVar(&cfg.repeats, "repeats", 1, "run each policy N times and report the mean and the min-max of hit ratio and imbalance")

	fs.StringVar(&cfg.kind, "workload", "chat", "workload: chat (synthetic multi-turn conversations), mooncake (the Mooncake trace), conversation (the fleet simulator's look-alike of Mooncake's conversation trace: -limit requests, default 1,000, from -seed; closed loop unless -open), or issue 35's flow-control scenarios, as the fleet simulator's: tenants_alone, tenants_flood, priority_alone, priority_flood, tenants (both tenants_*), priority (both priority_*) or flow (all four, then the targets); kv_flow (kv_cache_aware with flow_control) joins the default policies")
	fs.IntVar(&cfg.flowRequests, "flow-requests", 0, fmt.Sprintf("flow workloads: the first class's requests (light, interactive), a multiple of -turns; the second class sends 10× (heavy) or 2× (batch) as many (default: tenants %d, priority %d)", flowFamilies["tenants"].requests, flowFamilies["priority"].requests))
	fs.Float64Var(&cfg.capacity, "capacity", 0, "flow workloads: the fleet's capacity in requests per second with no prefix cache, which the classes' rates are fractions of (0: the fleet simulator's calibration of its chat fleet, whose engine model llmsim runs, × -speed × -workers / 4; required with another -fleet, -slow or engine flags)")
	fs.DurationVar(&cfg.slo, "slo", 0, "flow workloads: goodput counts the requests answered with a TTFT within this (0: the fleet simulator's chat SLO, 3 × an oracle's TTFT p50 at half its capacity, / -speed)")
	fs.IntVar(&cfg.chat.Conversations, "conversations", cfg.chat.Conversations, "chat: conversations")
	fs.IntVar(&cfg.chat.Turns, "turns", cfg.chat.Turns, "chat: user turns per conversation")
	fs.IntVar(&cfg.chat.SystemPrompts, "system-prompts", cfg.chat.SystemPrompts, "chat: distinct system prompts shared by the conversations")
	fs.Uint64Var(&cfg.chat.Seed, "seed", cfg.chat.Seed, "chat and conversation: random seed")
	fs.BoolVar(&cfg.sessionHeader, "session-header", false, "chat: send the conversation id in X-Session-ID (off: the main comparison is on prompts alone)")
	fs.IntVar(&cfg.concurrency, "concurrency", defaultConcurrency, "closed loop: concurrent clients")
	fs.BoolVar(&cfg.openLoop, "open", false, "open loop: chat conversations arrive at -rate, mooncake requests at the trace's times × -time-scale; closed loop: -concurrency clients, each sending its next conversation turn or trace request (in trace order) when its previous answer ends (default: chat closed, mooncake open; -open=false replays the trace closed loop)")
	fs.Float64Var(&cfg.chat.Rate, "rate", cfg.chat.Rate, "chat, open loop: conversations started per second")

	fs.StringVar(&cfg.trace, "trace", "", "mooncake: a Mooncake-format trace file, plain or gzip-compressed (default: the trace shipped in examples/workload/traces, or $KVROUTE_WORKLOADS/"+workload.TraceFile+" when that variable is set)")
	fs.IntVar(&cfg.limit, "limit", 0, "send only the first N sessions (trace requests or conversations), after sampling; 0: all")
	fs.IntVar(&cfg.sample, "sample", 1, "mooncake: keep one trace request in N (timestamps kept)")
	fs.Float64Var(&cfg.timeScale, "time-scale", 0, fmt.Sprintf("open loop: multiply send times (default: mooncake %g, chat 1)", mooncakeTimeScale))
	fs.IntVar(&cfg.maxOutput, "max-output", 0, "mooncake: cap output tokens per request; 0: the trace's")

	kv := fs.String("kv-options", "", `extra lines inside the kv_cache_aware block, separated by ";" (e.g. "cache_threshold 0.3; balance_abs_threshold 8")`)
	fs.BoolVar(&cfg.kvCapacity, "kv-capacity", true, "annotate each upstream of kv_cache_aware with its prefix cache size (kv_capacity, in tokens), as an operator would from vLLM's \"GPU KV cache size\" log line; false: no annotation")
	fs.BoolVar(&cfg.telemetry, "telemetry", true, "kv_cache_aware reads each worker's /metrics (KV capacity, queue, health; its default); false: `telemetry off`, the baseline without the engines' figures")
	en := fs.String("energy", "", "annotate each upstream of kv_cache_aware with its energy per token (prefill_energy_per_token, energy_per_token) and report each policy's joules per request, charged per worker from the tokens it reported: (prompt - cached) × its prefill energy + output × its decode energy. A comma list, one entry per worker in order or one for all; an entry is PREFILL/DECODE with units (25mJ/150mJ), one energy for both, or a preset: h100 (25mJ/150mJ) or a100 (40mJ/210mJ), an 8B model at a decode batch of about 64, board power over tokens per second (the older GPU: a third of the prefill throughput at 400 W against 700 W, 0.6 of the memory bandwidth for decode). e.g. h100,h100,a100,a100; with -slow 2 -slow-factor 2 the A100s are also slower. The variant kv_energy runs decision cost with objective energy")
	fs.IntVar(&cfg.sideLoad, "side-load", 0, "closed-loop clients sending cold prompts straight to the first worker during each replay: traffic the router did not send (0: none)")
	fs.BoolVar(&cfg.sweep, "sweep", false, "run kv_cache_aware alone over a grid of cache_threshold × balance_abs_threshold × on_imbalance and print a table")
	fs.IntVar(&cfg.slow, "slow", 0, "a heterogeneous fleet: the last N workers are -slow-factor times slower at prefill and decode (sim: its per-token times; llmd: --prefill-time-per-token and --inter-token-latency); kv_cache_aware's learned prefill speeds are printed against the configured ones")
	fs.Float64Var(&cfg.slowFactor, "slow-factor", 4, "-slow: how many times slower the slow workers are")
	fs.DurationVar(&cfg.restartAt, "restart-at", 0, "restart w0 with an empty cache this long after each replay starts (sim: cache, counters and start time reset; llmd: the process killed and started again on its port); prints the restarts kv_cache_aware counted, w0's share of its trees before and after, hit ratio and p99 TTFT in the minute after (0: not)")
	fs.BoolVar(&cfg.interleave, "interleave", false, "with -repeats, run every policy once per repeat (a, b, c, a, b, c, ...) instead of all of a's repeats first: a drift in the machine's load then falls on every policy alike")
	fs.BoolVar(&cfg.compareTelemetry, "compare-telemetry", false, "also run kv_cache_aware with `telemetry off`, alternating with the telemetry run at each repeat, and print the same-run ratios on/off (median, min-max)")
	fs.BoolVar(&cfg.compareFeedback, "compare-feedback", false, "also run kv_cache_aware with `llm_feedback @llm` in the site, alternating with the run without it at each repeat; prints after each run with it the cached tokens its tree predicted against those the answers reported, and the same-run ratios with/without (median, min-max)")
	fs.BoolVar(&cfg.walkthrough, "walkthrough", true, "show kv_cache_aware routing a conversation and unrelated prompts before the comparison")

	fs.BoolVar(&cfg.overhead, "overhead", false, "also measure requests/s through Caddy with kv_cache_aware + llm_prompt vs round_robin on a trivial upstream (with -policies none: only that)")
	fs.IntVar(&cfg.overheadClients, "overhead-clients", 16, "overhead: concurrent keep-alive clients")
	fs.DurationVar(&cfg.overheadDuration, "overhead-duration", 2*time.Second, "overhead: measuring time per policy per round")
	fs.IntVar(&cfg.overheadRounds, "overhead-rounds", 6, "overhead: rounds, alternating the policies' order to cancel drift")

	fs.IntVar(&cfg.replicas, "replicas", 0, "run every policy behind N Caddy replicas and a front Caddy spreading requests round-robin per request; kv_cache_aware runs at 1 replica, N alone and N with cluster (needs -nats-server)")
	fs.StringVar(&cfg.natsServer, "nats-server", "", "replicas: the nats-server binary (./xcaddy.sh demo installs it when -replicas is given)")
	fs.DurationVar(&cfg.outage, "nats-outage", 0, "replicas: also run kv_cache_aware with the cluster's NATS stopped for this long mid-run (0: not)")
	fs.DurationVar(&cfg.outageAt, "nats-outage-at", 3*time.Second, "replicas: when, after the replay starts, NATS is stopped")
	fs.DurationVar(&cfg.late, "late-replica", 0, "replicas: also run kv_cache_aware with the cluster and the last replica started this long after the replay starts (the front lists it from the start and skips it until it listens); prints its catch-up time and its hit ratio against the others' (0: not)")
	fs.BoolVar(&cfg.diagnose, "diagnose", false, "sim fleet: after each run, the fleet simulator's -diagnose table for it: every request as it arrived at its worker (what each worker's engine held, the greedy oracle's TTFT there) against, for kv_cache_aware, what the router believed when it chose (its decision trace, kv_cache_aware's debug log), joined by Caddy's request id (X-Request-Id); and the TTFT spent outside the engine")
	fs.StringVar(&cfg.diagTrace, "decisions", "", "with -diagnose: write every decision to this file, one JSON object a line (fleetsim.DecisionRecord, as fleetsim -diagnose -decisions writes them)")
	fs.StringVar(&cfg.jsonPath, "json", "", "write machine-readable results to this file")
	fs.StringVar(&cfg.report, "report", "demo-report.html", "write the HTML report to this file (empty: none)")
	fs.StringVar(&cfg.llmdBin, "llmd-bin", "", "llmd fleet: llm-d-inference-sim binary (default: examples/llmdsim/bin/llm-d-inference-sim, built when missing)")
	fs.BoolVar(&cfg.verbose, "v", false, "show the generated Caddyfiles and the replay progress")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: demo -caddy PATH [flags]\n\n"+
			"Replays a workload through Caddy once per load-balancing policy on a fleet of simulated\n"+
			"LLM workers and prints a comparison table and an HTML report.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	err := fs.Parse(args)
	if err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	cfg.given = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { cfg.given[f.Name] = true })
	cfg.openSet = cfg.given["open"]
	cfg.kvOptions = splitOptions(*kv)
	if cfg.energy, err = parseEnergy(*en, cfg.workers); err != nil {
		return nil, err
	}
	if !cfg.telemetry {
		cfg.kvOptions = append(cfg.kvOptions, "telemetry off")
	}
	return cfg, cfg.finish()
}

// finish checks the flags and fills in the per-workload defaults.
func (c *config) finish() error {
	if c.caddy == "" {
		return errors.New("-caddy is required: the Caddy binary to run (./xcaddy.sh build makes ./caddy)")
	}
	if c.fleet != "sim" && c.fleet != "llmd" && c.fleet != "ollama" {
		return fmt.Errorf("-fleet: want sim, llmd or ollama, got %q", c.fleet)
	}
	if c.sideLoad < 0 {
		return errors.New("-side-load must be >= 0")
	}
	if c.workers < 1 || c.repeats < 1 || c.concurrency < 1 || c.sample < 1 {
		return errors.New("-workers, -repeats, -concurrency and -sample must be at least 1")
	}
	if c.slow < 0 || c.slow > c.workers || !(c.slowFactor >= 1) || math.IsInf(c.slowFactor, 0) {
		return errors.New("-slow must be between 0 and -workers, -slow-factor at least 1")
	}
	if c.restartAt < 0 {
		return errors.New("-restart-at must be 0 (off) or positive")
	}
	if c.compareTelemetry && !c.telemetry {
		return errors.New("-compare-telemetry runs kv_cache_aware with and without telemetry: leave -telemetry on")
	}
	if c.compareFeedback && c.compareTelemetry {
		// Each pairs kv_cache_aware with one twin; both would make four variants whose
		// same-run ratios no longer name one difference.
		return errors.New("-compare-feedback and -compare-telemetry: one comparison at a time")
	}
	if c.compareFeedback && c.replicas > 0 {
		return errors.New("-compare-feedback runs one Caddy: leave -replicas off")
	}
	if c.replicas < 0 {
		return errors.New("-replicas must be 0 (off) or more")
	}
	if c.late < 0 || (c.late > 0 && c.replicas < 2) {
		return errors.New("-late-replica needs -replicas 2 or more")
	}
	if c.diagnose && c.fleet != "sim" {
		return errors.New("-diagnose reads what the engines held from the sim fleet's workers: -fleet sim")
	}
	if c.diagTrace != "" && !c.diagnose {
		return errors.New("-decisions writes -diagnose's records: give -diagnose")
	}
	if c.diagnose {
		c.keepRecords = true // each record's TTFT at the client
	}
	if c.overheadClients < 1 || c.overheadRounds < 1 || c.overheadDuration <= 0 {
		return errors.New("-overhead-clients, -overhead-rounds and -overhead-duration must be positive")
	}
	if sc, ok := flowWorkloads(c.kind); ok {
		c.flow = sc
		if c.capacity < 0 || c.flowRequests < 0 || c.slo < 0 {
			return errors.New("-capacity, -flow-requests and -slo must be 0 (the default) or positive")
		}
		if !c.defaultEngine() && c.capacity == 0 {
			return errors.New("-workload " + c.kind + " on another fleet than the sim's default engines (-fleet, -slow, engine flags): give the fleet's capacity (-capacity requests/s)")
		}
		if c.flowRequests > 0 && c.flowRequests < c.chat.Turns {
			return fmt.Errorf("-flow-requests %d: at least one conversation of %d turns", c.flowRequests, c.chat.Turns)
		}
		if c.blocks == 0 {
			c.blocks = flowBlocksPerWorker
		}
		if c.speed == 0 {
			c.speed = 1
		}
		c.openLoop, c.timeScale, c.keepRecords, c.maxInFlight = true, 1, true, flowMaxInFlight
		return nil
	}
	switch c.kind {
	case "chat":
		if c.fleet == "ollama" {
			c.ollamaDefaults()
		}
		if c.blocks == 0 {
			c.blocks = chatBlocksPerWorker
			switch c.fleet {
			case "llmd":
				c.blocks = llmdChatBlocks
			case "ollama":
				c.blocks = ollamaParallel * ollamaContext / 16 // what its slots hold
			}
		}
		if c.speed == 0 {
			c.speed = 1
		}
		if c.timeScale == 0 {
			c.timeScale = 1
		}
		if c.sessionHeader {
			c.chat.SessionHeader = "X-Session-ID"
		}
	case "mooncake":
		if c.blocks == 0 {
			c.blocks = mooncakeBlocksPerWorker
		}
		if c.speed == 0 {
			c.speed = mooncakeSpeed
		}
		if c.timeScale == 0 {
			c.timeScale = mooncakeTimeScale
		}
		if !c.openSet {
			c.openLoop = true
		}
	case "conversation":
		// The fleet simulator's look-alike of Mooncake's conversation trace, closed loop
		// unless -open: what demosim's demo-conversation-closed-16-4slots runs.
		if c.blocks == 0 {
			c.blocks = mooncakeBlocksPerWorker
		}
		if c.speed == 0 {
			c.speed = mooncakeSpeed
		}
		if c.timeScale == 0 {
			c.timeScale = mooncakeTimeScale
		}
		if c.limit == 0 {
			c.limit = conversationRequests
		}
	default:
		return fmt.Errorf("-workload: want chat, mooncake, conversation or a flow workload (tenants_alone, tenants_flood, priority_alone, priority_flood, tenants, priority, flow), got %q", c.kind)
	}
	if c.blocks < 1 || c.speed <= 0 || c.timeScale <= 0 {
		return errors.New("-cache-blocks, -speed and -time-scale must be positive")
	}
	if e := c.engine; e.maxNumSeqs < 1 || e.maxBatchTokens < 1 || e.blockTokens < 1 || e.stepFixed < 0 || e.prefillPerToken < 0 || e.perSeq < 0 {
		return errors.New("-max-num-seqs, -max-batch-tokens and -block-tokens must be positive, -step-fixed, -prefill-per-token and -per-seq at least 0")
	}
	return nil
}

// The Ollama fleet's chat defaults: real prefills on the machine's CPUs, a few minutes in all
// (docs/benchmarks.md, "On a real engine": 48 calls per run of about 1,500 prompt tokens each,
// 3 interleaved rounds of the 4 policies compared there). A flag given on the command line wins.
var ollamaChat = struct {
	conversations, systemPrompts, turns, concurrency, repeats int
	policies                                                  []string
}{12, 3, 4, 4, 3, []string{"kv_cache_aware", "sglang_cache_aware", "least_conn", "round_robin"}}

func (c *config) ollamaDefaults() {
	for name, set := range map[string]func(){
		"conversations":  func() { c.chat.Conversations = ollamaChat.conversations },
		"system-prompts": func() { c.chat.SystemPrompts = ollamaChat.systemPrompts },
		"turns":          func() { c.chat.Turns = ollamaChat.turns },
		"concurrency":    func() { c.concurrency = ollamaChat.concurrency },
		"repeats":        func() { c.repeats = ollamaChat.repeats },
		"interleave":     func() { c.interleave = true },
		"policies":       func() { c.defaultPolicies = ollamaChat.policies },
	} {
		if !c.given[name] {
			set()
		}
	}
}

// engineFlags are the sim fleet's engine parameters (llmsim.Config, the fleet simulator's
// engine.Config).
type engineFlags struct {
	maxNumSeqs, maxBatchTokens, blockTokens int
	stepFixed, prefillPerToken, perSeq      time.Duration
}

func (e engineFlags) String() string {
	return fmt.Sprintf("max_num_seqs %d, max_batch_tokens %d, block %d tokens, step %v + %v/prefill token + %v/seq",
		e.maxNumSeqs, e.maxBatchTokens, e.blockTokens, e.stepFixed, e.prefillPerToken, e.perSeq)
}

// splitOptions splits "-kv-options" into Caddyfile lines (on ";" and newlines).
func splitOptions(s string) []string {
	var out []string
	for _, line := range strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == '\n' }) {
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return out
}

// workload builds the workload the flags describe.
func (c *config) workload() (workload.Workload, error) {
	if c.kind == "chat" {
		return workload.ChatWorkload(c.chat).Limit(c.limit), nil
	}
	if c.kind == "conversation" {
		w := workload.MooncakeWorkload(fleetsim.ConversationTrace(c.limit, c.chat.Seed), workload.MooncakeConfig{Model: workload.DefaultChat.Model, MaxTokens: c.maxOutput})
		w.Name = "conversation"
		return w, nil
	}
	load := workload.Mooncake
	if c.trace != "" {
		load = func() ([]workload.Request, error) { return workload.LoadMooncake(c.trace) }
	}
	reqs, err := load()
	if err != nil {
		return workload.Workload{}, err
	}
	if c.sample > 1 {
		kept := reqs[:0:0]
		for i := 0; i < len(reqs); i += c.sample {
			kept = append(kept, reqs[i])
		}
		reqs = kept
	}
	w := workload.MooncakeWorkload(reqs, workload.MooncakeConfig{Model: workload.DefaultChat.Model, MaxTokens: c.maxOutput})
	return w.Limit(c.limit), nil
}

// replayOptions returns the replay options of one run against baseURL.
func (c *config) replayOptions(baseURL string, fleetBlocks, blockTokens int) replay.Options {
	o := replay.Options{
		BaseURL:     baseURL,
		Concurrency: c.concurrency,
		OpenLoop:    c.openLoop,
		TimeScale:   c.timeScale,
		FleetBlocks: fleetBlocks,
		BlockTokens: blockTokens,
		Workers:     c.workers,
		Timeout:     2 * time.Minute,
		// Per-request records in the JSON output; -energy charges each request to its worker.
		KeepRecords: c.jsonPath != "" || c.energy != nil || c.keepRecords,
		MaxInFlight: c.maxInFlight,
	}
	if c.verbose && isTerminal(os.Stderr) {
		o.Progress = os.Stderr
	}
	return o
}

// loopDescription says how the workload is sent, for the header lines.
func (c *config) loopDescription() string {
	if len(c.flow) > 0 {
		return fmt.Sprintf("open loop, each class at its share of the fleet's capacity (per scenario), speed %g", c.speed)
	}
	if c.openLoop {
		return fmt.Sprintf("open loop, time scale %g", c.timeScale)
	}
	return fmt.Sprintf("closed loop, %d clients", c.concurrency)
}

// params are the settings recorded in the JSON and the report.
type params struct {
	Fleet           string   `json:"fleet"`
	Workers         int      `json:"workers"`
	BlocksPerWorker int      `json:"blocks_per_worker"`
	Speed           float64  `json:"speed,omitempty"`
	Engine          string   `json:"engine,omitempty"` // sim fleet: the engine's parameters
	Workload        string   `json:"workload"`
	Conversations   int      `json:"conversations,omitempty"`
	Turns           int      `json:"turns,omitempty"`
	SystemPrompts   int      `json:"system_prompts,omitempty"`
	SessionHeader   bool     `json:"session_header"`
	Loop            string   `json:"loop"`
	Trace           string   `json:"trace,omitempty"`
	Limit           int      `json:"limit,omitempty"`
	Sample          int      `json:"sample,omitempty"`
	Repeats         int      `json:"repeats"`
	KVOptions       []string `json:"kv_options,omitempty"`
	KVCapacity      bool     `json:"kv_capacity"`         // upstreams annotated with their cache size
	Telemetry       bool     `json:"telemetry"`           // kv_cache_aware reads the workers' metrics
	SideLoad        int      `json:"side_load,omitempty"` // clients sending straight to the first worker
	Energy          []string `json:"energy,omitempty"`    // per worker: prefill/decode energy per token
	Slow            int      `json:"slow,omitempty"`      // the last N workers are SlowFactor× slower
	SlowFactor      float64  `json:"slow_factor,omitempty"`
	RestartAt       string   `json:"restart_at,omitempty"` // w0 restarted this long into each replay
	Caddy           string   `json:"caddy"`
}

func (c *config) params() params {
	p := params{
		Fleet: c.fleet, Workers: c.workers, BlocksPerWorker: c.blocks, Workload: c.kind,
		SessionHeader: c.sessionHeader, Loop: c.loopDescription(), Limit: c.limit,
		Repeats: c.repeats, KVOptions: c.kvOptions, KVCapacity: c.kvCapacity, Telemetry: c.telemetry, SideLoad: c.sideLoad, Caddy: c.caddy,
	}
	if c.fleet == "sim" {
		p.Speed = c.speed
		p.Engine = c.engine.String()
	}
	for _, e := range c.energy {
		p.Energy = append(p.Energy, e.String())
	}
	if c.slow > 0 {
		p.Slow, p.SlowFactor = c.slow, c.slowFactor
	}
	if c.restartAt > 0 {
		p.RestartAt = c.restartAt.String()
	}
	if c.kind == "chat" {
		p.Conversations, p.Turns, p.SystemPrompts = c.chat.Conversations, c.chat.Turns, c.chat.SystemPrompts
	} else {
		p.Trace, p.Sample, p.SessionHeader = c.trace, c.sample, false
	}
	return p
}

// isTerminal reports whether f is a character device, as a terminal is.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
