package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/replay"
)

// Scenarios of issue 21: a heterogeneous fleet (-slow), an engine restarted mid-run with an
// empty cache (-restart-at), and kv_cache_aware with telemetry on against telemetry off in the
// same invocation (-compare-telemetry).

// slowWorkers says which workers -slow makes slower: the last N, so that w0 (the one -side-load
// and -restart-at act on) keeps the fleet's speed.
func slowWorkers(workers, slow int) []bool {
	out := make([]bool, workers)
	for i := max(0, workers-slow); i < workers; i++ {
		out[i] = true
	}
	return out
}

// slowNames names the slow workers, "w2, w3" ("" when none).
func slowNames(workers, slow int) string {
	var names []string
	for i, s := range slowWorkers(workers, slow) {
		if s {
			names = append(names, fmt.Sprintf("w%d", i))
		}
	}
	return strings.Join(names, ", ")
}

// slowdown is worker i's time factor: -slow-factor for the slow workers, else 1.
func (c *config) slowdown(i int) float64 {
	if slowWorkers(c.workers, c.slow)[i] {
		return c.slowFactor
	}
	return 1
}

// telemetryOn reports whether kv_cache_aware runs p with telemetry (its default).
func telemetryOn(p policy) bool {
	return p.Module == "kv_cache_aware" && !slices.Contains(p.Block, "telemetry off")
}

// withTelemetryOff adds, after each kv_cache_aware policy with telemetry, the same policy with
// `telemetry off` (-compare-telemetry).
func withTelemetryOff(policies []policy) []policy {
	var out []policy
	for _, p := range policies {
		out = append(out, p)
		if telemetryOn(p) && p.Replicas == 0 {
			off := p
			off.Block = append(slices.Clone(p.Block), "telemetry off")
			off.Suffix += " (telemetry off)"
			out = append(out, off)
		}
	}
	return out
}

// kvStatus is the part of kv_cache_aware's GET /kvroute/ the scenarios read.
type kvStatus struct {
	CharsPerToken map[string]float64 `json:"chars_per_token"`
	Upstreams     map[string]struct {
		TreeChars      int64 `json:"tree_chars"`
		TreeBoundChars int64 `json:"tree_bound_chars"`
		Telemetry      *struct {
			External int64 `json:"external_load"`
		} `json:"telemetry"`
		Feedback *feedbackStatus `json:"feedback"`
		Learned  struct {
			Prefill  float64 `json:"prefill_tokens_per_second"`
			Learned  bool    `json:"prefill_learned"`
			Restarts uint64  `json:"restarts"`
		} `json:"learned"`
	} `json:"upstreams"`
}

// readStatus reads GET /kvroute/ from Caddy's admin endpoint.
func readStatus(ctx context.Context, admin int) (*kvStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://localhost:%d/kvroute/", admin), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET /kvroute/: %s: %s", resp.Status, b)
	}
	var st kvStatus
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&st); err != nil {
		return nil, fmt.Errorf("GET /kvroute/: %w", err)
	}
	return &st, nil
}

// share is addr's share of the trees' chars (every upstream's tree_chars added up).
func (st *kvStatus) share(addr string) float64 {
	total := int64(0)
	for _, u := range st.Upstreams {
		total += u.TreeChars
	}
	if total == 0 {
		return 0
	}
	return float64(st.Upstreams[addr].TreeChars) / float64(total)
}

// restarts are the engine restarts kv_cache_aware counted over every upstream.
func (st *kvStatus) restarts() uint64 {
	n := uint64(0)
	for _, u := range st.Upstreams {
		n += u.Learned.Restarts
	}
	return n
}

// prefillRatios are each worker's learned prefill speed over its configured one, in fleet order
// (NaN while the prior stands).
func (st *kvStatus) prefillRatios(addrs []string, configured []float64) []float64 {
	out := make([]float64, len(addrs))
	for i, a := range addrs {
		u, ok := st.Upstreams[a]
		if !ok || !u.Learned.Learned || i >= len(configured) || configured[i] <= 0 {
			out[i] = math.NaN()
			continue
		}
		out[i] = u.Learned.Prefill / configured[i]
	}
	return out
}

