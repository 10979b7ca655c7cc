package decide_test

import (
	"fmt"

	"github.com/kvroute/caddy-kvroute/energy"
	"github.com/kvroute/caddy-kvroute/kvroute/decide"
)

// A snapshot built by hand, as a simulator builds one: two candidates, one holding most of the
// prompt behind a prefill queue, one cold, idle and faster. Decision cost keeps the request
// where its prefix is while the queue there costs less than a move would (the prefix prefilled
// on the other engine, and once more for the cache it takes there), and moves it past that.
func ExampleDecide() {
	opts := decide.Options{Rule: decide.Cost, BalanceAbs: 4, BalanceRel: 1.5, CacheThreshold: 0.1, ExpectedTokens: 256, TTFTSlack: 5}
	fast := &energy.Profile{PrefillTokensPerSecond: 8000}
	for _, queued := range []int64{2000, 20000} {
		cands := []decide.Candidate{
			{Key: 0, Match: 4000, Prefill: queued}, // holds 4,000 of the prompt's 4,400 chars
			{Key: 1, Profile: fast},                // holds nothing
		}
		s := decide.Snapshot{
			Now:        1,
			Request:    decide.Request{PromptChars: 4400, PromptTokens: 1100, CharsPerToken: 4},
			Candidates: cands,
		}
		res := decide.Decide(&opts, &s)
		fmt.Printf("%d tokens queued on the warm one: candidate %d (%s), predicted TTFT %.1f ms against %.1f ms\n",
			queued, cands[res.Chosen].Key, res.Path, cands[0].Cost.TTFT*1e3, cands[1].Cost.TTFT*1e3)
	}
	// Output:
	// 2000 tokens queued on the warm one: candidate 0 (prefix_hit), predicted TTFT 420.0 ms against 137.5 ms
	// 20000 tokens queued on the warm one: candidate 1 (imbalance), predicted TTFT 4020.0 ms against 137.5 ms
}
