package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/replay"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// bench runs policies through Caddy on one fleet.
type bench struct {
	cfg      *config
	bin      *caddyBinary
	fleet    fleet
	workload workload.Workload
	// extras are the runs' scenario figures (-restart-at, what kv_cache_aware learned), for
	// the same-run ratios after the table.
	extras map[*replay.Result]*runExtras
	// ownChars is the fleet's own chars per token on the workload (fleetCharsPerToken).
	ownChars float64
	// onDone, when set, hears each call of a run end (compare's progress).
	onDone func(done, total int)
	// arr sees the requests arrive at the workers (-diagnose; nil: off), and trace gets its
	// records (-decisions; nil: none).
	arr   *arrivals
	trace *json.Encoder
}

// progressEvery is how often a run that lasts prints how far it got: the Ollama fleet's runs
// take tens of seconds each, a loaded machine's minutes.
const progressEvery = 10 * time.Second

// runOnce replays the workload once through a fresh Caddy with policy p on a fleet with empty
// caches.
func (b *bench) runOnce(ctx context.Context, p policy) (*replay.Result, error) {
	if err := b.fleet.Fresh(ctx); err != nil {
		return nil, err
	}
	var (
		url       string
		stop      func() error
		g         *group
		admin     int    // a single replica's admin port
		traceFile string // its decision trace (-diagnose)
	)
	if p.Replicas > 0 {
		var err error
		if g, err = b.startGroup(ctx, p); err != nil {
			return nil, err
		}
		url, stop = g.front.URL, g.Stop
	} else {
		caddy, port, err := b.startCaddyPorts(ctx, p, nil)
		if err != nil {
			return nil, err
		}
		url, stop = caddy.URL, caddy.Stop
		admin, traceFile = port, caddy.TraceFile
	}
	opts := b.cfg.replayOptions(url, b.fleet.CapacityBlocks(), b.fleet.BlockTokens())
	opts.Prompt = b.fleet.Prompt()
	opts.Client = b.fleet.Client(max(opts.Concurrency, opts.MaxInFlight, 256))
	opts.OnDone = b.onDone
	var outage <-chan error
	if p.Outage {
		opts.KeepRecords = true // for the hit ratio before, during and after
		octx, cancel := context.WithCancel(ctx)
		defer cancel()
		outage = g.outage(octx, b.cfg.outageAt, b.cfg.outage)
	}
	var late <-chan lateResult
	if p.Late {
		opts.KeepRecords = true // for the late replica's hit ratio against the others'
		lctx, cancel := context.WithCancel(ctx)
		defer cancel()
		late = g.startLate(lctx, b, time.Now(), b.cfg.late)
	}
	var (
		restart     <-chan restartResult
		replayEnded = make(chan struct{})
	)
	if b.cfg.restartAt > 0 {
		opts.KeepRecords = true // for the figures before and after the restart
		kvAdmin := 0
		if p.Module == "kv_cache_aware" {
			kvAdmin = admin
		}
		restart = b.restartDuring(ctx, replayEnded, kvAdmin, time.Now(), b.cfg.restartAt)
	}
	var stopSampler func() *externalSampler
	if admin > 0 && p.Module == "kv_cache_aware" {
		// With telemetry off too, where it reads nothing but costs Caddy the same: the
		// same-run ratios compare like with like.
		stopSampler = sampleExternal(ctx, admin, 250*time.Millisecond)
	}
	side := startSideLoad(ctx, b.fleet.Addrs()[0], b.cfg.sideLoad)
	if b.arr != nil {
		b.arr.take() // what came before (the walkthrough, health checks) is not this run's
	}
	replayStart := time.Now()
	res, err := replay.Run(ctx, b.workload, opts)
	side.stop()
	var external *externalSampler
	if stopSampler != nil {
		external = stopSampler()
	}
	close(replayEnded)
	extra := &runExtras{}
	if restart != nil {
		rr := <-restart // within restartCountWait of the restart, or at once without one
		extra.restart = &rr
		if err == nil {
			fmt.Printf("\n  %s\n  ", rr.report(extra, res.Records))
		}
	}
	if late != nil {
		// The replay may end before the replica starts or catches up: it then reports so.
		lr := <-late
		if lr.err != nil && err == nil {
			err = lr.err
		}
		if err == nil {
			fmt.Printf("\n  %s\n  ", lr.join.report(res.Records))
		}
	}
	if b.cfg.sideLoad > 0 {
		fmt.Printf("(side load on %s: %d requests, %d failed) ", b.fleet.Addrs()[0], side.sent.Load(), side.failed.Load())
	}
	if outage != nil {
		// The outage ends within -nats-outage-at + -nats-outage, however short the replay.
		if oerr := <-outage; oerr != nil && err == nil {
			err = fmt.Errorf("restarting NATS: %w", oerr)
		}
		if err == nil {
			w := windowHits(res.Records, b.cfg.outageAt, b.cfg.outage)
			fmt.Printf("\n  NATS down from %v to %v: hit ratio %.3f before, %.3f while down, %.3f after\n  ",
				b.cfg.outageAt, b.cfg.outageAt+b.cfg.outage, w[0], w[1], w[2])
		}
	}
	if err == nil && p.Replicas > 0 && p.Module == "kv_cache_aware" {
		if f, ferr := g.clusterFigures(); ferr == nil {
			fmt.Printf("\n  %s\n  ", f)
		} else {
			fmt.Fprintln(os.Stderr, "warning: reading the cluster's counters:", ferr)
		}
	}
	if err == nil && admin > 0 && telemetryOn(p) {
		if l, lerr := learnedReport(admin, b.fleet.Addrs()); lerr == nil {
			l += "\n  " + b.ownCountLine(res)
			fmt.Printf("\n  %s\n  ", l)
		} else {
			fmt.Fprintln(os.Stderr, "warning: reading what kv_cache_aware learned:", lerr)
		}
		if external != nil {
			fmt.Printf("%s\n  ", external)
		}
		if st, serr := readStatus(ctx, admin); serr == nil {
			addrs := b.fleet.Addrs()
			fmt.Printf("%s\n  ", st.prefillLine(addrs, b.fleet.PrefillSpeeds(), slowWorkers(len(addrs), b.cfg.slow)))
			extra.prefillRatios = st.prefillRatios(addrs, b.fleet.PrefillSpeeds())
			for _, c := range st.CharsPerToken {
				extra.charsPerToken = c
			}
		}
	}
	if err == nil && admin > 0 && b.cfg.compareFeedback && p.Module == "kv_cache_aware" {
		if h, herr := predictedHit(ctx, admin); herr == nil {
			extra.predictedHit = h
			fmt.Printf("trees' predicted hit ratio %.3f, the answers' %.3f\n  ", h, res.HitRatio)
		} else {
			fmt.Fprintln(os.Stderr, "warning: reading the trees' predicted hit ratio:", herr)
		}
	}
	if err == nil && admin > 0 && p.Feedback {
		if st, serr := readStatus(ctx, admin); serr == nil {
			extra.feedback = st.feedbackTotals()
			fmt.Printf("%s\n  ", extra.feedback)
		} else {
			fmt.Fprintln(os.Stderr, "warning: reading llm_feedback's figures:", serr)
		}
	}
	if err == nil && b.arr != nil {
		arr := b.arr.take()
		var tr map[string]*traceLine
		if traceFile != "" {
			if tr, err = readTrace(traceFile); err != nil {
				err = fmt.Errorf("reading the decision trace: %w", err)
			}
		}
		if err == nil {
			fmt.Println()
			err = diagnoseRun(os.Stdout, p.Name+p.Suffix, decisionRecords(arr, res.Records, tr, replayStart, b.fleet.Addrs()), b.trace)
			fmt.Print("  ")
		}
	}
	if res != nil && b.extras != nil {
		b.extras[res] = extra
	}
	if stopErr := stop(); err == nil && stopErr != nil {
		fmt.Fprintln(os.Stderr, "warning:", stopErr)
	}
	if err != nil {
		return nil, err
	}
	if res.Interrupted {
		return res, ctx.Err()
	}
	return res, nil
}