// prefillLine describes the learned prefill speeds against the configured ones, one worker
// after the other: "w0 20100/20000 (1.01), w3 5010/5000 (1.00) slow, w1 prior".
func (st *kvStatus) prefillLine(addrs []string, configured []float64, slow []bool) string {
	ratios := st.prefillRatios(addrs, configured)
	parts := make([]string, len(addrs))
	for i, a := range addrs {
		u := st.Upstreams[a]
		tag := ""
		if i < len(slow) && slow[i] {
			tag = " slow"
		}
		if math.IsNaN(ratios[i]) {
			parts[i] = fmt.Sprintf("w%d not learned (prior %.0f)%s", i, u.Learned.Prefill, tag)
			continue
		}
		parts[i] = fmt.Sprintf("w%d %.0f/%.0f (%.2f)%s", i, u.Learned.Prefill, configured[i], ratios[i], tag)
	}
	return "prefill tokens/s kv_cache_aware learned / the engine's own speed (1 / its prefill time per token: the sim's " +
		"-prefill-per-token over -speed, llm-d's --prefill-time-per-token; kvroute's prior until learned: prefill_tokens_per_second, 5000): " +
		strings.Join(parts, ", ")
}

// restartResult is what -restart-at saw: when the worker restarted (from the replay's start),
// what kv_cache_aware counted and its share of the trees before and once counted.
type restartResult struct {
	at            time.Duration
	counted       uint64
	countedIn     time.Duration // from the restart to kvroute's count (0: not counted)
	before, after float64       // the worker's share of the trees
	hasStatus     bool
	err           error
}

// restartCountWait is how long after a restart the scenario waits for kv_cache_aware to count
// it: a few telemetry intervals (1 s by default).
const restartCountWait = 5 * time.Second

