package main

import (
	"fmt"
	"strings"
	"testing"
)

// TestCompareFeedbackPolicies: -compare-feedback puts kv_cache_aware with `llm_feedback @llm`
// right after kv_cache_aware, and only kv_cache_aware; the twin's site has the directive ahead
// of the reverse_proxy the policy runs in, the others none.
func TestCompareFeedbackPolicies(t *testing.T) {
	cfg, err := parseFlags([]string{"-caddy", "x", "-compare-feedback", "-side-load", "4"})
	if err != nil || !cfg.compareFeedback {
		t.Fatalf("-compare-feedback: %v, %+v", err, cfg)
	}
	for _, args := range [][]string{
		{"-compare-feedback", "-compare-telemetry"},
		{"-compare-feedback", "-replicas", "2"},
	} {
		if _, err := parseFlags(append([]string{"-caddy", "x"}, args...)); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}

	ps := withFeedback(allPolicies([]string{"cache_threshold 0.3"})[:4])
	var titles []string
	for _, p := range ps {
		titles = append(titles, fmt.Sprintf("%s fb=%v", p.title(), p.Feedback))
	}
	want := "kv_cache_aware fb=false|kv_cache_aware (llm_feedback) fb=true|sglang_cache_aware fb=false|prefix_hash fb=false|round_robin fb=false"
	if got := strings.Join(titles, "|"); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if b := ps[1].Block; len(b) != 1 || b[0] != "cache_threshold 0.3" {
		t.Errorf("the twin's block %q: want kv_cache_aware's own", b)
	}
	// Applying it twice adds no second twin.
	if again := withFeedback(ps); len(again) != len(ps) {
		t.Errorf("withFeedback twice: %d policies, want %d", len(again), len(ps))
	}

	site := func(p policy, noMatcher bool) string {
		return site{AdminPort: 2019, Port: 8080, Upstreams: []string{"127.0.0.1:1", "127.0.0.1:2"}, Policy: p, NoMatcher: noMatcher}.caddyfile()
	}
	with := site(ps[1], false)
	if !strings.Contains(with, "\t@llm llm_prompt\n\tllm_feedback @llm\n\treverse_proxy @llm 127.0.0.1:1 127.0.0.1:2 {\n\t\tlb_policy kv_cache_aware {\n\t\t\tcache_threshold 0.3\n") {
		t.Errorf("with llm_feedback:\n%s", with)
	}
	if strings.Count(with, "llm_feedback") != 1 {
		t.Errorf("llm_feedback more than once:\n%s", with)
	}
	for _, s := range []string{site(ps[0], false), site(ps[2], false), site(ps[1], true)} {
		if strings.Contains(s, "llm_feedback") {
			t.Errorf("llm_feedback where not asked (or with no @llm to name):\n%s", s)
		}
	}
}
