package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/fleetsim"
	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/replay"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// Issue 35's flow-control scenarios in real time, through Caddy, as the fleet simulator runs
// them in virtual time (examples/fleetsim, Scenarios: tenants_alone, tenants_flood,
// priority_alone, priority_flood). Two classes of chat clients (workload.TwoClass) send open
// loop at rates that are fractions of the fleet's capacity: a light tenant at 15% with a heavy
// one at 10 times its requests and tokens (150%), an interactive band at 50% with a batch band
// at twice that (100%); the alone scenarios send the first class only, call for call and time
// for time as in the flood. Each request names its class in X-Tenant or X-Priority, which
// kv_flow's flow_control reads. The figures are split by class; a 429 (a request flow control
// shed) counts as shed, out of the TTFT, and against goodput.

// flowScenario is one of the four scenarios.
type flowScenario struct {
	Name   string // tenants_alone, tenants_flood, priority_alone, priority_flood
	Family string // tenants | priority
	Alone  bool
}

// flowFamily is what the two scenarios of a family share: the classes, how many times the first
// class's requests the second sends, the first class's rate as a fraction of the fleet's
// capacity, and the first class's requests by default.
type flowFamily struct {
	first, second workload.Class
	k             int
	load          float64
	requests      int
}

// The simulator's classes and rates (examples/fleetsim/scenario.go: lightLoad, heavyTimes,
// interactiveLoad, batchTimes), with fewer requests: 96 light requests (12 conversations) and
// 960 heavy ones, 160 interactive and 320 batch, a minute or so per run.
var flowFamilies = map[string]flowFamily{
	"tenants": {
		first:  workload.Class{Name: "light", Headers: map[string]string{"X-Tenant": "light"}},
		second: workload.Class{Name: "heavy", Headers: map[string]string{"X-Tenant": "heavy"}},
		k:      10, load: 0.15, requests: 96,
	},
	"priority": {
		first:  workload.Class{Name: "interactive", Headers: map[string]string{"X-Priority": "interactive"}},
		second: workload.Class{Name: "batch", Headers: map[string]string{"X-Priority": "batch"}},
		k:      2, load: 0.5, requests: 160,
	},
}

var allFlowScenarios = []flowScenario{
	{"tenants_alone", "tenants", true}, {"tenants_flood", "tenants", false},
	{"priority_alone", "priority", true}, {"priority_flood", "priority", false},
}

// flowWorkloads returns the scenarios -workload names: one by its name, a family's two by the
// family's name, all four by "flow".
func flowWorkloads(kind string) ([]flowScenario, bool) {
	var out []flowScenario
	for _, sc := range allFlowScenarios {
		if kind == "flow" || kind == sc.Family || kind == sc.Name {
			out = append(out, sc)
		}
	}
	return out, len(out) > 0
}

const (
	// flowBlocksPerWorker is the simulator's chat engine's prefix cache (engine.Config
	// CapacityBlocks 2048 in fleetsim's chatEngine): the flow scenarios' fleet.
	flowBlocksPerWorker = 2048
	// flowMaxInFlight lets every open conversation have its call in flight: a flood opens
	// hundreds at once.
	flowMaxInFlight = 4096
)

// flowWorkload returns scenario sc's workload and the time scale that sends its first class
// at the family's fraction of capacity (requests per second): the same scale for the alone and
// the flood scenario of a family, so that the first class is sent alike in both.
func (c *config) flowWorkload(sc flowScenario, capacity float64) (workload.Workload, float64) {
	fam := flowFamilies[sc.Family]
	n := c.flowRequests
	if n == 0 {
		n = fam.requests
	}
	alone := workload.TwoClass(c.chat, n, fam.k, true, fam.first, fam.second)
	w := alone
	if !sc.Alone {
		w = workload.TwoClass(c.chat, n*(1+fam.k), fam.k, false, fam.first, fam.second)
	}
	w.Name = sc.Name
	return w, flowTimeScale(alone, fam.load*capacity)
}

