package tree_test

import (
	"fmt"

	"github.com/kvroute/caddy-kvroute/tree"
)

func Example() {
	// One forest per process: a tree per model, one budget for all of them.
	f := tree.NewForest(tree.Limits{
		MaxChars:       64 << 20,
		TenantMaxChars: map[string]int64{"10.0.0.2:8000": 4 * 2_000_000}, // kv_capacity 2M tokens
	})
	t := f.Tree("llama-3.1-8b")

	// Record where prompts went.
	t.Insert("You are a helpful assistant. Summarize: the report", "10.0.0.1:8000")
	t.Insert("You are a helpful assistant. Translate: bonjour", "10.0.0.2:8000")

	// Route the next prompt: the longest match among the upstreams that can take it.
	var m tree.Match // reuse across requests: Match does not allocate
	t.Match("You are a helpful assistant. Summarize: the minutes", &m)
	for _, tm := range m.Tenants {
		fmt.Printf("%s holds %d of %d chars\n", tm.Tenant, tm.Runes, m.Runes)
	}
	// The first tenant the caller accepts is its longest acceptable match.
	saturated := map[string]bool{"10.0.0.1:8000": true}
	for _, tm := range m.Tenants {
		if !saturated[tm.Tenant] {
			fmt.Println("route to", tm.Tenant)
			break
		}
	}
	// Output:
	// 10.0.0.1:8000 holds 44 of 51 chars
	// 10.0.0.2:8000 holds 29 of 51 chars
	// route to 10.0.0.2:8000
}

func ExampleForest_Evict() {
	f := tree.NewForest(tree.Limits{})
	t := f.Tree("")
	t.Insert("old prompt", "a:1")
	t.Insert("new prompt", "b:1")
	f.SetLimits(tree.Limits{MaxChars: 12}) // over: evicts the least recently used leaves
	fmt.Println(f.Chars(), t.MatchTenant("old prompt", "a:1"), t.MatchTenant("new prompt", "b:1"))
	// Output: 10 0 10
}