// showProgress has the next run print, every progressEvery while it lasts, the calls it has
// answered ("24/48"), on the line of its result; it returns the function that stops it.
func (b *bench) showProgress() (stop func()) {
	var done, total atomic.Int64
	b.onDone = func(d, t int) {
		for {
			cur := done.Load()
			if int64(d) <= cur || done.CompareAndSwap(cur, int64(d)) {
				break
			}
		}
		total.Store(int64(t))
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				if n := total.Load(); n > 0 {
					fmt.Printf("%d/%d ", done.Load(), n)
				}
			case <-quit:
				return
			}
		}
	})
	return func() {
		close(quit)
		wg.Wait()
		b.onDone = nil
	}
}

// ownCountLine says how the fleet's engines count the workload's tokens, beside what
// kv_cache_aware learned: the sim's and llm-d's from their tokenizers (the demo models both),
// a real engine's from the prompt tokens its answers reported over this run.
func (b *bench) ownCountLine(res *replay.Result) string {
	if b.fleet.Prompt() == nil && b.cfg.fleet != "sim" {
		if res == nil || res.PromptTokens == 0 || res.Errors > 0 {
			return fmt.Sprintf("%s's own count: not known (its answers reported no prompt tokens over every call)", engineName(b.fleet))
		}
		return fmt.Sprintf("%s's own count over this run: %.3f chars per token (the routing text's chars over the prompt tokens its answers reported)",
			engineName(b.fleet), b.workloadChars()/float64(res.PromptTokens))
	}
	return fmt.Sprintf("%s's own count on this workload: %.3f chars per token", b.fleet.Kind(), b.fleetCharsPerToken())
}