// flowTimeScale is the factor on the calls' times that sends w at rate requests per second,
// its calls over its span, as the simulator scales a scenario's nominal times (sim.go, Run).
func flowTimeScale(w workload.Workload, rate float64) float64 {
	span := w.Span().Seconds()
	if span <= 0 || rate <= 0 {
		return 1
	}
	return float64(w.Calls()) / span / rate
}

// simChat is the fleet simulator's calibration of its chat fleet (fleetsim.Calibrate on the
// chat family's first scenario: 4 engines of 8 slots, cold, every slot busy, in virtual time),
// the fleet its flow scenarios run on: its capacity in requests per second and its SLO.
var simChat = sync.OnceValues(func() (chatCalibration, error) {
	for _, sc := range fleetsim.Scenarios() {
		if sc.Family == "chat" {
			capacity, slo, err := fleetsim.Calibrate(sc)
			return chatCalibration{capacity: capacity, slo: slo, engines: len(sc.Engines)}, err
		}
	}
	return chatCalibration{}, errors.New("the fleet simulator has no chat scenario")
})

type chatCalibration struct {
	capacity float64
	slo      time.Duration
	engines  int
}

// defaultEngine reports whether the sim fleet runs llmsim's default engine (the fleet
// simulator's chat engine, blocks aside) on workers of one speed: the simulator's calibration
// then holds for it, scaled by -speed and -workers.
func (c *config) defaultEngine() bool {
	return c.fleet == "sim" && c.slow == 0 && (c.engine == engineFlags{} || c.engine == defaultEngineFlags())
}

// defaultEngineFlags are llmsim's engine defaults, as the sim fleet's flags default to them.
func defaultEngineFlags() engineFlags {
	return engineFlags{llmsim.DefaultSlots, llmsim.DefaultMaxBatchTokens, llmsim.DefaultBlockTokens,
		llmsim.DefaultStepFixed, llmsim.DefaultPrefillPerToken, llmsim.DefaultPerSeq}
}

// flowCapacity is -capacity, or the simulator's calibrated capacity of its chat fleet (llmsim
// runs the simulator's engine model: the same engines on the wall clock) scaled by -speed and
// by -workers over its 4 engines.
func (c *config) flowCapacity() (float64, error) {
	if c.capacity > 0 {
		return c.capacity, nil
	}
	cal, err := simChat()
	if err != nil {
		return 0, err
	}
	return cal.capacity * c.speed * float64(c.workers) / float64(cal.engines), nil
}

// flowSLO is -slo, or the simulator's SLO for its chat fleet (3 × the TTFT p50 of an oracle at
// half its capacity) at -speed.
func (c *config) flowSLO() (time.Duration, error) {
	if c.slo > 0 {
		return c.slo, nil
	}
	cal, err := simChat()
	if err != nil {
		return 0, err
	}
	return time.Duration(float64(cal.slo) / c.speed), nil
}

// classFigures are one run's figures for a class of requests (or all of them).
type classFigures struct {
	Requests   int     `json:"requests"`
	Answered   int     `json:"answered"`
	Shed       int     `json:"shed"`   // answered 429 by flow control
	Errors     int     `json:"errors"` // any other failure
	HitRatio   float64 `json:"hit_ratio"`
	TTFTP50Ms  float64 `json:"ttft_p50_ms"` // over the answered requests
	TTFTP99Ms  float64 `json:"ttft_p99_ms"`
	Throughput float64 `json:"throughput_rps"` // answered over the run's wall time
	Goodput    float64 `json:"goodput_rps"`    // answered within the SLO over the wall time
}

// MarshalJSON writes a TTFT of no answered request (NaN, which encoding/json refuses) as null.
func (f classFigures) MarshalJSON() ([]byte, error) {
	type plain classFigures
	num := func(x float64) *float64 {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil
		}
		return &x
	}
	return json.Marshal(struct {
		plain
		HitRatio   *float64 `json:"hit_ratio"`
		TTFTP50Ms  *float64 `json:"ttft_p50_ms"`
		TTFTP99Ms  *float64 `json:"ttft_p99_ms"`
		Throughput *float64 `json:"throughput_rps"`
		Goodput    *float64 `json:"goodput_rps"`
	}{plain(f), num(f.HitRatio), num(f.TTFTP50Ms), num(f.TTFTP99Ms), num(f.Throughput), num(f.Goodput)})
}