// restartDuring restarts worker 0 at `at` after start, reading kv_cache_aware's status around it
// (admin 0: no kv_cache_aware to read). The result comes once the restart is counted or
// restartCountWait passed; ended closing first (the replay is over) reports that.
func (b *bench) restartDuring(ctx context.Context, ended <-chan struct{}, admin int, start time.Time, at time.Duration) <-chan restartResult {
	ch := make(chan restartResult, 1)
	go func() {
		r := restartResult{at: at}
		defer func() { ch <- r }()
		select {
		case <-ended:
			r.err = fmt.Errorf("the replay ended before the restart at %v", at)
			return
		case <-ctx.Done():
			r.err = ctx.Err()
			return
		case <-time.After(time.Until(start.Add(at))):
		}
		var st *kvStatus
		if admin > 0 {
			if st, r.err = readStatus(ctx, admin); r.err != nil {
				return
			}
			r.before, r.hasStatus = st.share(b.fleet.Addrs()[0]), true
		}
		if r.err = b.fleet.Restart(ctx, 0); r.err != nil {
			return
		}
		restarted := time.Now()
		r.at = restarted.Sub(start)
		if admin == 0 {
			return
		}
		for {
			st, err := readStatus(ctx, admin)
			if err != nil {
				if ctx.Err() == nil {
					r.err = err
				}
				return
			}
			r.counted, r.after = st.restarts(), st.share(b.fleet.Addrs()[0])
			if r.counted > 0 {
				r.countedIn = time.Since(restarted)
				return
			}
			if time.Since(restarted) > restartCountWait {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return ch
}

// windowFigures are the hit ratio and the p99 TTFT of the calls that started in [from, to) of
// the replay, over those answered without error, and how many there were.
func windowFigures(recs []replay.Record, from, to time.Duration) (hit, p99 float64, n int) {
	var cached, prompt float64
	var ttfts []float64
	a, b := float64(from.Milliseconds()), float64(to.Milliseconds())
	for _, r := range recs {
		if r.StartMs < a || r.StartMs >= b || r.Error != "" {
			continue
		}
		cached += float64(r.CachedTokens)
		prompt += float64(r.PromptTokens)
		ttfts = append(ttfts, r.TTFTMs)
	}
	if prompt > 0 {
		hit = cached / prompt
	}
	if len(ttfts) > 0 {
		slices.Sort(ttfts)
		p99 = ttfts[min(len(ttfts)-1, int(math.Ceil(0.99*float64(len(ttfts))))-1)]
	}
	return hit, p99, len(ttfts)
}

// restartWindow is the period after a restart the scenario reports on.
const restartWindow = time.Minute

// runExtras are a run's scenario figures, for the same-run ratios after the table.
type runExtras struct {
	restart             *restartResult
	hitBefore, hitAfter float64 // the hit ratio before the restart and in the minute after
	p99Before, p99After float64 // ms
	charsPerToken       float64 // learned, 0: none
	prefillRatios       []float64
	feedback            *feedbackStatus // llm_feedback's figures summed over the upstreams (nil: none)
	predictedHit        float64         // -compare-feedback: the trees' predicted hit ratio (0: not read)
}

// report describes the restart on the run's lines.
func (r *restartResult) report(e *runExtras, recs []replay.Record) string {
	if r.err != nil {
		return "restart of w0: " + r.err.Error()
	}
	e.hitBefore, e.p99Before, _ = windowFigures(recs, 0, r.at)
	var n int
	e.hitAfter, e.p99After, n = windowFigures(recs, r.at, r.at+restartWindow)
	s := fmt.Sprintf("w0 restarted empty at %v:", r.at.Round(100*time.Millisecond))
	if r.hasStatus {
		counted := "not counted"
		if r.countedIn > 0 {
			counted = fmt.Sprintf("counted in %v", r.countedIn.Round(100*time.Millisecond))
		}
		s += fmt.Sprintf(" kv_cache_aware's restarts %d (%s); w0's share of the trees %.1f%% before, %.1f%% after;",
			r.counted, counted, 100*r.before, 100*r.after)
	}
	return s + fmt.Sprintf(" hit ratio %.3f before, %.3f in the next %v (%d calls); p99 TTFT %s before, %s after",
		e.hitBefore, e.hitAfter, restartWindow, n, fmtMs(e.p99Before), fmtMs(e.p99After))
}

// pairedRatios prints, for each kv_cache_aware policy run with telemetry and its telemetry-off
// twin (-compare-telemetry), the per-repeat ratios on/off: their median and min-max.
func pairedRatios(w io.Writer, results []*policyResult, extras map[*replay.Result]*runExtras) {
	for i := 0; i+1 < len(results); i++ {
		on, off := results[i], results[i+1]
		if !strings.HasSuffix(off.Label, " (telemetry off)") || strings.HasSuffix(on.Label, " (telemetry off)") {
			continue
		}
		n := min(len(on.Runs), len(off.Runs))
		fmt.Fprintf(w, "\ntelemetry on / off, same-run ratios over %d repeats (median, min-max):\n", n)
		printPairRatios(w, on.Runs[:n], off.Runs[:n], pairFigures(on, extras), extras, false)
	}
}

// pairFigure is one figure of a run, compared between the two sides of a same-run pair.
type pairFigure struct {
	name string
	get  func(*replay.Result) float64
}

// pairFigures are the figures every same-run comparison prints, with the restart's when the
// runs had one (-restart-at).
func pairFigures(on *policyResult, extras map[*replay.Result]*runExtras) []pairFigure {
	figs := []pairFigure{
		{"hit ratio", func(r *replay.Result) float64 { return r.HitRatio }},
		{"requests/s", func(r *replay.Result) float64 { return r.RequestsPerSecond }},
		{"TTFT p50", func(r *replay.Result) float64 { return r.TTFTP50Ms }},
		{"TTFT p99", func(r *replay.Result) float64 { return r.TTFTP99Ms }},
	}
	if e := extras[on.Runs[0]]; e != nil && e.restart != nil {
		figs = append(figs,
			pairFigure{"hit ratio after the restart", func(r *replay.Result) float64 { return extras[r].hitAfter }},
			pairFigure{"TTFT p99 after the restart", func(r *replay.Result) float64 { return extras[r].p99After }})
	}
	return figs
}

// printPairRatios prints each figure's same-run ratios on[k]/off[k] as their median (min-max),
// leaving out a repeat whose figure is not a number or whose off side is not positive, and,
// with needExtras, one where either run has no extras.
func printPairRatios(w io.Writer, on, off []*replay.Result, figs []pairFigure, extras map[*replay.Result]*runExtras, needExtras bool) {
	for _, f := range figs {
		var ratios []float64
		for k := range on {
			if needExtras && (extras[on[k]] == nil || extras[off[k]] == nil) {
				continue
			}
			a, b := f.get(on[k]), f.get(off[k])
			if b > 0 && !math.IsNaN(a) {
				ratios = append(ratios, a/b)
			}
		}
		if len(ratios) == 0 {
			continue
		}
		m, lo, hi := medianSpan(ratios)
		fmt.Fprintf(w, "  %-28s %.3f (%.3f-%.3f)\n", f.name, m, lo, hi)
	}
}

// medianSpan is the median of xs with their min and max.
func medianSpan(xs []float64) (med, lo, hi float64) {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	med = s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return med, s[0], s[len(s)-1]
}

// printLearned prints, over the runs of kv_cache_aware with telemetry, the medians (min-max) of
// what it learned: chars per token and each worker's prefill speed over its configured one.
func printLearned(w io.Writer, results []*policyResult, extras map[*replay.Result]*runExtras, cfg *config, own float64) {
	for _, pr := range results {
		var chars []float64
		var ratios [][]float64
		for _, r := range pr.Runs {
			e := extras[r]
			if e == nil || e.prefillRatios == nil {
				continue
			}
			if e.charsPerToken > 0 {
				chars = append(chars, e.charsPerToken)
			}
			for i, v := range e.prefillRatios {
				for len(ratios) <= i {
					ratios = append(ratios, nil)
				}
				if !math.IsNaN(v) {
					ratios[i] = append(ratios[i], v)
				}
			}
		}
		if ratios == nil {
			continue
		}
		fmt.Fprintf(w, "\n%s learned, over %d runs (median, min-max):\n", pr.Label, len(pr.Runs))
		if len(chars) > 0 {
			m, lo, hi := medianSpan(chars)
			fmt.Fprintf(w, "  chars per token %.3f (%.3f-%.3f); the engines' own %.3f: %+.1f%% (%+.1f%% to %+.1f%%)\n",
				m, lo, hi, own, 100*(m/own-1), 100*(lo/own-1), 100*(hi/own-1))
		} else {
			fmt.Fprintln(w, "  chars per token: not learned (4 used)")
		}
		slow := slowWorkers(cfg.workers, cfg.slow)
		for i, rs := range ratios {
			tag := ""
			if i < len(slow) && slow[i] {
				tag = fmt.Sprintf(" (slow, %g×)", cfg.slowFactor)
			}
			if len(rs) == 0 {
				fmt.Fprintf(w, "  w%d prefill speed: not learned%s\n", i, tag)
				continue
			}
			m, lo, hi := medianSpan(rs)
			fmt.Fprintf(w, "  w%d prefill speed learned / the engine's own %.2f (%.2f-%.2f)%s\n", i, m, lo, hi, tag)
		}
	}
}

// externalSampler samples, while a run lasts, the external load kv_cache_aware counts for each
// upstream (the engine's running and waiting requests beyond its own, GET /kvroute/): on a fleet
// only the router sends to, any is a misreading that pushes requests off their cached worker.
type externalSampler struct {
	samples, nonZero int
	sum, peak        int64
	done             chan struct{}
}

func sampleExternal(ctx context.Context, admin int, every time.Duration) (stop func() *externalSampler) {
	e := &externalSampler{done: make(chan struct{})}
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		defer close(e.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			st, err := readStatus(ctx, admin)
			if err != nil {
				continue
			}
			for _, u := range st.Upstreams {
				if u.Telemetry == nil {
					continue
				}
				e.samples++
				e.sum += u.Telemetry.External
				e.peak = max(e.peak, u.Telemetry.External)
				if u.Telemetry.External > 0 {
					e.nonZero++
				}
			}
		}
	}()
	return func() *externalSampler {
		cancel()
		<-e.done
		return e
	}
}

// String describes the samples: "external load: 3% of upstream samples non-zero, mean 0.04, max 2".
func (e *externalSampler) String() string {
	if e.samples == 0 {
		return "external load: no samples"
	}
	return fmt.Sprintf("external load counted: %.1f%% of %d upstream samples non-zero, mean %.3f, max %d",
		100*float64(e.nonZero)/float64(e.samples), e.samples, float64(e.sum)/float64(e.samples), e.peak)
}
