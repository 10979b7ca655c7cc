package replay

import (
	"testing"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// TestEstimateWithOwnPrompt checks that Options.Prompt replaces the simulator's tokenizer in
// the reference: a tokenizer that counts twice the tokens for the same blocks doubles the token
// total and lowers the hit ratios.
func TestEstimateWithOwnPrompt(t *testing.T) {
	w := workload.ChatWorkload(workload.ChatConfig{Conversations: 4, SystemPrompts: 1, Turns: 3, Seed: 1})
	calls := 0
	opts := Options{Concurrency: 1, FleetBlocks: 1 << 20, Prompt: func(c workload.Call) llmsim.Prompt {
		calls++
		if c.Trace != nil || len(c.Messages) == 0 {
			t.Fatalf("Prompt got an unresolved call")
		}
		p := llmsim.NewPrompt(SimText(c), 16)
		p.Tokens *= 2
		return p
	}}
	own := Estimate(w, opts)
	opts.Prompt = nil
	sim := Estimate(w, opts)
	if calls != w.Calls() || own.PromptTokens != 2*sim.PromptTokens || own.InfiniteHitRatio >= sim.InfiniteHitRatio {
		t.Errorf("own tokenizer: %d calls, %d prompt tokens (sim %d), infinite %.3f (sim %.3f)",
			calls, own.PromptTokens, sim.PromptTokens, own.InfiniteHitRatio, sim.InfiniteHitRatio)
	}
}