// classSplit computes a run's figures for all its requests and for each class, the class of a
// record being its session's (classOf). A 429 is shed: out of the TTFT, and not answered.
// The run's wall time (from the first send to the last answer) divides every class's counts.
func classSplit(res *replay.Result, classOf map[string]string, slo time.Duration) (all classFigures, by map[string]classFigures) {
	type acc struct {
		f              classFigures
		ttft           []float64
		cached, prompt int64
		good           int
	}
	accs := map[string]*acc{}
	total := &acc{}
	for _, r := range res.Records {
		class := classOf[r.Session]
		a := accs[class]
		if a == nil {
			a = &acc{}
			accs[class] = a
		}
		for _, a := range []*acc{a, total} {
			a.f.Requests++
			switch {
			case r.Status == 429:
				a.f.Shed++
			case r.Error != "":
				a.f.Errors++
			default:
				a.f.Answered++
				a.ttft = append(a.ttft, r.TTFTMs)
				a.cached += int64(r.CachedTokens)
				a.prompt += int64(r.PromptTokens)
				if r.TTFTMs <= float64(slo)/1e6 {
					a.good++
				}
			}
		}
	}
	finish := func(a *acc) classFigures {
		f := a.f
		if a.prompt > 0 {
			f.HitRatio = float64(a.cached) / float64(a.prompt)
		}
		f.TTFTP50Ms, f.TTFTP99Ms = nearestRank(a.ttft, 0.5), nearestRank(a.ttft, 0.99)
		if res.WallSeconds > 0 {
			f.Throughput = float64(f.Answered) / res.WallSeconds
			f.Goodput = float64(a.good) / res.WallSeconds
		}
		return f
	}
	by = map[string]classFigures{}
	for class, a := range accs {
		by[class] = finish(a)
	}
	return finish(total), by
}

// nearestRank is the nearest-rank p-quantile of xs (sorted in place), NaN for none.
func nearestRank(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	return xs[min(len(xs)-1, max(0, int(math.Ceil(p*float64(len(xs))))-1))]
}

// flowRun is one run's figures: all requests' and each class's.
type flowRun struct {
	All     classFigures            `json:"all"`
	Classes map[string]classFigures `json:"classes"`
	// Records are the run's requests, in the -json file (with its class a record's session's
	// prefix: light-conv-...).
	Records []replay.Record `json:"records,omitempty"`
}

// flowPolicy is one policy's runs on one scenario and their medians.
type flowPolicy struct {
	Policy  string                  `json:"policy"`
	Label   string                  `json:"lb_policy"`
	Runs    []flowRun               `json:"runs"`
	Median  classFigures            `json:"median"`
	Classes map[string]classFigures `json:"median_classes"`
}

// flowResult is one scenario: its settings and each policy's figures.
type flowResult struct {
	Scenario      string        `json:"scenario"`
	Classes       []string      `json:"classes"` // the first class, then the second (flood)
	Requests      int           `json:"requests"`
	CapacityRPS   float64       `json:"capacity_rps"`
	FirstClassRPS float64       `json:"first_class_rps"`
	TimeScale     float64       `json:"time_scale"`
	SLOMs         float64       `json:"slo_ms"`
	Policies      []*flowPolicy `json:"policies"`
	policyResults []*policyResult
}

// flowRow is a line of a scenario's table: a policy's figures, or a class's under it.
type flowRow struct {
	Name string
	F    classFigures
}

// Rows are the scenario's table lines: each policy's medians, then (with two classes) each
// class's, in the scenario's class order.
func (r *flowResult) Rows() []flowRow {
	var out []flowRow
	for _, p := range r.Policies {
		out = append(out, flowRow{p.Policy, p.Median})
		if len(r.Classes) < 2 {
			continue
		}
		for _, c := range r.Classes {
			if f, ok := p.Classes[c]; ok {
				out = append(out, flowRow{"  — " + c, f})
			}
		}
	}
	return out
}

