package decide

import "github.com/kvroute/caddy-kvroute/energy"

// DefaultRule is the decision kvroute's kv_cache_aware runs when its Caddyfile names none
// (kvroute's DefaultDecision): the one place a simulator reads which decision is the default.
const DefaultRule = Thresholds

// DefaultOptions returns the options the decision reads under kvroute's defaults
// (kvroute/options.go: cache_threshold 0.1, balance_abs_threshold 4, balance_rel_threshold
// 1.5, on_imbalance prefix_in_band, fallback joule, expected_tokens 256, ttft_slack 5,
// decision DefaultRule, objective latency; decision thresholds sees batch slots and slower
// engines: SlotRank, SlotMove, SpeedRank and FullStay, which kvroute always sets), for a
// caller outside Caddy (the fleet simulator).
// kvroute's tests check that its defaults give the same options.
func DefaultOptions() Options {
	return Options{
		Rule:           DefaultRule,
		Objective:      Latency,
		CacheThreshold: 0.1,
		BalanceAbs:     4,
		BalanceRel:     1.5,
		ExpectedTokens: 256,
		TTFTSlack:      5.0,
		SlotRank:       true,
		SlotMove:       true,
		SpeedRank:      true,
		FullStay:       true,
		Placer:         energy.NewPlacer(energy.Joule),
	}
}
