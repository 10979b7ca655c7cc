package fleetsim

import "time"

// DemoTransit is the request path outside the engines as the demo measures it through Caddy
// on this project's 2-core machine: FitTransit on the -diagnose records of four series of 5
// interleaved rounds of kv_cache_aware, SGLang's algorithm and least_conn (chat, the Mooncake
// closed loop at speeds 10 and 2, the conversation look-alike; 46,680 requests at load averages
// of 0.9-6; docs/benchmarks.md, "Issue 41"). The send to the decision 0.54 ms, to the engine
// 0.34 ms more plus 33 µs per 1,000 prompt chars (the body copied, parsed and hashed on its
// way), the first and the last token back to the client 1.26 ms; each hop plus a draw of
// demoTransitExtra: nothing half the time, 1.8 ms at the 90th percentile, 11.6 at the 99th.
var DemoTransit = Transit{Router: 540 * time.Microsecond, Proxy: 338 * time.Microsecond, PerKChar: 33 * time.Microsecond,
	Back: 1263 * time.Microsecond, Sigma: 0.63, Extra: demoTransitExtra()}

// demoTransitExtra is the fit's added delays in µs, at 101 ranks.
func demoTransitExtra() []time.Duration {
	us := []int{
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 32, 49, 65, 81, 97, 114, 131, 148,
		167, 184, 202, 221, 241, 260, 281, 302, 324, 347, 369, 394, 420, 448, 479, 509, 543, 580, 619, 665,
		713, 768, 831, 900, 981, 1076, 1187, 1314, 1462, 1639, 1846, 2085, 2371, 2723, 3155, 3714, 4465, 5576, 7475, 11593,
		28263,
	}
	out := make([]time.Duration, len(us))
	for i, u := range us {
		out[i] = time.Duration(u) * time.Microsecond
	}
	return out
}
