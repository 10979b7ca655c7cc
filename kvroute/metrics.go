package kvroute

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
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
	// The router-side queue (queue.go): requests waiting and how long they waited per band,
	// requests shed per band and reason.
	queueRequests *prometheus.GaugeVec
	queueSeconds  *prometheus.HistogramVec
	shed          *prometheus.CounterVec
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
			Help: "Estimated prompt tokens (chars over the model's chars per token) already cached on the chosen upstream.",
		}),
		joulesSaved: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "joules_saved_total",
			Help: "Estimated prefill energy avoided by cache hits on annotated upstreams, in joules.",
		}),
	}
	m.queueRequests = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "queue_requests",
		Help: "Requests waiting at the router for a batch slot, per flow_control band (default: without bands).",
	}, []string{"band"})
	m.queueSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "queue_seconds",
		Help:    "How long requests waited at the router for a batch slot, per band (requests that waited only).",
		Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300},
	}, []string{"band"})
	m.shed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "shed_total",
		Help: "Requests answered 429 by flow_control, per band and reason: timeout, queue_full, tenant_full.",
	}, []string{"band", "reason"})
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
		metrics.queueRequests, metrics.queueSeconds, metrics.shed, &tenantCollector{},
		&metrics.gauges, &metrics.cluster, &learnCollector{}, &feedbackCollector{}, &fleetCollector{},
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
	descPending = prometheus.NewDesc(ns+"_"+sub+"_pending_sessions",
		"Session cookie ids issued and not yet presented back, held apart from the bindings.", nil, nil)
	descEvictedChars = prometheus.NewDesc(ns+"_"+sub+"_evicted_chars_total",
		"Chars evicted from the prefix trees by the periodic eviction.", nil, nil)
	descEvictionRuns = prometheus.NewDesc(ns+"_"+sub+"_evictions_total",
		"Periodic eviction passes run.", nil, nil)
	descEngineRunning = prometheus.NewDesc(ns+"_"+sub+"_engine_running",
		"Requests the upstream's engine reports running, as of its latest reading.", []string{"upstream"}, nil)
	descEngineWaiting = prometheus.NewDesc(ns+"_"+sub+"_engine_waiting",
		"Requests the upstream's engine reports queued, as of its latest reading.", []string{"upstream"}, nil)
	descEngineKVUsage = prometheus.NewDesc(ns+"_"+sub+"_engine_kv_usage_ratio",
		"Share of the upstream's KV cache in use (0 to 1), as of its latest reading.", []string{"upstream"}, nil)
	descEngineKVCapacity = prometheus.NewDesc(ns+"_"+sub+"_engine_kv_capacity_tokens",
		"Size of the upstream's KV cache in tokens, as its engine reports it.", []string{"upstream"}, nil)
	descEngineAge = prometheus.NewDesc(ns+"_"+sub+"_engine_reading_age_seconds",
		"Age of the upstream's latest telemetry reading.", []string{"upstream"}, nil)
	descExternalLoad = prometheus.NewDesc(ns+"_"+sub+"_external_load",
		"Requests the upstream's engine runs or queues beyond those this router sent (0 once the reading is stale).", []string{"upstream"}, nil)
	descScrapes = prometheus.NewDesc(ns+"_"+sub+"_telemetry_scrapes_total",
		"Reads of the upstream's metrics endpoint.", []string{"upstream"}, nil)
	descScrapeErrors = prometheus.NewDesc(ns+"_"+sub+"_telemetry_scrape_errors_total",
		"Reads of the upstream's metrics endpoint that brought no reading (refused, 404, slow, huge, garbled...).", []string{"upstream"}, nil)
	descDown = prometheus.NewDesc(ns+"_"+sub+"_upstream_down",
		"1 while the policy holds the upstream to be down (not a candidate unless all are).", []string{"upstream"}, nil)
	descDowns = prometheus.NewDesc(ns+"_"+sub+"_upstream_downs_total",
		"Times the policy found the upstream down.", []string{"upstream"}, nil)
)

func (*stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descTreeChars
	ch <- descStoredChars
	ch <- descInFlight
	ch <- descSessions
	ch <- descPending
	ch <- descEvictedChars
	ch <- descEvictionRuns
	for _, d := range []*prometheus.Desc{descEngineRunning, descEngineWaiting, descEngineKVUsage, descEngineKVCapacity,
		descEngineAge, descExternalLoad, descScrapes, descScrapeErrors, descDown, descDowns} {
		ch <- d
	}
}

func (*stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := currentState()
	if s == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descStoredChars, prometheus.GaugeValue, float64(s.forest.Chars()))
	ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(s.sessions.len()))
	ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(s.pending.len()))
	ch <- prometheus.MustNewConstMetric(descEvictedChars, prometheus.CounterValue, float64(s.evictedChars.Load()))
	ch <- prometheus.MustNewConstMetric(descEvictionRuns, prometheus.CounterValue, float64(s.evictions.Load()))
	for _, addr := range s.upstreamAddrs() {
		ch <- prometheus.MustNewConstMetric(descTreeChars, prometheus.GaugeValue, float64(s.forest.TenantChars(addr)), addr)
		if v, ok := s.upstreams.Load(addr); ok {
			u := v.(*upstreamState)
			ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(u.inFlight.Load()), addr)
			down := 0.0
			if u.health.down.Load() {
				down = 1
			}
			ch <- prometheus.MustNewConstMetric(descDown, prometheus.GaugeValue, down, addr)
			ch <- prometheus.MustNewConstMetric(descDowns, prometheus.CounterValue, float64(u.health.total.Load()), addr)
		}
	}
	collectTelemetry(ch, s)
}

// collectTelemetry reports the engines' figures as last read, per upstream read.
func collectTelemetry(ch chan<- prometheus.Metric, s *state) {
	sc := s.tel.current.Load()
	if sc == nil {
		return
	}
	now := time.Now()
	for _, snap := range sc.Snapshots() {
		addr := snap.Key
		var total uint64
		for _, n := range snap.Counts {
			total += n
		}
		ch <- prometheus.MustNewConstMetric(descScrapes, prometheus.CounterValue, float64(total), addr)
		ch <- prometheus.MustNewConstMetric(descScrapeErrors, prometheus.CounterValue, float64(total-snap.Counts[telemetry.OutcomeOK]), addr)
		r := &snap.Reading
		if r.At.IsZero() {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descEngineAge, prometheus.GaugeValue, snap.Age(now).Seconds(), addr)
		if r.Known.Has(telemetry.HasRunning) {
			ch <- prometheus.MustNewConstMetric(descEngineRunning, prometheus.GaugeValue, float64(r.Running), addr)
		}
		if r.Known.Has(telemetry.HasWaiting) {
			ch <- prometheus.MustNewConstMetric(descEngineWaiting, prometheus.GaugeValue, float64(r.Waiting), addr)
		}
		if r.Known.Has(telemetry.HasKVUsage) {
			ch <- prometheus.MustNewConstMetric(descEngineKVUsage, prometheus.GaugeValue, r.KVUsage, addr)
		}
		if r.Known.Has(telemetry.HasKVCapacity) {
			ch <- prometheus.MustNewConstMetric(descEngineKVCapacity, prometheus.GaugeValue, float64(r.KVCapacityTokens), addr)
		}
		if v, ok := s.upstreams.Load(addr); ok {
			ch <- prometheus.MustNewConstMetric(descExternalLoad, prometheus.GaugeValue, float64(v.(*upstreamState).externalLoad(now.UnixNano())), addr)
		}
	}
}
