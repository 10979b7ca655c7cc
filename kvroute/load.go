package kvroute

// load returns an upstream's load for the decision:
//
//	load = own(now) + peers(now) + external
//	external = max(0, engine_running + engine_waiting − own(t_reading) − peers(t_reading))
//
// own is this router's count of requests in flight, taken at decision time (Caddy's
// NumRequests only moves after Select returns, so concurrent decisions would all see the old
// value); peers are the latest counts other replicas published; engine_* the engine's own
// figures read at t_reading. Each request counts once. Without telemetry or cluster, the
// missing terms are 0.
//
// Caddy's NumRequests counts this router's requests too (all policies of the process share
// one count per upstream address), so own is the larger of the two. external is computed once
// per reading (telemetry.go: observe) and counts until the reading is readingLifetime
// intervals old. now is in unix nanoseconds.
func (s *state) load(u *upstreamState, numRequests int, now int64) int64 {
	return max(u.inFlight.Load(), int64(numRequests)) + s.peersInFlight(u.addr) + u.externalLoad(now)
}
