package fleetsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Num is a figure: NaN (undefined: no request to measure) is written as JSON null, and figures
// are rounded to 4 decimals so that the JSON reads well and repeats byte for byte.
type Num float64

// MarshalJSON writes null for NaN and infinities.
func (n Num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, math.Round(f*1e4)/1e4, 'f', -1, 64), nil
}

// UnmarshalJSON reads null as NaN.
func (n *Num) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*n = Num(math.NaN())
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*n = Num(f)
	return nil
}

func (n Num) String() string {
	if math.IsNaN(float64(n)) {
		return "-"
	}
	return strconv.FormatFloat(float64(n), 'f', 3, 64)
}

// Figures are one policy's results on one scenario and seed (docs/simulator.md says how each
// is measured).
type Figures struct {
	HitRatio     Num `json:"hit_ratio"`
	TTFTP50      Num `json:"ttft_p50_ms"`
	TTFTP99      Num `json:"ttft_p99_ms"`
	E2EP99       Num `json:"e2e_p99_ms"`
	Throughput   Num `json:"throughput_rps"`
	Goodput      Num `json:"goodput_rps"`
	Imbalance    Num `json:"imbalance"`
	QueueWaitP99 Num `json:"queue_wait_p99_ms"`
	Shed         Num `json:"shed_rps"`
	// Classes are the same figures for each class of requests (Request.Class), in the
	// scenarios whose requests have classes (imbalance, a property of the fleet, is null).
	Classes map[string]*Figures `json:"classes,omitempty"`
	// Unserved are the requests sent that had no answer when the run ended (closed loop: the
	// fleet never caught up; open loop: still queued at the horizon).
	Unserved int `json:"unserved"`
	sent     int
}

// ScenarioResult is one scenario and seed: every policy's figures.
type ScenarioResult struct {
	Name     string              `json:"name"`
	Seed     int                 `json:"seed"`
	SLO      Num                 `json:"slo_ms"`
	Policies map[string]*Figures `json:"policies"`
}

// Card is the scorecard.
type Card struct {
	// Default is the decision kvroute's kv_cache_aware runs by default ("thresholds", "cost").
	Default   string            `json:"default"`
	Scenarios []*ScenarioResult `json:"scenarios"`

	order []string // policy names, in the order run
}

// Measure computes a run's figures against slo, and each class's where requests have classes.
func Measure(res *Result, slo time.Duration) *Figures {
	f := measure(res, slo, "", false)
	for _, r := range res.Requests {
		if r.Class == "" {
			continue
		}
		if f.Classes == nil {
			f.Classes = map[string]*Figures{}
		}
		if f.Classes[r.Class] == nil {
			f.Classes[r.Class] = measure(res, slo, r.Class, true)
		}
	}
	return f
}

