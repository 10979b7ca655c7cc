package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/fleetsim"
	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/replay"
)

// -diagnose: every decision of a run seen both ways, as the fleet simulator's -diagnose sees
// it. What was true comes from the sim fleet's workers (llmsim.Observer): as each request
// arrives at a worker, what every worker's engine holds (batch, queue, cached prefix) and the
// greedy oracle's TTFT of the request there. What kv_cache_aware believed comes from its
// decision trace (kvroute/trace.go: its debug "decision" lines, in a log file of the run's
// Caddy). Caddy's id of each request ({http.request.uuid}, sent to the worker and back to the
// client in X-Request-Id) joins the two and the client's record.

// arrivals records, for -diagnose, what the workers held as each request arrived.
type arrivals struct {
	workers []*llmsim.Worker // in fleet order
	mu      sync.Mutex
	byID    map[string]*arrival
}

// arrival is one request at the worker that took it.
type arrival struct {
	worker int
	at     time.Time
	views  []llmsim.View // every worker's engine as it arrived, in fleet order
	first  time.Time     // its first token (zero: none yet)
	done   time.Time     // its last token at the engine (zero: none yet)
	cached int
	tokens int // its prompt, as the engine counts it
}

func newArrivals(workers []*llmsim.Worker) *arrivals {
	a := &arrivals{workers: workers, byID: map[string]*arrival{}}
	for _, w := range workers {
		w.Observe(a)
	}
	return a
}

// Arrived looks at every worker as a request arrives at w (the others a moment after w, each
// under its own lock).
func (a *arrivals) Arrived(w *llmsim.Server, ar *llmsim.Arrival) {
	if ar.ID == "" {
		return
	}
	rec := &arrival{worker: -1, at: ar.At, views: make([]llmsim.View, len(a.workers)), tokens: ar.Prompt.Tokens}
	for i, wk := range a.workers {
		if wk.Server == w {
			rec.worker, rec.views[i] = i, ar.View
			continue
		}
		rec.views[i] = wk.View(ar.Prompt, ar.Output)
	}
	a.mu.Lock()
	a.byID[ar.ID] = rec
	a.mu.Unlock()
}

func (a *arrivals) FirstToken(id string, at time.Time, cached int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rec := a.byID[id]; rec != nil {
		rec.first, rec.cached = at, cached
	}
}

func (a *arrivals) Finished(id string, at, _ time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rec := a.byID[id]; rec != nil {
		rec.done = at
	}
}

// take returns the arrivals recorded since the last call and forgets them.
func (a *arrivals) take() map[string]*arrival {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.byID
	a.byID = map[string]*arrival{}
	return out
}

// traceLine is one decision of kv_cache_aware's trace (kvroute/trace.go).
type traceLine struct {
	Msg          string `json:"msg"`
	Path         string `json:"path"`
	Upstream     string `json:"upstream"`
	RequestID    string `json:"request_id"`
	PromptChars  int    `json:"prompt_chars"`
	PromptTokens int64  `json:"prompt_tokens"`
	AtNs         int64  `json:"at_ns"`
	Candidates   []struct {
		Upstream     string   `json:"upstream"`
		Load         int64    `json:"load"`
		Match        int      `json:"match_chars"`
		QueuedTokens int64    `json:"queued_tokens"`
		Prefill      int64    `json:"prefill_tokens"`
		Slots        int64    `json:"slots"`
		PrefillSpeed float64  `json:"prefill_tokens_per_second"`
		ReadingAgeMs *float64 `json:"reading_age_ms"`
		PredictedMs  float64  `json:"predicted_ttft_ms"`
	} `json:"candidates"`
}

// readTrace reads the decision lines of a trace file, by request id (a retried request's
// last decision).
func readTrace(path string) (map[string]*traceLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]*traceLine{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var l traceLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Msg != "decision" || l.RequestID == "" {
			continue
		}
		out[l.RequestID] = &l
	}
	return out, sc.Err()
}

