package cluster

import (
	"sort"
	"sync/atomic"
	"time"
)

type counters struct {
	sent, sentBytes                             atomic.Uint64
	received, receivedBytes                     atomic.Uint64
	decisionsReceived, bindingsReceived         atomic.Uint64
	bindingsRefused                             atomic.Uint64
	droppedQueue, droppedPublish, droppedSlow   atomic.Uint64
	droppedFlood, droppedPeers, droppedSync     atomic.Uint64
	rejectedAuth, rejectedReplay, rejectedStale atomic.Uint64
	rejectedMalformed                           atomic.Uint64
	ownIgnored                                  atomic.Uint64
	textBytes, wireTextBytes                    atomic.Uint64
	fragmented, fragmentsLost                   atomic.Uint64
	syncRequests, syncServed, syncServedRecords atomic.Uint64
	syncReceivedRecords                         atomic.Uint64
	disconnects                                 atomic.Uint64
	duplicates                                  atomic.Uint64
	readingsSent, readingsReceived              atomic.Uint64
	readingsRejected                            atomic.Uint64
	learnedSent, learnedReceived                atomic.Uint64
	learnedRejected                             atomic.Uint64
}

// Stats is a snapshot of a node's counters, for the admin API and metrics. Counters only grow.
type Stats struct {
	ID        string `json:"id"`
	Connected bool   `json:"connected"`
	Server    string `json:"server,omitempty"` // id of the NATS server connected to

	Sent          uint64 `json:"sent"`           // messages published
	SentBytes     uint64 `json:"sent_bytes"`     // their bytes
	Received      uint64 `json:"received"`       // messages arrived, good or bad
	ReceivedBytes uint64 `json:"received_bytes"` // their bytes

	DecisionsReceived uint64 `json:"decisions_received"` // applied through the Handler
	BindingsReceived  uint64 `json:"bindings_received"`
	// BindingsRefused: peers' bindings not applied, older than the one held (BindingNewer)
	// or made before an admin forgot the session or reset the fleet.
	BindingsRefused uint64 `json:"bindings_refused"`
	// Duplicates: a peer's decisions and bindings heard twice, live and in a catch-up reply
	// (after a NATS restart, say), and applied once.
	Duplicates uint64 `json:"duplicates"`

	// Dropped: items or messages lost on this side: the queue was full, nats.go's buffer was
	// full or the connection closed, NATS dropped for a slow consumer, a peer went over
	// peer_rate, the peer table was full, or too many catch-up requests waited.
	DroppedQueue   uint64 `json:"dropped_queue"`
	DroppedPublish uint64 `json:"dropped_publish"`
	DroppedSlow    uint64 `json:"dropped_slow"`
	DroppedFlood   uint64 `json:"dropped_flood"`
	DroppedPeers   uint64 `json:"dropped_peers"`
	DroppedSync    uint64 `json:"dropped_sync"`
	// Rejected: messages that failed to open (wrong secret or forged), were replayed, were
	// outside the replay window, or were malformed.
	RejectedAuth      uint64 `json:"rejected_auth"`
	RejectedReplay    uint64 `json:"rejected_replay"`
	RejectedStale     uint64 `json:"rejected_stale"`
	RejectedMalformed uint64 `json:"rejected_malformed"`

	// TextBytes is the routing text published, WireTextBytes what it took compressed.
	TextBytes     uint64 `json:"text_bytes"`
	WireTextBytes uint64 `json:"wire_text_bytes"`
	// Fragmented counts records split over several messages; FragmentsLost, partial ones
	// dropped.
	Fragmented    uint64 `json:"fragmented"`
	FragmentsLost uint64 `json:"fragments_lost"`

	// Catch-up: requests sent, replies served and their records, records received.
	SyncRequests        uint64 `json:"sync_requests"`
	SyncServed          uint64 `json:"sync_served"`
	SyncServedRecords   uint64 `json:"sync_served_records"`
	SyncReceivedRecords uint64 `json:"sync_received_records"`
	// LogBytes and LogEntries: the catch-up log kept for peers.
	LogBytes   int `json:"log_bytes"`
	LogEntries int `json:"log_entries"`

	// Engine readings (reading.go): published, applied from peers, rejected for bad values.
	ReadingsSent     uint64 `json:"readings_sent"`
	ReadingsReceived uint64 `json:"readings_received"`
	ReadingsRejected uint64 `json:"readings_rejected"`
	// Learned figures (learned.go): published, applied from peers, rejected for bad values.
	LearnedSent     uint64 `json:"learned_sent"`
	LearnedReceived uint64 `json:"learned_received"`
	LearnedRejected uint64 `json:"learned_rejected"`

	Disconnects uint64      `json:"disconnects"`
	Peers       []PeerStats `json:"peers"`
}

