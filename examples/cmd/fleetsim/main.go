// Command fleetsim runs the fleet simulator's scorecard (package examples/fleetsim): every
// scenario, seed and routing policy in virtual time. It writes every run to DIR/scorecard.json
// and prints the medians over the seeds: where kv_cache_aware stands per scenario (-table
// summary), every policy's figures per scenario (-table medians), or every run (-table runs).
// ./xcaddy.sh sim runs it.
//
//	fleetsim -out DIR [-scenarios REGEXP] [-seeds N] [-parallel N] [-requests N] [-table T] [-list]
//	fleetsim -show DIR [-table T]          print a card already written
//	fleetsim -compare BEFORE[,AFTER]       judge cards against issue 34's targets
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/caddy-kvroute/energy"
	"github.com/kvroute/caddy-kvroute/examples/fleetsim"
	"github.com/kvroute/caddy-kvroute/kvroute/decide"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command with its arguments and outputs: the exit code (2 for bad flags).
func run(args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("fleetsim", flag.ContinueOnError)
	flags.SetOutput(stderr)
	out := flags.String("out", "", "directory to write scorecard.json into (required)")
	scen := flags.String("scenarios", "", "run only the scenarios whose name matches this regular expression")
	seeds := flags.Int("seeds", 3, "seeds per scenario (1..N)")
	parallel := flags.Int("parallel", 0, "scenario-seeds run at once (default: GOMAXPROCS)")
	def := flags.String("default", "", "the decision kvroute's kv_cache_aware runs: thresholds or cost (default: kvroute's own default)")
	list := flags.Bool("list", false, "list the scenarios and exit")
	slots := flags.Int("slots", 0, "with -diagnose: run every engine with this many batch slots (max_num_seqs) instead of the scenario's")
	tune := flags.String("options", "", "change the decision's options of kvroute's policies (an experiment: -diagnose's and the card's), comma-separated: cache_threshold=X, balance_abs=N, balance_rel=X, on_imbalance=least_busy|prefix_in_band, fallback=joule|least_busy|round_robin|random, slot_rank=0|1, slot_move=0|1, speed_rank=0|1, full_stay=0|1; late binding: queue_timeout=SECONDS (0: off), hold_margin=N (hold when every engine runs its learned slots + N); kv_flow (the flow-control scenarios' policy): hold_margin, flow_spread=N (a request may go to an engine up to N beyond full)")
	traceOut := flags.String("decisions", "", "with -diagnose: write every decision to this file, one JSON object a line (fleetsim.DecisionRecord: what the router believed of each engine, what was true there; the demo's -diagnose writes the same)")
	diagnose := flags.Bool("diagnose", false, "instead of the card: diagnose kvroute's decisions (kv_thresholds, kv_cost) on the chosen scenarios and seeds: per decision path, how often a full engine was chosen while another was free")
	requests := flags.Int("requests", 0, "cap every scenario's requests (a quick look; the card's figures are for the full counts)")
	only := flags.String("policies", "", "run only the policies whose name matches this regular expression (with -compare's -base, a card of kvroute's policies alone can be judged)")
	compare := flags.String("compare", "", "instead of running: judge scorecard.json files against issue 34's targets (medians over seeds; BEFORE[,AFTER]: both, and the change)")
	policy := flags.String("policy", "kv_cache_aware", "the policy judged: -compare's, and the summary's")
	base := flags.String("base", "", "with -compare: a scorecard.json to take the baselines and the oracle from where a card lacks them")
	table := flags.String("table", "summary", "what to print of the card, each figure the median over the seeds: summary (per scenario, where -policy stands against the best baseline), medians (per scenario, every policy, the best of each figure marked), runs (every scenario, seed and policy: what scorecard.json holds)")
	show := flags.String("show", "", "instead of running: print the card in DIR (or a scorecard.json) as -table says")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *table != "summary" && *table != "medians" && *table != "runs" {
		fmt.Fprintf(stderr, "fleetsim: -table: want summary, medians or runs, got %q\n", *table)
		return 2
	}
	if *show != "" {
		c, err := readCard(*show)
		if err != nil {
			fmt.Fprintf(stderr, "fleetsim: %v\n", err)
			return 1
		}
		printCard(stdout, c, *table, *policy)
		return 0
	}
	if *compare != "" {
		if err := compareCards(stdout, *compare, *base, *policy); err != nil {
			fmt.Fprintf(stderr, "fleetsim: %v\n", err)
			return 1
		}
		return 0
	}
	if *list {
		for _, sc := range fleetsim.Scenarios() {
			fmt.Fprintln(stdout, sc.Name)
		}
		return 0
	}
	if *diagnose {
		tuner, err := parseTune(*tune)
		if err != nil {
			fmt.Fprintf(stderr, "fleetsim: -options: %v\n", err)
			return 2
		}
		var re *regexp.Regexp
		if *scen != "" {
			re = regexp.MustCompile(*scen)
		}
		var trace *json.Encoder
		if *traceOut != "" {
			f, err := os.Create(*traceOut)
			if err != nil {
				fmt.Fprintf(stderr, "fleetsim: %v\n", err)
				return 1
			}
			defer f.Close()
			trace = json.NewEncoder(f)
		}
		for _, sc := range fleetsim.Scenarios() {
			if re != nil && !re.MatchString(sc.Name) {
				continue
			}
			if *requests > 0 {
				sc.Requests = min(sc.Requests, *requests)
			}
			if *slots > 0 {
				for i := range sc.Engines {
					sc.Engines[i].MaxNumSeqs = *slots
				}
			}
			for seed := 1; seed <= *seeds; seed++ {
				for _, rule := range []decide.Rule{decide.Thresholds, decide.Cost} {
					var records []*fleetsim.DecisionRecord
					d, f, err := fleetsim.DiagnoseKV(sc, uint64(seed), rule, tuner, &records)
					if err != nil {
						fmt.Fprintf(stderr, "fleetsim: %v\n", err)
						return 1
					}
					for _, rec := range records {
						if trace == nil {
							break
						}
						if err := trace.Encode(struct {
							Scenario string `json:"scenario"`
							Seed     int    `json:"seed"`
							Policy   string `json:"policy"`
							*fleetsim.DecisionRecord
						}{sc.Name, seed, "kv_" + fleetsim.RuleName(rule), rec}); err != nil {
							fmt.Fprintf(stderr, "fleetsim: -decisions: %v\n", err)
							return 1
						}
					}
					d.Write(stdout, fmt.Sprintf("%s seed %d kv_%s (hit %v, ttft p50 %v ms, p99 %v ms, goodput %v)", sc.Name, seed, fleetsim.RuleName(rule), f.HitRatio, f.TTFTP50, f.TTFTP99, f.Goodput))
				}
			}
		}
		return 0
	}
	if *out == "" {
		fmt.Fprintln(stderr, "fleetsim: -out DIR is required")
		flags.Usage()
		return 2
	}
	opts := fleetsim.Options{Seeds: *seeds, Parallel: *parallel, Default: *def, Log: stderr, MaxRequests: *requests}
	tuner, err := parseTune(*tune)
	if err != nil {
		fmt.Fprintf(stderr, "fleetsim: -options: %v\n", err)
		return 2
	}
	var tunes []func(*fleetsim.KVSettings)
	if tuner != nil {
		tunes = append(tunes, tuner)
	}
	if *only == "" && tuner != nil {
		*only = "."
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			fmt.Fprintf(stderr, "fleetsim: -policies: %v\n", err)
			return 2
		}
		rule, ok := fleetsim.ParseRule(*def)
		if !ok {
			fmt.Fprintf(stderr, "fleetsim: -default: want thresholds or cost, got %q\n", *def)
			return 2
		}
		for _, p := range append(append(fleetsim.KVPolicies(rule, tunes...), fleetsim.FlowPolicy(rule, tunes...)), fleetsim.Baselines...) {
			if re.MatchString(p.Name) {
				opts.Policies = append(opts.Policies, p)
			}
		}
		if len(opts.Policies) == 0 {
			fmt.Fprintln(stderr, "fleetsim: -policies matches no policy")
			return 2
		}
	}
	if *scen != "" {
		re, err := regexp.Compile(*scen)
		if err != nil {
			fmt.Fprintf(stderr, "fleetsim: -scenarios: %v\n", err)
			return 2
		}
		opts.Scenarios = re
	}
	start := time.Now()
	// DIR first: a card that runs for minutes must have somewhere to go. Each run that
	// finishes is kept in scorecard.partial.json at once, so that a run failing later (or an
	// interrupt) loses none; the whole card replaces it at the end.
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintf(stderr, "fleetsim: %v\n", err)
		return 1
	}
	path, partial := filepath.Join(*out, "scorecard.json"), filepath.Join(*out, "scorecard.partial.json")
	var partialErr error
	opts.OnRun = func(c *fleetsim.Card, _ int) {
		if partialErr == nil {
			if partialErr = writeCard(partial, c); partialErr != nil {
				fmt.Fprintf(stderr, "fleetsim: keeping the finished runs: %v\n", partialErr)
			}
		}
	}
	card, err := fleetsim.RunCard(opts)
	if err != nil {
		fmt.Fprintf(stderr, "fleetsim: %v\n", err)
		if card != nil && len(card.Scenarios) > 0 && partialErr == nil {
			fmt.Fprintf(stderr, "fleetsim: the %d runs that finished are in %s (-compare reads it)\n", len(card.Scenarios), partial)
		}
		return 1
	}
	if err := writeCard(path, card); err != nil {
		fmt.Fprintf(stderr, "fleetsim: %v\n", err)
		return 1
	}
	if err := os.Remove(partial); err != nil && !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(stderr, "fleetsim: %v\n", err)
	}
	printCard(stdout, card, *table, *policy)
	fmt.Fprintf(stderr, "wrote %s in %.1fs (every run; fleetsim -show %s -table medians|runs prints more)\n", path, time.Since(start).Seconds(), *out)
	return 0
}