// measure computes the figures of a run's requests, or of class's only.
func measure(res *Result, slo time.Duration, class string, only bool) *Figures {
	var ttft, e2e, wait []float64
	var cached, prompt float64
	f := &Figures{}
	finished, good, shed := 0, 0, 0
	for _, r := range res.Requests {
		if only && r.Class != class {
			continue
		}
		if r.Shed {
			shed++
			continue
		}
		f.sent++
		if r.Engine >= 0 {
			wait = append(wait, ms(r.Routed-r.Arrival))
		}
		if r.Done == 0 || r.Aborted {
			f.Unserved++
			continue
		}
		finished++
		t := r.FirstToken - r.Arrival
		ttft = append(ttft, ms(t))
		e2e = append(e2e, ms(r.Done-r.Arrival))
		if t <= slo {
			good++
		}
		cached += float64(r.Cached)
		prompt += float64(r.Tokens)
	}
	f.HitRatio = Num(cached / prompt)
	f.TTFTP50 = pct(ttft, 0.5)
	f.TTFTP99 = pct(ttft, 0.99)
	f.E2EP99 = pct(e2e, 0.99)
	f.QueueWaitP99 = pct(wait, 0.99)
	secs := (res.End - res.Start).Seconds()
	if secs > 0 {
		f.Throughput = Num(float64(finished) / secs)
		f.Goodput = Num(float64(good) / secs)
		f.Shed = Num(float64(shed) / secs)
	} else {
		f.Throughput, f.Goodput, f.Shed = Num(math.NaN()), Num(math.NaN()), Num(math.NaN())
	}
	if only {
		f.Imbalance = Num(math.NaN())
		return f
	}
	mean, top := 0.0, 0.0
	for _, l := range res.EngineLoad {
		mean += l
		top = max(top, l)
	}
	mean /= float64(len(res.EngineLoad))
	f.Imbalance = Num(top / mean)
	return f
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// pct is the nearest-rank p-quantile of v, NaN when v is empty.
func pct(v []float64, p float64) Num {
	if len(v) == 0 {
		return Num(math.NaN())
	}
	slices.Sort(v)
	i := int(math.Ceil(p*float64(len(v)))) - 1
	return Num(v[min(max(i, 0), len(v)-1)])
}

// Options select what a scorecard runs.
type Options struct {
	Scenarios *regexp.Regexp // nil: all
	// List is the scenarios to choose from (nil: Scenarios()); an experiment's own.
	List     []*Scenario
	Seeds    int      // seeds 1..Seeds; 0: 3
	Policies []Policy // nil: PoliciesWith(Default)
	// Default is the decision kv_cache_aware runs, "thresholds" or "cost" ("": kvroute's
	// default, decide.DefaultRule).
	Default string
	// Parallel runs this many scenario-seeds at once; 0: GOMAXPROCS.
	Parallel int
	// Log, when set, gets a line per scenario and seed as it completes.
	Log io.Writer
	// MaxRequests, when > 0, caps every scenario's requests (a short card for tests).
	MaxRequests int
	// OnRun, when set, is called each time a scenario-seed finishes, one call at a time, with a
	// card of the runs finished so far (in the card's order) and how many the card has in all:
	// a caller that writes it out loses no finished run when a later one fails.
	OnRun func(finished *Card, total int)
}

// family is what the scenarios of one family share.
type family struct {
	once     sync.Once
	capacity float64 // requests per second
	slo      time.Duration
	err      error
}

// Calibrate measures a family's capacity and SLO with its first scenario and seed 1:
// capacity is the rate round_robin sustains with prefix caching off (closed loop with twice as
// many clients as the fleet has batch slots, requests answered per second until the first
// client runs out of work); the SLO is 3 × the greedy oracle's TTFT p50 in open loop at 50%
// of that capacity, rounded up to a whole millisecond.
func Calibrate(sc *Scenario) (capacity float64, slo time.Duration, err error) {
	b, err := Build(sc, 1)
	if err != nil {
		return 0, 0, err
	}
	cold := *sc
	cold.Engines = slices.Clone(sc.Engines)
	slots := 0
	for i := range cold.Engines {
		cold.Engines[i].NoPrefixCache = true
		slots += max(cold.Engines[i].MaxNumSeqs, 1)
	}
	cold.Clients = 2 * slots
	cold.Restart, cold.Side, cold.Grow = nil, nil, nil
	res := Run(&cold, b, 1, 0, (&roundRobin{}))
	capacity = steadyRate(res, cold.Clients)
	if !(capacity > 0) {
		return 0, 0, fmt.Errorf("%s: no capacity measured", sc.Name)
	}
	half := *sc
	half.Clients, half.Restart, half.Side, half.Grow = 0, nil, nil, nil
	res = Run(&half, b, 1, capacity/2, &oracle{})
	p50 := Measure(res, 0).TTFTP50
	if math.IsNaN(float64(p50)) {
		return 0, 0, fmt.Errorf("%s: the oracle answered nothing at 50%% load", sc.Name)
	}
	slo = time.Duration(math.Ceil(3*float64(p50))) * time.Millisecond
	return capacity, slo, nil
}

// steadyRate is the requests answered per second up to the last session's start in a
// closed-loop run: after it, clients run out of work and the fleet empties.
func steadyRate(res *Result, clients int) float64 {
	var lastStart time.Duration
	for _, r := range res.Requests {
		lastStart = max(lastStart, r.Arrival)
	}
	n := 0
	for _, r := range res.Requests {
		if r.Done > 0 && !r.Aborted && r.Done <= lastStart {
			n++
		}
	}
	if lastStart <= 0 {
		return 0
	}
	return float64(n) / lastStart.Seconds()
}

// RunCard runs the scorecard. Every chosen scenario's input (the Mooncake trace) is read
// before the first run: a missing one stops the card at once. When a run fails, the others
// still run, and the card of those that finished comes back with the error.
func RunCard(opts Options) (*Card, error) {
	if opts.Seeds <= 0 {
		opts.Seeds = 3
	}
	rule, ok := ParseRule(opts.Default)
	if !ok {
		return nil, fmt.Errorf("default: want thresholds or cost, got %q", opts.Default)
	}
	opts.Default = RuleName(rule)
	if opts.Policies == nil {
		opts.Policies = PoliciesWith(rule)
	}
	if opts.Parallel <= 0 {
		opts.Parallel = runtime.GOMAXPROCS(0)
	}
	all := Scenarios()
	if opts.List != nil {
		all = make([]*Scenario, len(opts.List))
		for i, sc := range opts.List {
			c := *sc
			all[i] = &c
		}
	}
	if opts.MaxRequests > 0 {
		for _, sc := range all {
			sc.Requests = min(sc.Requests, opts.MaxRequests)
		}
	}
	families := map[string]*family{}
	first := map[string]*Scenario{}
	for _, sc := range all {
		if first[sc.Family] == nil {
			first[sc.Family] = sc
			families[sc.Family] = &family{}
		}
	}
	var chosen []*Scenario
	// kv_flow runs on the flow-control scenarios only: the one given (an experiment's), else
	// kvroute's.
	flowPolicy := FlowPolicy(rule)
	var others []Policy
	for _, p := range opts.Policies {
		if p.Name == flowPolicy.Name {
			flowPolicy = p
		} else {
			others = append(others, p)
		}
	}
	withFlow := false
	for _, sc := range all {
		if opts.Scenarios == nil || opts.Scenarios.MatchString(sc.Name) {
			chosen = append(chosen, sc)
			withFlow = withFlow || sc.FlowControl
		}
	}
	for _, sc := range chosen {
		if _, err := sc.Workload(1, 1); err != nil {
			return nil, fmt.Errorf("%s: %w", sc.Name, err)
		}
	}
	card := &Card{Default: opts.Default}
	for _, p := range others {
		card.order = append(card.order, p.Name)
		if p.Name == "kv_cache_aware" && withFlow {
			card.order = append(card.order, flowPolicy.Name)
		}
	}
	if withFlow && !slices.Contains(card.order, flowPolicy.Name) {
		card.order = append(card.order, flowPolicy.Name)
	}
	type job struct {
		sc   *Scenario
		seed int
		out  *ScenarioResult
		err  error
	}
	var jobs []*job
	for _, sc := range chosen {
		for seed := 1; seed <= opts.Seeds; seed++ {
			jobs = append(jobs, &job{sc: sc, seed: seed})
		}
	}
	// finished is the card of the runs done so far, in job order (under logMu).
	finished := func() *Card {
		c := &Card{Default: card.Default, order: card.order}
		for _, j := range jobs {
			if j.out != nil {
				c.Scenarios = append(c.Scenarios, j.out)
			}
		}
		return c
	}
	var logMu sync.Mutex
	done := 0
	work := make(chan *job)
	var wg sync.WaitGroup
	for range opts.Parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				fam := families[j.sc.Family]
				fam.once.Do(func() { fam.capacity, fam.slo, fam.err = Calibrate(first[j.sc.Family]) })
				if fam.err != nil {
					j.err = fam.err
					continue
				}
				policies := others
				if j.sc.FlowControl {
					policies = append(slices.Clip(policies), flowPolicy)
				}
				out, err := runScenario(j.sc, uint64(j.seed), fam, policies)
				logMu.Lock()
				j.out, j.err = out, err
				if err == nil {
					done++
					if opts.Log != nil {
						fmt.Fprintf(opts.Log, "%s seed %d done (%d of %d)\n", j.sc.Name, j.seed, done, len(jobs))
					}
					if opts.OnRun != nil {
						opts.OnRun(finished(), len(jobs))
					}
				}
				logMu.Unlock()
			}
		}()
	}
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()
	var errs []error
	for _, j := range jobs {
		if j.err != nil {
			errs = append(errs, fmt.Errorf("%s seed %d: %w", j.sc.Name, j.seed, j.err))
			continue
		}
		card.Scenarios = append(card.Scenarios, j.out)
	}
	return card, errors.Join(errs...)
}