// decisionRecords joins a run's arrivals, its client records and kv_cache_aware's trace
// (nil for another policy) into the fleet simulator's decision records, in arrival order.
// start is the replay's start; addrs the workers' addresses in fleet order.
func decisionRecords(arr map[string]*arrival, recs []replay.Record, trace map[string]*traceLine, start time.Time, addrs []string) []*fleetsim.DecisionRecord {
	client := map[string]*replay.Record{}
	for i := range recs {
		if id := recs[i].RequestID; id != "" {
			client[id] = &recs[i]
		}
	}
	var out []*fleetsim.DecisionRecord
	for id, a := range arr {
		if a.worker < 0 {
			continue
		}
		rec := &fleetsim.DecisionRecord{ID: id, At: a.at.Sub(start), Chosen: a.worker, Cached: a.cached, Tokens: a.tokens,
			Truth: make([]fleetsim.Truth, len(a.views))}
		for i, v := range a.views {
			rec.Truth[i] = fleetsim.Truth{Running: v.Running, Waiting: v.Waiting, Slots: v.Slots, Cached: v.Cached, TTFT: v.TTFT}
		}
		if !a.first.IsZero() {
			rec.EngineTTFT = a.first.Sub(a.at)
		}
		if !a.done.IsZero() {
			rec.EngineDone = a.done.Sub(start)
		}
		if c := client[id]; c != nil && c.Error == "" {
			rec.TTFT = time.Duration(c.TTFTMs * float64(time.Millisecond))
			rec.Sent = time.Duration(c.StartMs * float64(time.Millisecond))
			rec.Done = time.Duration((c.StartMs + c.LatencyMs) * float64(time.Millisecond))
		}
		if l := trace[id]; l != nil {
			rec.Path, rec.PromptChars, rec.PromptTokens = l.Path, l.PromptChars, l.PromptTokens
			rec.Decided = time.Unix(0, l.AtNs).Sub(start)
			rec.Believed = make([]fleetsim.Belief, len(addrs))
			for _, c := range l.Candidates {
				i := slices.Index(addrs, c.Upstream)
				if i < 0 {
					continue
				}
				b := fleetsim.Belief{Candidate: true, Load: c.Load, Slots: c.Slots, Match: c.Match, QueuedTokens: c.QueuedTokens,
					Prefill: c.Prefill, PrefillSpeed: c.PrefillSpeed, ReadingAge: -1, Predicted: time.Duration(c.PredictedMs * 1e6)}
				if c.ReadingAgeMs != nil {
					b.ReadingAge = time.Duration(*c.ReadingAgeMs * 1e6)
				}
				rec.Believed[i] = b
			}
		}
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b *fleetsim.DecisionRecord) int { return cmp.Compare(a.At, b.At) })
	return out
}

// diagnoseRun prints one run's diagnosis (fleetsim.KVDiagnosis, the simulator's -diagnose
// table) and what the request path outside the engine cost, and writes its records to trace
// (nil: none).
func diagnoseRun(w io.Writer, label string, recs []*fleetsim.DecisionRecord, trace *json.Encoder) error {
	d := &fleetsim.KVDiagnosis{}
	var before, after, engine, client []float64
	for _, r := range recs {
		d.Add(r)
		if r.TTFT > 0 && r.EngineTTFT > 0 {
			before = append(before, ms(r.At-r.Sent))
			after = append(after, ms(r.Sent+r.TTFT-r.At-r.EngineTTFT))
			engine = append(engine, ms(r.EngineTTFT))
			client = append(client, ms(r.TTFT))
		}
	}
	d.Write(w, label)
	if len(client) > 0 {
		fmt.Fprintf(w, "  TTFT p50 %.1f ms at the client, %.1f at the engine (arrival to first token); outside the engine, from the send to the arrival p50 %.1f, p90 %.1f, p99 %.1f ms, from the first token to the client p50 %.1f, p90 %.1f, p99 %.1f ms\n",
			quantile(client, 0.5), quantile(engine, 0.5), quantile(before, 0.5), quantile(before, 0.9), quantile(before, 0.99),
			quantile(after, 0.5), quantile(after, 0.9), quantile(after, 0.99))
	}
	if trace == nil {
		return nil
	}
	for _, r := range recs {
		if err := trace.Encode(struct {
			Policy string `json:"policy"`
			*fleetsim.DecisionRecord
		}{label, r}); err != nil {
			return err
		}
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// quantile is the nearest-rank q-quantile of xs (NaN when empty).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, max(0, int(math.Ceil(q*float64(len(s))))-1))]
}

// twinRatios prints, for kv_cache_aware against each other policy run as often, the medians of
// the same-run ratios of TTFT p50, TTFT p99 and requests/s and whether the other's medians
// dominate (fleetsim.CompareRounds: the rule demosim judges the simulator's runs by).
func twinRatios(w io.Writer, results []*policyResult) {
	var kv *policyResult
	for _, r := range results {
		if r.Policy == "kv_cache_aware" && r.Label == "kv_cache_aware" && kv == nil {
			kv = r
		}
	}
	if kv == nil || len(kv.Runs) == 0 {
		return
	}
	printed := false
	for _, r := range results {
		if r == kv || len(r.Runs) != len(kv.Runs) {
			continue
		}
		if !printed {
			fmt.Fprintf(w, "\nkv_cache_aware against each policy, same-run ratios (median, min-max) and the verdict on the medians (dominated: at least as good on all three, better by more than %.0f%% on one):\n", 100*fleetsim.DominanceMargin)
			printed = true
		}
		fleetsim.WriteRatios(w, kv.Label, r.Label, fleetsim.CompareRounds(rounds(kv.Runs), rounds(r.Runs)))
	}
}

// rounds are runs' figures for fleetsim.CompareRounds.
func rounds(runs []*replay.Result) []fleetsim.Round {
	out := make([]fleetsim.Round, len(runs))
	for i, r := range runs {
		out[i] = fleetsim.Round{P50: r.TTFTP50Ms, P99: r.TTFTP99Ms, RPS: r.RequestsPerSecond}
	}
	return out
}