// printCard prints the card as table says (summary, medians or runs), then its flow targets.
func printCard(w io.Writer, c *fleetsim.Card, table, policy string) {
	fleetsim.Legend(w)
	fmt.Fprintln(w)
	switch table {
	case "runs":
		c.Table(w)
	case "medians":
		c.Medians(w)
		fmt.Fprintln(w)
		c.Standing(w, policy)
	default:
		c.Standing(w, policy)
	}
	fmt.Fprintln(w)
	c.WriteFlowTargets(w, flowJudged)
}

// readCard reads DIR/scorecard.json, or the file named.
func readCard(p string) (*fleetsim.Card, error) {
	if st, err := os.Stat(p); err == nil && st.IsDir() {
		p = filepath.Join(p, "scorecard.json")
	}
	return fleetsim.ReadCard(p)
}

// flowJudged are the policies whose flow targets (issue 35) a card with the flow scenarios
// prints.
var flowJudged = []string{"kv_cache_aware", "kv_flow", "sglang", "least_conn"}

// writeCard writes c's JSON to path, whole or not at all (a temporary file renamed).
func writeCard(path string, c *fleetsim.Card) error {
	js, err := c.JSON()
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, js, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// parseTune reads -options into a change of the decision's options.
func parseTune(spec string) (func(*fleetsim.KVSettings), error) {
	if spec == "" {
		return nil, nil
	}
	var sets []func(*fleetsim.KVSettings)
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return nil, fmt.Errorf("%q: want key=value", kv)
		}
		num, numErr := strconv.ParseFloat(v, 64)
		switch {
		case k == "cache_threshold" && numErr == nil:
			sets = append(sets, func(o *fleetsim.KVSettings) { o.Options.CacheThreshold = num })
		case k == "balance_abs" && numErr == nil:
			sets = append(sets, func(o *fleetsim.KVSettings) { o.Options.BalanceAbs = int64(num) })
		case k == "balance_rel" && numErr == nil:
			sets = append(sets, func(o *fleetsim.KVSettings) { o.Options.BalanceRel = num })
		case k == "slot_rank" && numErr == nil:
			sets = append(sets, func(o *fleetsim.KVSettings) { o.Options.SlotRank = num != 0 })
		case k == "queue_timeout" && numErr == nil:
			sets = append(sets, func(o *fleetsim.KVSettings) { o.QueueTimeout = time.Duration(num * float64(time.Second)) })
		case k == "hold_margin" && numErr == nil:
			sets = append(sets, func(o *fleetsim.KVSettings) { o.HoldMargin = int64(num) })
		case k == "flow_spread" && numErr == nil:
			sets = append(sets, func(o *fleetsim.KVSettings) { o.FlowSpread = int64(num) })
		case k == "speed_rank" && numErr == nil:
			sets = append(sets, func(o *fleetsim.KVSettings) { o.Options.SpeedRank = num != 0 })
		case k == "full_stay" && numErr == nil:
			sets = append(sets, func(o *fleetsim.KVSettings) { o.Options.FullStay = num != 0 })
		case k == "slot_move" && numErr == nil:
			sets = append(sets, func(o *fleetsim.KVSettings) { o.Options.SlotMove = num != 0 })
		case k == "on_imbalance" && (v == "least_busy" || v == "prefix_in_band"):
			sets = append(sets, func(o *fleetsim.KVSettings) { o.Options.LeastBusyOnImbalance = v == "least_busy" })
		case k == "fallback":
			st, err := energy.ParseStrategy(v)
			if err != nil {
				return nil, err
			}
			sets = append(sets, func(o *fleetsim.KVSettings) { o.Options.Placer = energy.NewPlacer(st) })
		default:
			return nil, fmt.Errorf("%q: unknown option or bad value", kv)
		}
	}
	return func(o *fleetsim.KVSettings) {
		for _, set := range sets {
			set(o)
		}
	}, nil
}

// compareCards judges one or two scorecards (comma-separated paths: directories hold a
// scorecard.json) against issue 34's targets.
func compareCards(w io.Writer, list, base, policy string) error {
	read := readCard
	var b *fleetsim.Card
	if base != "" {
		var err error
		if b, err = read(base); err != nil {
			return err
		}
	}
	var as []*fleetsim.Assessment
	for _, p := range strings.Split(list, ",") {
		c, err := read(p)
		if err != nil {
			return err
		}
		a, err := fleetsim.Assess(c, b, policy)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		fmt.Fprintf(w, "== %s (default %s)\n", p, c.Default)
		a.Write(w)
		c.WriteFlowTargets(w, flowJudged)
		fmt.Fprintln(w)
		as = append(as, a)
	}
	if len(as) == 2 {
		fmt.Fprintln(w, "== change")
		fleetsim.WriteDiff(w, as[0], as[1])
	}
	return nil
}