func runScenario(sc *Scenario, seed uint64, fam *family, policies []Policy) (*ScenarioResult, error) {
	b, err := Build(sc, seed)
	if err != nil {
		return nil, err
	}
	out := &ScenarioResult{Name: sc.Name, Seed: int(seed), SLO: Num(ms(fam.slo)), Policies: map[string]*Figures{}}
	for _, p := range policies {
		res := Run(sc, b, seed, sc.Load*fam.capacity, p.New(seed))
		out.Policies[p.Name] = Measure(res, fam.slo)
	}
	return out, nil
}

// JSON returns the card as indented JSON.
func (c *Card) JSON() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(c); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Table writes the card as one table: a row per scenario, seed and policy.
func (c *Card) Table(w io.Writer) {
	fmt.Fprintf(w, "%-20s %4s %7s %-13s %6s %9s %9s %9s %8s %8s %6s %9s %6s %8s\n",
		"scenario", "seed", "slo_ms", "policy", "hit", "ttft_p50", "ttft_p99", "e2e_p99", "rps", "goodput", "imbal", "qwait_p99", "shed", "unserved")
	for _, s := range c.Scenarios {
		for _, name := range c.order {
			f := s.Policies[name]
			if f == nil {
				continue
			}
			row(w, s, name, f)
			// Each class on a line of its own under the policy's, its name indented.
			classes := make([]string, 0, len(f.Classes))
			for c := range f.Classes {
				classes = append(classes, c)
			}
			slices.Sort(classes)
			for _, c := range classes {
				row(w, s, "  "+c, f.Classes[c])
			}
		}
	}
}

func row(w io.Writer, s *ScenarioResult, name string, f *Figures) {
	fmt.Fprintf(w, "%-20s %4d %7.0f %-13s %6s %9s %9s %9s %8s %8s %6s %9s %6s %8d\n",
		s.Name, s.Seed, float64(s.SLO), name, f.HitRatio, f.TTFTP50, f.TTFTP99, f.E2EP99,
		f.Throughput, f.Goodput, f.Imbalance, f.QueueWaitP99, f.Shed, f.Unserved)
}
