package main

import (
	"strings"
	"testing"
)

func TestVerdictFromTheRun(t *testing.T) {
	res := func(policy string, hit, p99 float64) *policyResult {
		return &policyResult{Policy: policy, Label: policy, Summary: summary{HitRatio: span{Mean: hit}, TTFTP99Ms: p99, Imbalance: span{Mean: 1.05}}}
	}
	v := verdict([]*policyResult{res("kv_cache_aware", 0.5, 200), res("round_robin", 0.2, 250), res("sglang_cache_aware", 0.4, 600)})
	for _, want := range []string{"hit 0.500", "2.5× round_robin", "more than the best other policy, sglang_cache_aware (1.25×)", "lowest TTFT p99"} {
		if !strings.Contains(v, want) {
			t.Errorf("verdict %q lacks %q", v, want)
		}
	}
	v = verdict([]*policyResult{res("kv_cache_aware", 0.3, 300), res("least_conn", 0.35, 150)})
	for _, want := range []string{"less than the best other policy, least_conn (0.86×)", "2.00× the lowest (least_conn)"} {
		if !strings.Contains(v, want) {
			t.Errorf("verdict %q lacks %q", v, want)
		}
	}
	if v := verdict([]*policyResult{res("round_robin", 0.2, 250)}); v != "" {
		t.Errorf("a verdict without kv_cache_aware: %q", v)
	}
}