// startCaddy starts Caddy in front of the fleet with policy p.
func (b *bench) startCaddy(ctx context.Context, p policy) (*caddyProcess, error) {
	c, _, err := b.startCaddyPorts(ctx, p, nil)
	return c, err
}

// startCaddyPorts is startCaddy on the given admin and listen ports (nil: free ones), also
// returning Caddy's admin port.
func (b *bench) startCaddyPorts(ctx context.Context, p policy, ports []int) (*caddyProcess, int, error) {
	if ports == nil {
		var err error
		if ports, err = freePorts(2); err != nil {
			return nil, 0, err
		}
	}
	if p.Module == "kv_cache_aware" && (b.cfg.kvCapacity || b.cfg.energy != nil) {
		f := b.fleet
		perWorker := 0
		if b.cfg.kvCapacity {
			perWorker = f.CapacityBlocks() * f.BlockTokens() / len(f.Addrs())
		}
		p.Block = append(slices.Clone(p.Block), upstreamLines(f.Addrs(), perWorker, b.cfg.energy)...)
	}
	s := site{AdminPort: ports[0], Port: ports[1], Upstreams: b.fleet.Addrs(), Policy: p,
		RequestID: b.cfg.diagnose, Trace: b.cfg.diagnose && p.Module == "kv_cache_aware"}
	c, err := startCaddy(ctx, b.bin, s, b.cfg.verbose)
	return c, ports[0], err
}

// compare runs every policy -repeats times and returns their results, in table order. With
// -compare-telemetry, -compare-feedback or -interleave the repeats alternate the policies (each repeat runs every
// policy once, in ABBA order), so that a drift in the machine's load falls on both sides of each
// same-run ratio.
func (b *bench) compare(ctx context.Context, policies []policy) ([]*policyResult, error) {
	if b.extras == nil {
		b.extras = map[*replay.Result]*runExtras{}
	}
	out := make([]*policyResult, len(policies))
	for i, p := range policies {
		out[i] = &policyResult{Policy: p.Name, Label: p.title(), Options: p.Block}
	}
	one := func(i, rep int) error {
		p := policies[i]
		start := time.Now()
		fmt.Printf("%-20s run %d/%d ... ", p.Name+p.Suffix, rep+1, b.cfg.repeats)
		stop := b.showProgress()
		res, err := b.runOnce(ctx, p)
		stop()
		if err != nil {
			fmt.Println()
			return fmt.Errorf("%s: %w", p.Name, err)
		}
		joules := ""
		if b.cfg.energy != nil {
			j, unattributed := joulesPerRequest(res.Records, b.fleet.Addrs(), b.cfg.energy)
			out[i].Joules = append(out[i].Joules, j)
			joules = fmt.Sprintf(", %.1f J/request", j)
			if unattributed > 0 {
				joules += fmt.Sprintf(" (%d requests of no known worker at the fleet's mean)", unattributed)
			}
		}
		fmt.Printf("hit %.3f (reference %.3f), imbalance %.2f, %.1f requests/s%s, %d errors, %s\n",
			res.HitRatio, res.ReferenceHitRatio, res.Imbalance, res.RequestsPerSecond, joules, res.Errors, time.Since(start).Round(100*time.Millisecond))
		out[i].Runs = append(out[i].Runs, res)
		return nil
	}
	var err error
	if b.cfg.compareTelemetry || b.cfg.compareFeedback || b.cfg.interleave {
		// Every other repeat runs the policies in reverse order (ABBA), so that whatever a
		// run leaves behind for the next (the previous Caddy's exit, a warmer machine) falls
		// on each side as often.
		for rep := 0; rep < b.cfg.repeats && err == nil; rep++ {
			for k := 0; k < len(policies) && err == nil; k++ {
				i := k
				if rep%2 == 1 {
					i = len(policies) - 1 - k
				}
				err = one(i, rep)
			}
		}
	} else {
		for i := 0; i < len(policies) && err == nil; i++ {
			for rep := 0; rep < b.cfg.repeats && err == nil; rep++ {
				err = one(i, rep)
			}
		}
	}
	var done []*policyResult
	for _, pr := range out {
		if len(pr.Runs) > 0 {
			pr.Summary = summarize(pr.Runs, b.fleet.Addrs())
			done = append(done, pr)
		}
	}
	return done, err
}