// Dropped is the sum of the Dropped* counters.
func (s Stats) Dropped() uint64 {
	return s.DroppedQueue + s.DroppedPublish + s.DroppedSlow + s.DroppedFlood + s.DroppedPeers + s.DroppedSync
}

// Rejected is the sum of the Rejected* counters.
func (s Stats) Rejected() uint64 {
	return s.RejectedAuth + s.RejectedReplay + s.RejectedStale + s.RejectedMalformed
}

// CompressionRatio is TextBytes / WireTextBytes (0 before any decision was published).
func (s Stats) CompressionRatio() float64 {
	if s.WireTextBytes == 0 {
		return 0
	}
	return float64(s.TextBytes) / float64(s.WireTextBytes)
}

// PeerStats is what a node knows of one peer.
type PeerStats struct {
	ID        string    `json:"id"`
	FirstSeen time.Time `json:"first_seen"`
	LastHeard time.Time `json:"last_heard"`
	// Lag is the receive time minus the send time of its last message: NATS delay plus the
	// clocks' difference.
	Lag      time.Duration `json:"lag_ns"`
	Messages uint64        `json:"messages"`
	Bytes    uint64        `json:"bytes"`
	Records  uint64        `json:"records"`
	// Live: heard within load_ttl, so its load counts.
	Live bool `json:"live"`
	// Load is the sum of its last published in-flight counts.
	Load int64 `json:"load"`
}

// Stats returns a snapshot. Do not call it from a Handler method.
func (n *Node) Stats() Stats {
	c := &n.st
	s := Stats{
		ID:                  n.idHex,
		Sent:                c.sent.Load(),
		SentBytes:           c.sentBytes.Load(),
		Received:            c.received.Load(),
		ReceivedBytes:       c.receivedBytes.Load(),
		DecisionsReceived:   c.decisionsReceived.Load(),
		BindingsReceived:    c.bindingsReceived.Load(),
		BindingsRefused:     c.bindingsRefused.Load(),
		Duplicates:          c.duplicates.Load(),
		DroppedQueue:        c.droppedQueue.Load(),
		DroppedPublish:      c.droppedPublish.Load(),
		DroppedSlow:         c.droppedSlow.Load(),
		DroppedFlood:        c.droppedFlood.Load(),
		DroppedPeers:        c.droppedPeers.Load(),
		DroppedSync:         c.droppedSync.Load(),
		RejectedAuth:        c.rejectedAuth.Load(),
		RejectedReplay:      c.rejectedReplay.Load(),
		RejectedStale:       c.rejectedStale.Load(),
		RejectedMalformed:   c.rejectedMalformed.Load(),
		TextBytes:           c.textBytes.Load(),
		WireTextBytes:       c.wireTextBytes.Load(),
		Fragmented:          c.fragmented.Load(),
		FragmentsLost:       c.fragmentsLost.Load(),
		SyncRequests:        c.syncRequests.Load(),
		SyncServed:          c.syncServed.Load(),
		SyncServedRecords:   c.syncServedRecords.Load(),
		SyncReceivedRecords: c.syncReceivedRecords.Load(),
		Disconnects:         c.disconnects.Load(),
		ReadingsSent:        c.readingsSent.Load(),
		ReadingsReceived:    c.readingsReceived.Load(),
		ReadingsRejected:    c.readingsRejected.Load(),
		LearnedSent:         c.learnedSent.Load(),
		LearnedReceived:     c.learnedReceived.Load(),
		LearnedRejected:     c.learnedRejected.Load(),
	}
	s.LogBytes, s.LogEntries = n.own.size()
	if nc := n.nc.Load(); nc != nil && nc.IsConnected() {
		s.Connected, s.Server = true, nc.ConnectedServerId()
	}
	now := time.Now()
	n.rmu.Lock()
	for _, p := range n.peers {
		ps := PeerStats{ID: hexID(p.id), FirstSeen: p.firstSeen, LastHeard: p.lastHeard, Lag: p.lag,
			Messages: p.messages, Bytes: p.bytes, Records: p.records, Live: now.Sub(p.lastHeard) <= n.cfg.LoadTTL}
		if ps.Live && now.Sub(p.loadsAt) <= n.cfg.LoadTTL {
			for _, v := range p.loads {
				ps.Load += v
			}
		}
		s.Peers = append(s.Peers, ps)
	}
	n.rmu.Unlock()
	sort.Slice(s.Peers, func(i, j int) bool { return s.Peers[i].ID < s.Peers[j].ID })
	return s
}
