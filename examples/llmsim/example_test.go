package llmsim_test

import (
	"fmt"
	"strings"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
)

// Two prompts sharing a long system prompt: the second hits the shared prefix, in whole
// 16-token blocks.
func ExampleBlockCache() {
	cache := llmsim.NewBlockCache(1024)
	system := strings.Repeat("You are a helpful assistant. ", 20) // 580 chars
	for _, question := range []string{"What is a KV cache?", "How do I route requests?"} {
		p := llmsim.NewPrompt(system+question, llmsim.DefaultBlockTokens)
		fmt.Printf("%d of %d tokens cached\n", cache.Access(p), p.Tokens)
	}
	// Output:
	// 0 of 150 tokens cached
	// 144 of 151 tokens cached
}
