package kvroute

import "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

// load returns an upstream's load for the decision:
//
//	load = own(now) + peers(now) + external
//	external = max(0, engine_running + engine_waiting − own(t_reading) − peers(t_reading))
//
// own is this process's count of requests in flight (own below); peers are the latest counts
// other replicas published; engine_* the engine's own figures read at t_reading. Each request
// counts once: external is what neither this process nor a peer sent. Without telemetry or
// cluster, the missing terms are 0. external is computed once per reading (telemetry.go:
// observe), the smaller of the last two readings' figures, and counts until the reading is
// readingLifetime intervals old; it is 0 while the engine's own counts show no request this
// router does not count (learn.go: outsideTraffic). now is in unix nanoseconds.
//
// Under concurrency: Select reads the loads and counts its choice in inFlight under
// state.deciding, so a decision sees every decision made before it. The upstream a session, a
// prefix or the fallback goes to therefore has, before it, a load within the band of the least
// loaded candidate (load − min ≤ balance_abs_threshold or load ≤ min × balance_rel_threshold),
// and at most max(min + abs, min × rel) + 1 after it, however many decisions run at once. For a
// burst of N requests of one session on k upstreams (none ending meanwhile), the session's
// upstream gets the largest h with h−1 in the band of ⌊(N−h)/(k−1)⌋: 13 of 40 on 4 with the
// defaults. Peers' decisions are not serialised with this router's: they arrive as peers(now),
// up to load_interval late.
func (s *state) load(u *upstreamState, now int64) int64 {
	return u.own() + s.peersInFlight(u.addr) + u.externalLoad(now)
}

// own returns the requests in flight on u as this process counts them: the larger of this
// router's count (inFlight, counted from the decision on: Caddy's NumRequests only moves after
// Select returns, so concurrent decisions would all see the old value) and Caddy's (counted
// once a request is sent, by every reverse_proxy of the process that sends to the address,
// kv_cache_aware or not). The decision's load and the external term both subtract this one
// figure, so a request another reverse_proxy sends counts once.
func (u *upstreamState) own() int64 {
	n := u.inFlight.Load()
	if h := u.host.Load(); h != nil {
		n = max(n, int64(h.NumRequests()))
	}
	return n
}

// seeHost records Caddy's per-address count that the decisions see. Static upstreams keep one
// Host while any config uses the address; a dynamic upstream's is replaced once idle, so the
// latest decision's is kept.
func (u *upstreamState) seeHost(h *reverseproxy.Host) {
	if h != nil && u.host.Load() != h {
		u.host.Store(h)
	}
}
