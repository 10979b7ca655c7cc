package kvroute

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are created once per process and registered into each config's registry
// (ctx.GetMetricsRegistry() is new for every config load), so they keep counting across reloads.
var metrics = newMetrics()

type kvMetrics struct {
	decisions     [numPaths]prometheus.Counter
	matchRatio    prometheus.Histogram
	tokensAvoided prometheus.Counter
	joulesSaved   prometheus.Counter
	decisionsVec  *prometheus.CounterVec
	gauges        stateCollector
	cluster       clusterCollector
}

const ns, sub = "caddy", "kvroute"

func newMetrics() *kvMetrics {
	m := &kvMetrics{
		decisionsVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "decisions_total",
			Help: "Routing decisions by path: session, prefix_hit, imbalance, fallback, no_candidate.",
		}, []string{"path"}),
		matchRatio: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "match_ratio",
			Help:    "Share of the routing text held by the chosen upstream, per decision with routing text.",
			Buckets: []float64{0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1},
		}),
		tokensAvoided: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "prefill_tokens_avoided_total",
			Help: "Estimated prompt tokens (chars/4) already cached on the chosen upstream.",
		}),
		joulesSaved: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "joules_saved_total",
			Help: "Estimated prefill energy avoided by cache hits on annotated upstreams, in joules.",
		}),
	}
	for i, name := range pathNames {
		m.decisions[i] = m.decisionsVec.WithLabelValues(name)
	}
	return m
}

// registerMetrics registers the process's collectors into a config's registry.
func registerMetrics(reg *prometheus.Registry) {
	if reg == nil {
		return
	}
	for _, c := range []prometheus.Collector{
		metrics.decisionsVec, metrics.matchRatio, metrics.tokensAvoided, metrics.joulesSaved,
		&metrics.gauges, &metrics.cluster,
	} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				// A collector of the same name from elsewhere: skip rather than fail the config.
				continue
			}
		}
	}
}

// stateCollector reports what the shared state counts, read at scrape time: tree chars per
// upstream, in-flight requests per upstream, live sessions, stored chars, evictions. The state
// keeps its own counts and writes no metrics. Labels are upstream dial addresses only (bounded
// by the fleet), never sessions or prompts.
type stateCollector struct{}

var (
	descTreeChars = prometheus.NewDesc(ns+"_"+sub+"_tree_chars",
		"Chars of prompt prefixes the router believes the upstream holds, over all models.", []string{"upstream"}, nil)
	descStoredChars = prometheus.NewDesc(ns+"_"+sub+"_stored_chars",
		"Chars stored in all prefix trees (each node counted once).", nil, nil)
	descInFlight = prometheus.NewDesc(ns+"_"+sub+"_in_flight",
		"Requests the router sent to the upstream that have not finished.", []string{"upstream"}, nil)
	descSessions = prometheus.NewDesc(ns+"_"+sub+"_sessions",
		"Live session bindings.", nil, nil)
	descEvictedChars = prometheus.NewDesc(ns+"_"+sub+"_evicted_chars_total",
		"Chars evicted from the prefix trees by the periodic eviction.", nil, nil)
	descEvictionRuns = prometheus.NewDesc(ns+"_"+sub+"_evictions_total",
		"Periodic eviction passes run.", nil, nil)
)

func (*stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descTreeChars
	ch <- descStoredChars
	ch <- descInFlight
	ch <- descSessions
	ch <- descEvictedChars
	ch <- descEvictionRuns
}

func (*stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := currentState()
	if s == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descStoredChars, prometheus.GaugeValue, float64(s.forest.Chars()))
	ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(s.sessions.len()))
	ch <- prometheus.MustNewConstMetric(descEvictedChars, prometheus.CounterValue, float64(s.evictedChars.Load()))
	ch <- prometheus.MustNewConstMetric(descEvictionRuns, prometheus.CounterValue, float64(s.evictions.Load()))
	for _, addr := range s.upstreamAddrs() {
		ch <- prometheus.MustNewConstMetric(descTreeChars, prometheus.GaugeValue, float64(s.forest.TenantChars(addr)), addr)
		if v, ok := s.upstreams.Load(addr); ok {
			ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(v.(*upstreamState).inFlight.Load()), addr)
		}
	}
}
