package main

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/fleetsim"
	"github.com/kvroute/caddy-kvroute/examples/replay"
)

// TestConversationWorkload: -workload conversation sends the fleet simulator's conversation
// look-alike, request for request (what demosim's demo-conversation-closed-16-4slots runs),
// closed loop by default with the Mooncake fleet's defaults, and a sim worker answers it.
func TestConversationWorkload(t *testing.T) {
	cfg, err := parseFlags([]string{"-caddy", "x", "-workload", "conversation"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.openLoop || cfg.limit != 1000 || cfg.speed != mooncakeSpeed || cfg.blocks != mooncakeBlocksPerWorker || cfg.loopDescription() != "closed loop, 16 clients" {
		t.Errorf("defaults: open loop %v, limit %d, speed %g, blocks %d (%s)", cfg.openLoop, cfg.limit, cfg.speed, cfg.blocks, cfg.loopDescription())
	}
	w, err := cfg.workload()
	if err != nil {
		t.Fatal(err)
	}
	want := fleetsim.ConversationTrace(1000, 0)
	if w.Name != "conversation" || len(w.Sessions) != len(want) {
		t.Fatalf("workload %q of %d sessions, want conversation of %d", w.Name, len(w.Sessions), len(want))
	}
	shared := 0
	for i, s := range w.Sessions {
		c := s.Calls[0]
		if len(s.Calls) != 1 || c.MaxTokens != max(1, want[i].OutputLength) || len(c.Resolve().Prompt) != 4*want[i].InputLength {
			t.Fatalf("request %d: %d calls, max_tokens %d, prompt of %d chars; want 1, %d, %d", i, len(s.Calls), c.MaxTokens, len(c.Resolve().Prompt), want[i].OutputLength, 4*want[i].InputLength)
		}
		if i > 0 && c.Trace.HashIDs[0] == w.Sessions[0].Calls[0].Trace.HashIDs[0] {
			shared++
		}
	}
	if shared != len(want)-1 {
		t.Errorf("%d requests start with the first request's block, want every one", shared+1)
	}

	small, err := parseFlags([]string{"-caddy", "x", "-workload", "conversation", "-limit", "6", "-concurrency", "2", "-workers", "1", "-speed", "50"})
	if err != nil {
		t.Fatal(err)
	}
	if w, err = small.workload(); err != nil {
		t.Fatal(err)
	}
	f, err := startSimFleet(small)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := replay.Run(ctx, w, small.replayOptions(f.Workers[0].URL, small.blocks, 16))
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 6 || res.Errors != 0 || res.Mode != "closed" || !(res.HitRatio > 0) {
		t.Errorf("replay: mode %q, %d requests, %d errors, hit ratio %v; want closed, 6, 0, some hits", res.Mode, res.Requests, res.Errors, res.HitRatio)
	}
}
