package main

import (
	"regexp"
	"slices"
	"testing"

	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// llmdTokenRE is llm-d-inference-sim's dummy tokenizer (pkg/tokenizer, v0.10.2).
var llmdTokenRE = regexp.MustCompile(`(\{|\}|:|,|-|\.|\?|\!|;|@|#|\$|%|\^|&|\*|\(|\)|\+|\-|_|~|/|\\|>|<|\[|\]|=|"|'|\w+)(\s*)`)

func TestDummyTokensMatchLLMD(t *testing.T) {
	w := workload.ChatWorkload(workload.ChatConfig{Conversations: 2, Turns: 2, Seed: 5})
	inputs := []string{
		"", "  lead", "a_b _c __ x__y", "### user: Hello, world!\n\tok?  é ü 42x {\"k\": [1,2]}\\n",
		"[conversation 3, turn 1] the model... said: \"yes\" (maybe) -- 50%; a+b=c ~/x <y> #@$^&*'",
		w.Sessions[1].Calls[1].Messages[0].Content,
	}
	for _, in := range inputs {
		want := llmdTokenRE.FindAllString(in, -1)
		got := slices.Collect(dummyTokens(in))
		if !slices.Equal(got, want) {
			t.Errorf("dummyTokens(%q)\n got %q\nwant %q", in, got, want)
		}
	}
}

func TestLLMDPromptPrefixes(t *testing.T) {
	calls := workload.ChatWorkload(workload.ChatConfig{Conversations: 1, Turns: 3, Seed: 5}).Sessions[0].Calls
	p1, p2 := llmdPrompt(calls[0], 16), llmdPrompt(calls[1], 16)
	if len(p1.Hashes) == 0 || len(p2.Hashes) <= len(p1.Hashes) || p2.Tokens <= p1.Tokens {
		t.Fatalf("prompts: %d blocks/%d tokens, then %d/%d", len(p1.Hashes), p1.Tokens, len(p2.Hashes), p2.Tokens)
	}
	// Turn 2 resends turn 1's messages: all of turn 1's full blocks but the last (whose
	// final token's trailing blanks may differ) are shared.
	if !slices.Equal(p1.Hashes[:len(p1.Hashes)-1], p2.Hashes[:len(p1.Hashes)-1]) {
		t.Error("turn 2 does not share turn 1's blocks")
	}
}
