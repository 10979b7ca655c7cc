package kvroute

import (
	"github.com/prometheus/client_golang/prometheus"
)

// clusterCollector reports the cluster node's counters, read at scrape time like
// stateCollector. The counters are the running node's: a reload that changes `cluster` opens
// a new node and they start again from 0 (a counter reset, which rate() handles).
type clusterCollector struct{}

var (
	descClusterConnected = prometheus.NewDesc(ns+"_"+sub+"_cluster_connected",
		"1 when this replica is connected to NATS.", nil, nil)
	descClusterPeers = prometheus.NewDesc(ns+"_"+sub+"_cluster_peers",
		"Peers heard from within load_ttl.", nil, nil)
	descClusterMessages = prometheus.NewDesc(ns+"_"+sub+"_cluster_messages_total",
		"Cluster messages sent and received (received counts bad ones too).", []string{"direction"}, nil)
	descClusterBytes = prometheus.NewDesc(ns+"_"+sub+"_cluster_bytes_total",
		"Bytes of cluster messages sent and received.", []string{"direction"}, nil)
	descClusterApplied = prometheus.NewDesc(ns+"_"+sub+"_cluster_applied_total",
		"Peers' decisions, session bindings and engine readings applied to this replica's state.", []string{"kind"}, nil)
	descClusterDuplicates = prometheus.NewDesc(ns+"_"+sub+"_cluster_duplicates_total",
		"Peers' decisions and bindings heard twice (live and in a catch-up reply) and applied once.", nil, nil)
	descClusterDropped = prometheus.NewDesc(ns+"_"+sub+"_cluster_dropped_total",
		"Cluster items or messages dropped on this replica, by reason.", []string{"reason"}, nil)
	descClusterRejected = prometheus.NewDesc(ns+"_"+sub+"_cluster_rejected_total",
		"Cluster messages rejected, by reason (auth: wrong secret or forged).", []string{"reason"}, nil)
	descClusterLag = prometheus.NewDesc(ns+"_"+sub+"_cluster_lag_seconds",
		"Largest receive-minus-send time of the live peers' last messages.", nil, nil)
	descClusterTextBytes = prometheus.NewDesc(ns+"_"+sub+"_cluster_text_bytes_total",
		"Routing text published, before (raw) and after (wire) compression.", []string{"form"}, nil)
)

func (*clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descClusterConnected, descClusterPeers, descClusterMessages,
		descClusterBytes, descClusterApplied, descClusterDuplicates, descClusterDropped, descClusterRejected, descClusterLag,
		descClusterTextBytes} {
		ch <- d
	}
}

func (*clusterCollector) Collect(ch chan<- prometheus.Metric) {
	s := currentState()
	if s == nil {
		return
	}
	st := s.clusterStats()
	if st == nil {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	connected, live, lag := 0.0, 0, 0.0
	if st.Connected {
		connected = 1
	}
	for _, p := range st.Peers {
		if p.Live {
			live++
			lag = max(lag, p.Lag.Seconds())
		}
	}
	gauge(descClusterConnected, connected)
	gauge(descClusterPeers, float64(live))
	gauge(descClusterLag, lag)
	counter(descClusterMessages, st.Sent, "sent")
	counter(descClusterMessages, st.Received, "received")
	counter(descClusterBytes, st.SentBytes, "sent")
	counter(descClusterBytes, st.ReceivedBytes, "received")
	counter(descClusterApplied, st.DecisionsReceived, "decision")
	counter(descClusterApplied, st.BindingsReceived, "binding")
	counter(descClusterDuplicates, st.Duplicates)
	counter(descClusterApplied, st.ReadingsReceived, "reading")
	counter(descClusterTextBytes, st.TextBytes, "raw")
	counter(descClusterTextBytes, st.WireTextBytes, "wire")
	for reason, v := range map[string]uint64{"queue": st.DroppedQueue, "publish": st.DroppedPublish,
		"slow": st.DroppedSlow, "flood": st.DroppedFlood, "peers": st.DroppedPeers, "sync": st.DroppedSync} {
		counter(descClusterDropped, v, reason)
	}
	for reason, v := range map[string]uint64{"auth": st.RejectedAuth, "replay": st.RejectedReplay,
		"stale": st.RejectedStale, "malformed": st.RejectedMalformed, "reading": st.ReadingsRejected} {
		counter(descClusterRejected, v, reason)
	}
}
