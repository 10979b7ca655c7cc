package main

import (
	"fmt"
	"strings"
)

// verdict returns one plain sentence on how kv_cache_aware did against the other policies of
// this run, computed from the results (empty when kv_cache_aware or every other policy is
// missing).
func verdict(results []*policyResult) string {
	var kv *policyResult
	var others []*policyResult
	for _, r := range results {
		if r.Policy == "kv_cache_aware" && kv == nil {
			kv = r
		} else {
			others = append(others, r)
		}
	}
	if kv == nil || len(others) == 0 {
		return ""
	}
	bestHit, lowestP99 := others[0], others[0]
	var rr *policyResult
	for _, r := range others {
		if r.Summary.HitRatio.Mean > bestHit.Summary.HitRatio.Mean {
			bestHit = r
		}
		if r.Summary.TTFTP99Ms < lowestP99.Summary.TTFTP99Ms {
			lowestP99 = r
		}
		if r.Policy == "round_robin" {
			rr = r
		}
	}
	s := kv.Summary
	var parts []string
	hit := fmt.Sprintf("kv_cache_aware hit %.3f of prompt tokens in cache", s.HitRatio.Mean)
	if rr != nil && rr.Summary.HitRatio.Mean > 0 {
		hit += fmt.Sprintf(" (%.1f× round_robin)", s.HitRatio.Mean/rr.Summary.HitRatio.Mean)
	}
	parts = append(parts, hit)
	if b := bestHit.Summary.HitRatio.Mean; b > 0 {
		word := "more than"
		if s.HitRatio.Mean < b {
			word = "less than"
		}
		parts = append(parts, fmt.Sprintf("%s the best other policy, %s (%.2f×)", word, bestHit.Label, s.HitRatio.Mean/b))
	}
	if l := lowestP99.Summary.TTFTP99Ms; l > 0 {
		if s.TTFTP99Ms <= l {
			parts = append(parts, fmt.Sprintf("with the lowest TTFT p99 of all (%s, %.2f× the next, %s)", fmtMs(s.TTFTP99Ms), s.TTFTP99Ms/l, lowestP99.Label))
		} else {
			parts = append(parts, fmt.Sprintf("with a TTFT p99 of %s, %.2f× the lowest (%s)", fmtMs(s.TTFTP99Ms), s.TTFTP99Ms/l, lowestP99.Label))
		}
	}
	parts = append(parts, fmt.Sprintf("imbalance %.2f", s.Imbalance.Mean))
	out := "Verdict: " + strings.Join(parts, ", ") + "."
	if s.Errors > 0 {
		out += fmt.Sprintf(" It had %d errors.", s.Errors)
	}
	return out
}
