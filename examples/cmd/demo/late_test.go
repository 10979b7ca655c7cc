package main

import (
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/replay"
)

func TestCaughtUp(t *testing.T) {
	samples := []treeSample{
		{At: 1 * time.Second, Late: 0, Peers: []int64{0, 0}},       // peers empty: not caught up
		{At: 2 * time.Second, Late: 50, Peers: []int64{100, 100}},  // 0.5
		{At: 3 * time.Second, Late: 94, Peers: []int64{100, 100}},  // 0.94
		{At: 4 * time.Second, Late: 95, Peers: []int64{90, 110}},   // 0.95 of the mean
		{At: 5 * time.Second, Late: 120, Peers: []int64{100, 100}}, // later, also caught up
	}
	s, ok := caughtUp(samples, 0.95)
	if !ok || s.At != 4*time.Second {
		t.Errorf("caughtUp = %v at %v, want true at 4s", ok, s.At)
	}
	if _, ok := caughtUp(samples[:3], 0.95); ok {
		t.Error("caught up on samples that never reach 0.95")
	}
	if r := (treeSample{Late: 5}).ratio(); r != 0 {
		t.Errorf("ratio without peers = %v, want 0", r)
	}
}

func TestReplicaHits(t *testing.T) {
	recs := []replay.Record{
		{StartMs: 100, Replica: "a", PromptTokens: 100, CachedTokens: 100}, // before the window
		{StartMs: 1000, Replica: "a", PromptTokens: 100, CachedTokens: 50},
		{StartMs: 1500, Replica: "a", PromptTokens: 300, CachedTokens: 250},
		{StartMs: 1000, Replica: "b", PromptTokens: 200, CachedTokens: 100},
		{StartMs: 2000, Replica: "c", PromptTokens: 200, CachedTokens: 100},
		{StartMs: 2500, Error: "HTTP 502", PromptTokens: 0},
		{StartMs: 500, Error: "HTTP 502"}, // before the window: not counted
	}
	late, others, failed := replicaHits(recs, "a", time.Second)
	if late.Requests != 2 || late.ratio() != 0.75 {
		t.Errorf("late: %d requests, hit %v; want 2, 0.75", late.Requests, late.ratio())
	}
	if others.Requests != 2 || others.ratio() != 0.5 {
		t.Errorf("others: %d requests, hit %v; want 2, 0.5", others.Requests, others.ratio())
	}
	if failed != 1 {
		t.Errorf("failed = %d, want 1", failed)
	}
	if got := replicasOf(recs); len(got) != 3 || got[0] != "a" || got[1] != "b" || got[2] != "c" {
		t.Errorf("replicasOf = %v, want [a b c]", got)
	}
	if (hitStat{}).ratio() != 0 {
		t.Error("empty hitStat ratio not 0")
	}
}
