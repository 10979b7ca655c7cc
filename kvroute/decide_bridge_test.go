package kvroute

import "github.com/kvroute/caddy-kvroute/kvroute/decide"

// Bridges from tests written before the decision moved into kvroute/decide (issue 33) to it.

// ttftBound is decide.TTFTBound.
func ttftBound(best, slack float64) float64 { return decide.TTFTBound(best, slack) }

// slotWait is the slot wait a decision at now predicts for c: c's engine figures gathered as
// Select gathers them, priced by the decision.
func (p *KVCacheAware) slotWait(c *candidate, now int64) float64 {
	d := [1]decide.Candidate{{Load: c.load}}
	engineFacts(&d[0], c.st)
	decide.Predict(&decide.Options{Rule: decide.Cost, ExpectedTokens: p.opts.expectedTokens}, &decide.Request{}, d[:], now)
	return d[0].Cost.Slot
}
