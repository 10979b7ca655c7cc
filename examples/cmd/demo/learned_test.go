package main

import (
	"testing"

	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// TestLlmdCharsPerToken: the simulator's own count on the chat workload is a tokenizer's (a few
// chars per token of routing text), and the same however many conversations are kept.
func TestLlmdCharsPerToken(t *testing.T) {
	w := workload.ChatWorkload(workload.DefaultChat)
	all := llmdCharsPerToken(w, 16)
	some := llmdCharsPerToken(w.Limit(20), 16)
	t.Logf("chat: %.3f chars per token (first 20 conversations: %.3f)", all, some)
	if all < 2 || all > 10 || some < 2 || some > 10 {
		t.Errorf("chars per token %.3f, %.3f: not a tokenizer's", all, some)
	}
}