// medianFigures is the median of each figure over runs (NaNs left out; NaN when none).
func medianFigures(runs []classFigures) classFigures {
	med := func(get func(classFigures) float64) float64 {
		var v []float64
		for _, r := range runs {
			if x := get(r); !math.IsNaN(x) {
				v = append(v, x)
			}
		}
		m, _, _ := medianSpan(v)
		return m
	}
	count := func(get func(classFigures) int) int {
		return int(math.Round(med(func(f classFigures) float64 { return float64(get(f)) })))
	}
	return classFigures{
		Requests:   count(func(f classFigures) int { return f.Requests }),
		Answered:   count(func(f classFigures) int { return f.Answered }),
		Shed:       count(func(f classFigures) int { return f.Shed }),
		Errors:     count(func(f classFigures) int { return f.Errors }),
		HitRatio:   med(func(f classFigures) float64 { return f.HitRatio }),
		TTFTP50Ms:  med(func(f classFigures) float64 { return f.TTFTP50Ms }),
		TTFTP99Ms:  med(func(f classFigures) float64 { return f.TTFTP99Ms }),
		Throughput: med(func(f classFigures) float64 { return f.Throughput }),
		Goodput:    med(func(f classFigures) float64 { return f.Goodput }),
	}
}

// flowPolicies splits each policy's runs by class and takes the medians.
func flowPolicies(results []*policyResult, classOf map[string]string, classes []string, slo time.Duration, records bool) []*flowPolicy {
	var out []*flowPolicy
	for _, pr := range results {
		fp := &flowPolicy{Policy: pr.Policy, Label: pr.Label, Classes: map[string]classFigures{}}
		var alls []classFigures
		per := map[string][]classFigures{}
		for _, r := range pr.Runs {
			all, by := classSplit(r, classOf, slo)
			run := flowRun{All: all, Classes: by}
			if records {
				run.Records = r.Records
			}
			fp.Runs = append(fp.Runs, run)
			alls = append(alls, all)
			for _, c := range classes {
				if f, ok := by[c]; ok {
					per[c] = append(per[c], f)
				}
			}
		}
		fp.Median = medianFigures(alls)
		for c, fs := range per {
			fp.Classes[c] = medianFigures(fs)
		}
		out = append(out, fp)
	}
	return out
}

// printFlow prints a scenario's table: each policy's medians, then each class's.
func printFlow(w io.Writer, r *flowResult, repeats int) {
	fmt.Fprintf(w, "\n%s: %d requests (%s), capacity %.1f requests/s, %s at %.2f requests/s; medians of %d runs; goodput: TTFT ≤ %s\n",
		r.Scenario, r.Requests, strings.Join(r.Classes, " + "), r.CapacityRPS, r.Classes[0], r.FirstClassRPS, repeats, fmtMs(r.SLOMs))
	t := &table{header: []string{"policy, class", "hit", "TTFT p50", "TTFT p99", "requests/s", "goodput/s", "answered", "shed", "errors"}}
	row := func(name string, f classFigures) {
		t.add(name, fmt.Sprintf("%.3f", f.HitRatio), fmtMsNaN(f.TTFTP50Ms), fmtMsNaN(f.TTFTP99Ms),
			fmt.Sprintf("%.2f", f.Throughput), fmt.Sprintf("%.2f", f.Goodput),
			fmt.Sprintf("%d/%d", f.Answered, f.Requests), fmt.Sprint(f.Shed), fmt.Sprint(f.Errors))
	}
	for _, fr := range r.Rows() {
		row(fr.Name, fr.F)
	}
	t.write(w)
}

func fmtMsNaN(ms float64) string {
	if math.IsNaN(ms) {
		return "-"
	}
	return fmtMs(ms)
}

