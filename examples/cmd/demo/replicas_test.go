package main

import (
	"strings"
	"testing"
)

func TestExpandReplicas(t *testing.T) {
	got := expandReplicas(allPolicies(nil)[:4], 3, false, false)
	var titles []string
	for _, p := range got {
		titles = append(titles, p.title())
	}
	want := "kv_cache_aware ×1|kv_cache_aware ×3|kv_cache_aware ×3 +cluster|sglang_cache_aware ×3|prefix_hash ×3|round_robin ×3"
	if strings.Join(titles, "|") != want {
		t.Errorf("replicas variants\n got %s\nwant %s", strings.Join(titles, "|"), want)
	}
	names := map[string]bool{}
	for _, p := range got {
		if names[p.Name] {
			t.Errorf("two variants named %s: their results would mix", p.Name)
		}
		names[p.Name] = true
		if p.Replicas == 0 || p.Cluster != strings.HasSuffix(p.title(), "+cluster") {
			t.Errorf("%s: replicas %d, cluster %v", p.title(), p.Replicas, p.Cluster)
		}
		if p.label() != p.Module {
			t.Errorf("%s: the lb_policy line would read %q", p.title(), p.label())
		}
	}
}

// The decision variants keep their suffix behind replicas (they printed as two identical
// "kv_cache_aware ×3 +cluster" rows before).
func TestExpandReplicasKeepsVariants(t *testing.T) {
	var titles []string
	for _, p := range expandReplicas(variantPolicies(nil), 3, false, false) {
		titles = append(titles, p.title())
	}
	want := "kv_cache_aware (decision cost) ×1|kv_cache_aware (decision cost) ×3|kv_cache_aware (decision cost) ×3 +cluster|" +
		"kv_cache_aware (decision thresholds) ×1|kv_cache_aware (decision thresholds) ×3|kv_cache_aware (decision thresholds) ×3 +cluster|" +
		"kv_cache_aware (objective energy) ×1|kv_cache_aware (objective energy) ×3|kv_cache_aware (objective energy) ×3 +cluster|" +
		"kv_cache_aware (flow_control) ×1|kv_cache_aware (flow_control) ×3|kv_cache_aware (flow_control) ×3 +cluster"
	if got := strings.Join(titles, "|"); got != want {
		t.Errorf("replicas variants\n got %s\nwant %s", got, want)
	}
}

// The front leaves the worker header as the replica set it (per-worker counts come from it) and
// names the replica in its own header; with Retry it retries a failed dial elsewhere.
func TestFrontKeepsWorkerHeader(t *testing.T) {
	front := site{AdminPort: 2999, Port: 8080, Upstreams: []string{"127.0.0.1:9001", "127.0.0.1:9002"},
		Policy: policy{Module: "round_robin"}, NoMatcher: true, Front: true}
	got := front.caddyfile()
	if strings.Contains(got, workerHeader) || !strings.Contains(got, "header_down "+replicaHeader+" {http.reverse_proxy.upstream.hostport}\n") ||
		!strings.Contains(got, "reverse_proxy 127.0.0.1:9001 127.0.0.1:9002 {\n\t\tlb_policy round_robin\n") ||
		strings.Contains(got, "lb_retries") {
		t.Errorf("front Caddyfile:\n%s", got)
	}
	front.Retry = true
	if got := front.caddyfile(); !strings.Contains(got, "\t\tlb_retries 2\n\t\tfail_duration 1s\n") {
		t.Errorf("front Caddyfile with Retry:\n%s", got)
	}
}
