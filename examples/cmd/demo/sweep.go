package main

import (
	"context"
	"fmt"
	"io"
	"strings"
)

// The sweep's grid: kv_cache_aware's defaults are 0.3, 64 and least_busy.
var (
	sweepCacheThresholds = []string{"0.1", "0.3", "0.5", "0.7"}
	sweepBalanceAbs      = []string{"2", "8", "32", "64"}
	sweepOnImbalance     = []string{"least_busy", "prefix_in_band"}
)

// sweepPoint is one setting of the grid and its results.
type sweepPoint struct {
	CacheThreshold      string        `json:"cache_threshold"`
	BalanceAbsThreshold string        `json:"balance_abs_threshold"`
	OnImbalance         string        `json:"on_imbalance"`
	Result              *policyResult `json:"result"`
}

// sweep runs kv_cache_aware over the grid (the -kv-options lines that set none of the three
// swept options are kept).
func (b *bench) sweep(ctx context.Context) ([]*sweepPoint, error) {
	var extra []string
	for _, line := range b.cfg.kvOptions {
		name, _, _ := strings.Cut(line, " ")
		if name != "cache_threshold" && name != "balance_abs_threshold" && name != "on_imbalance" {
			extra = append(extra, line)
		}
	}
	n := len(sweepCacheThresholds) * len(sweepBalanceAbs) * len(sweepOnImbalance)
	fmt.Printf("Sweep: %d settings of kv_cache_aware × %d run(s)\n", n, b.cfg.repeats)
	var out []*sweepPoint
	for _, ct := range sweepCacheThresholds {
		for _, ba := range sweepBalanceAbs {
			for _, oi := range sweepOnImbalance {
				block := append([]string{"cache_threshold " + ct, "balance_abs_threshold " + ba, "on_imbalance " + oi}, extra...)
				p := policy{Name: fmt.Sprintf("ct=%s abs=%s %s", ct, ba, oi), Module: "kv_cache_aware", Block: block}
				res, err := b.compare(ctx, []policy{p})
				if err != nil {
					return out, err
				}
				out = append(out, &sweepPoint{CacheThreshold: ct, BalanceAbsThreshold: ba, OnImbalance: oi, Result: res[0]})
			}
		}
	}
	return out, nil
}

// printSweep prints the sweep's table in grid order, marking the best hit ratio and the best
// p99 TTFT.
func printSweep(w io.Writer, points []*sweepPoint) {
	if len(points) == 0 {
		return
	}
	bestHit, bestTTFT := 0, 0
	for i, p := range points {
		if p.Result.Summary.HitRatio.Mean > points[bestHit].Result.Summary.HitRatio.Mean {
			bestHit = i
		}
		if p.Result.Summary.TTFTP99Ms < points[bestTTFT].Result.Summary.TTFTP99Ms {
			bestTTFT = i
		}
	}
	t := &table{header: []string{"cache_threshold", "balance_abs", "on_imbalance", "hit ratio", "hit/ref",
		"TTFT p50", "TTFT p99", "latency p99", "imbalance", "errors", ""}}
	for i, p := range points {
		s := p.Result.Summary
		var mark []string
		if i == bestHit {
			mark = append(mark, "best hit")
		}
		if i == bestTTFT {
			mark = append(mark, "best p99 TTFT")
		}
		t.add(p.CacheThreshold, p.BalanceAbsThreshold, p.OnImbalance, fmtSpan(s.HitRatio, 3),
			fmt.Sprintf("%.2f", s.HitOverReference), fmtMs(s.TTFTP50Ms), fmtMs(s.TTFTP99Ms),
			fmtMs(s.LatencyP99Ms), fmtSpan(s.Imbalance, 2), fmt.Sprint(s.Errors), strings.Join(mark, ", "))
	}
	fmt.Fprintln(w, "Sweep of kv_cache_aware (balance_rel_threshold and the rest at their defaults or -kv-options)")
	t.write(w)
	var refs, infs []float64
	for _, p := range points {
		for _, r := range p.Result.Runs {
			refs, infs = append(refs, r.ReferenceHitRatio), append(infs, r.InfiniteHitRatio)
		}
	}
	fmt.Fprintf(w, "reference (one LRU with the fleet's capacity) hit ratio %s over the runs; infinite cache %s\n",
		fmtSpan(newSpan(refs), 3), fmtSpan(newSpan(infs), 3))
	fmt.Fprintln(w, "balance_abs_threshold only acts when the in-flight requests of two workers differ by more than it:")
	fmt.Fprintln(w, "with N closed-loop clients, values >= N never do, and rows that differ only there show the run-to-run noise.")
}