// policyResult is every run of one policy and their summary.
type policyResult struct {
	Policy  string           `json:"policy"`
	Label   string           `json:"lb_policy"`
	Options []string         `json:"options,omitempty"`
	Summary summary          `json:"summary"`
	Runs    []*replay.Result `json:"runs"`
	// Joules per request of each run, in the order of Runs (-energy; joulesPerRequest).
	Joules []float64 `json:"joules_per_request,omitempty"`
}

// summary is the mean over the runs of a policy, with the min and max of the figures that vary
// most between runs.
type summary struct {
	Runs              int       `json:"runs"`
	Requests          int       `json:"requests"`
	HitRatio          span      `json:"hit_ratio"`
	HitOverReference  float64   `json:"hit_over_reference"`
	ReferenceHitRatio float64   `json:"reference_hit_ratio"`
	InfiniteHitRatio  float64   `json:"infinite_hit_ratio"`
	TTFTP50Ms         float64   `json:"ttft_p50_ms"`
	TTFTP99Ms         float64   `json:"ttft_p99_ms"`
	LatencyP50Ms      float64   `json:"latency_p50_ms"`
	LatencyP99Ms      float64   `json:"latency_p99_ms"`
	PerWorker         []float64 `json:"per_worker"` // mean requests, in fleet order
	Unattributed      float64   `json:"unattributed,omitempty"`
	Imbalance         span      `json:"imbalance"`
	Errors            int       `json:"errors"`
	RequestsPerSecond float64   `json:"requests_per_second"`
	ErrorSamples      []string  `json:"error_samples,omitempty"`
	WallSecondsPerRun float64   `json:"wall_seconds_per_run"`
}

// span is a mean with the least and greatest value it was taken over.
type span struct {
	Mean float64 `json:"mean"`
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
}

func newSpan(xs []float64) span {
	s := span{Min: math.Inf(1), Max: math.Inf(-1)}
	for _, x := range xs {
		s.Mean += x
		s.Min, s.Max = min(s.Min, x), max(s.Max, x)
	}
	if len(xs) == 0 {
		return span{}
	}
	s.Mean /= float64(len(xs))
	return s
}

// summarize averages runs; requests per worker are put in the order of addrs (Caddy names
// the upstream it dialed in the worker header).
func summarize(runs []*replay.Result, addrs []string) summary {
	s := summary{Runs: len(runs), PerWorker: make([]float64, len(addrs))}
	if len(runs) == 0 {
		return s
	}
	index := map[string]int{}
	for i, a := range addrs {
		index[a] = i
	}
	var hits, imbs []float64
	n := float64(len(runs))
	for _, r := range runs {
		hits = append(hits, r.HitRatio)
		imbs = append(imbs, r.Imbalance)
		if r.ReferenceHitRatio > 0 {
			s.HitOverReference += r.HitRatio / r.ReferenceHitRatio / n
		}
		s.Requests += r.Requests
		s.ReferenceHitRatio += r.ReferenceHitRatio / n
		s.InfiniteHitRatio += r.InfiniteHitRatio / n
		s.TTFTP50Ms += r.TTFTP50Ms / n
		s.TTFTP99Ms += r.TTFTP99Ms / n
		s.LatencyP50Ms += r.LatencyP50Ms / n
		s.LatencyP99Ms += r.LatencyP99Ms / n
		s.RequestsPerSecond += r.RequestsPerSecond / n
		s.WallSecondsPerRun += r.WallSeconds / n
		s.Errors += r.Errors
		for w, c := range r.PerWorker {
			if i, ok := index[w]; ok {
				s.PerWorker[i] += float64(c) / n
			} else {
				s.Unattributed += float64(c) / n
			}
		}
		for _, e := range r.ErrorSamples {
			if len(s.ErrorSamples) < 3 {
				s.ErrorSamples = append(s.ErrorSamples, e)
			}
		}
	}
	s.Requests /= len(runs)
	s.HitRatio, s.Imbalance = newSpan(hits), newSpan(imbs)
	return s
}