// flowCard puts the runs in the fleet simulator's scorecard shape, each repeat as a seed, so
// that the simulator's judge of issue 35's targets (fleetsim.Card.FlowTargets) judges them
// as it judges the simulator's.
func flowCard(results []*flowResult) *fleetsim.Card {
	card := &fleetsim.Card{}
	for _, r := range results {
		for k := 0; ; k++ {
			sr := &fleetsim.ScenarioResult{Name: r.Scenario, Seed: k + 1, SLO: fleetsim.Num(r.SLOMs), Policies: map[string]*fleetsim.Figures{}}
			for _, p := range r.Policies {
				if k >= len(p.Runs) {
					continue
				}
				run := p.Runs[k]
				f := simFigures(run.All)
				f.Classes = map[string]*fleetsim.Figures{}
				for c, cf := range run.Classes {
					f.Classes[c] = simFigures(cf)
				}
				sr.Policies[p.Policy] = f
			}
			if len(sr.Policies) == 0 {
				break
			}
			card.Scenarios = append(card.Scenarios, sr)
		}
	}
	return card
}

// simFigures are a run's figures as the simulator's; the router's queue wait is not measured
// here (NaN: its target is left out).
func simFigures(f classFigures) *fleetsim.Figures {
	return &fleetsim.Figures{
		HitRatio: fleetsim.Num(f.HitRatio), TTFTP50: fleetsim.Num(f.TTFTP50Ms), TTFTP99: fleetsim.Num(f.TTFTP99Ms),
		E2EP99: fleetsim.Num(math.NaN()), Throughput: fleetsim.Num(f.Throughput), Goodput: fleetsim.Num(f.Goodput),
		Imbalance: fleetsim.Num(math.NaN()), QueueWaitP99: fleetsim.Num(math.NaN()), Shed: fleetsim.Num(math.NaN()),
	}
}

// runFlow runs every policy on each scenario of -workload, prints each scenario's table by
// class, then issue 35's targets for the policies that ran on the scenarios they need.
func runFlow(ctx context.Context, cfg *config, bin *caddyBinary, policies []policy, out *output) error {
	fl, err := startFleet(ctx, cfg)
	if err != nil {
		return err
	}
	defer fl.Close()
	fmt.Printf("fleet: %d %s workers at %v, %d KV blocks of %d tokens each (fleet %d)\n",
		len(fl.Addrs()), fl.Kind(), fl.Addrs(), fl.CapacityBlocks()/len(fl.Addrs()), fl.BlockTokens(), fl.CapacityBlocks())
	capacity, err := cfg.flowCapacity()
	if err != nil {
		return err
	}
	slo, err := cfg.flowSLO()
	if err != nil {
		return err
	}
	for _, sc := range cfg.flow {
		w, scale := cfg.flowWorkload(sc, capacity)
		c := *cfg
		c.timeScale = scale
		fam := flowFamilies[sc.Family]
		classes := []string{fam.first.Name}
		if !sc.Alone {
			classes = append(classes, fam.second.Name)
		}
		classOf := map[string]string{}
		for _, s := range w.Sessions {
			classOf[s.ID] = s.Class
		}
		r := &flowResult{Scenario: sc.Name, Classes: classes, Requests: w.Calls(), CapacityRPS: capacity,
			FirstClassRPS: fam.load * capacity, TimeScale: scale, SLOMs: float64(slo) / 1e6}
		fmt.Printf("\n%s: %d sessions, %d calls (%s), open loop at time scale %.3f: %s at %.0f%% of the fleet's %.1f requests/s\n",
			sc.Name, len(w.Sessions), w.Calls(), strings.Join(classes, " + "), scale, fam.first.Name, 100*fam.load, capacity)
		b := &bench{cfg: &c, bin: bin, fleet: fl, workload: w}
		results, err := b.compare(ctx, policies)
		r.policyResults = results
		r.Policies = flowPolicies(results, classOf, classes, slo, cfg.jsonPath != "")
		if len(r.Policies) > 0 {
			out.Flow = append(out.Flow, r)
			printFlow(os.Stdout, r, cfg.repeats)
		}
		if err != nil {
			return err
		}
	}
	names := make([]string, len(policies))
	for i, p := range policies {
		names[i] = p.Name
	}
	card := flowCard(out.Flow)
	out.FlowTargets = card.FlowTargets(names)
	if len(out.FlowTargets) > 0 {
		fmt.Println()
		card.WriteFlowTargets(os.Stdout, names)
	}
	return nil
}
