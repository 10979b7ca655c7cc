package kvroute

import (
	"time"

	"github.com/kvroute/caddy-kvroute/energy"
	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
)

// Status is the JSON answer of GET /kvroute/.
type Status struct {
	Loaded      bool  `json:"loaded"` // a kv_cache_aware policy is in the running config
	StoredChars int64 `json:"stored_chars"`
	Sessions    int   `json:"sessions"`
	// PendingSessions are cookie ids issued and not yet presented back (held apart).
	PendingSessions int                       `json:"pending_sessions"`
	Models          map[string]ModelStatus    `json:"models"`
	Upstreams       map[string]UpstreamStatus `json:"upstreams"`
	Evictions       int64                     `json:"evictions"`
	EvictedChars    int64                     `json:"evicted_chars"`
	LastEviction    *evictionRecord           `json:"last_eviction,omitempty"`
	Cluster         *cluster.Stats            `json:"cluster,omitempty"` // with the cluster option, once running
	// CharsPerToken holds the chars of routing text per prompt token learned per model (a
	// model absent here is estimated at DefaultCharsPerToken).
	CharsPerToken map[string]float64 `json:"chars_per_token"`
	// RecentDecisions are the latest decisions of decision cost, newest first, with every
	// candidate's prediction (admin only: the explain header shows the chosen one's).
	RecentDecisions []DecisionStatus `json:"recent_decisions,omitempty"`
	// Disaggregation counts llm_disaggregate's requests by path (split, aggregated_short,
	// aggregated_fallback, prefill_failed, refused, shed), since the process started; absent
	// before any.
	Disaggregation map[string]uint64 `json:"disaggregation,omitempty"`
	// Queue is the requests waiting at the router for a slot and the tenants' tokens served
	// (queue.go).
	Queue *QueueStatus `json:"queue"`
}

// ModelStatus is one model's tree.
type ModelStatus struct {
	Chars     int64            `json:"chars"`      // stored in the tree, each node counted once
	TreeChars map[string]int64 `json:"tree_chars"` // per upstream
}

// UpstreamStatus is what the router knows of one upstream.
type UpstreamStatus struct {
	TreeChars    int64 `json:"tree_chars"` // over all models
	Sessions     int   `json:"sessions"`
	InFlight     int64 `json:"in_flight"`
	QueuedTokens int64 `json:"queued_tokens"`
	// PrefillTokens: the uncached tokens of those that have not produced a first token (or,
	// without llm_feedback, whose predicted first token has not come yet).
	PrefillTokens int64             `json:"prefill_tokens"`
	Decisions     map[string]uint64 `json:"decisions"`
	LastDecision  *time.Time        `json:"last_decision,omitempty"`
	Profile       *energy.Profile   `json:"profile,omitempty"` // from the newest config's upstream block
	// Load is the load the decision sees (load.go): in flight as this process counts them (also
	// another reverse_proxy's requests), the peers' and the engine's external load.
	Load int64 `json:"load"`
	// KVCapacityTokens bounds the upstream's share of the trees: kv_capacity, else what the
	// engine reports; 0 when unknown.
	KVCapacityTokens int64 `json:"kv_capacity_tokens,omitempty"`
	// TreeBoundChars is what the trees remember for the upstream at most: 1.5 × its KV
	// capacity at the chars per token of the model it is sent.
	TreeBoundChars int64            `json:"tree_bound_chars,omitempty"`
	Telemetry      *TelemetryStatus `json:"telemetry,omitempty"` // absent when not read
	// Learned is what the upstream's engine's totals taught (prefill and decode speed, its own
	// hit ratio beside the predicted one, restarts) and which totals it exports; the priors
	// until then.
	Learned *learnedFigures `json:"learned"`
	Health  HealthStatus    `json:"health"`
	// Feedback is what its answers reported (llm_feedback); absent when none was read.
	Feedback *FeedbackStatus `json:"feedback,omitempty"`
	// Models is what its engine's GET /v1/models lists (absent until read or tried), LoRA
	// its warm adapters and the adapter switches this router caused there (absent without).
	Models *ModelsStatus `json:"models,omitempty"`
	LoRA   *LoRAStatus   `json:"lora,omitempty"`
}

// status answers the admin API's GET /kvroute/: what the state knows, per model and upstream.
func (s *state) status() Status {
	st := Status{Models: map[string]ModelStatus{}, Upstreams: map[string]UpstreamStatus{}}
	st.Loaded = s.loaded()
	st.Queue = s.queueStatus()
	st.StoredChars = s.forest.Chars()
	st.Sessions = s.sessions.len()
	st.PendingSessions = s.pending.len()
	st.Cluster = s.clusterStats()
	st.Evictions = s.evictions.Load()
	st.EvictedChars = s.evictedChars.Load()
	st.LastEviction = s.lastEviction.Load()
	st.CharsPerToken = s.learnedCharsMap()
	st.RecentDecisions = s.recent.snapshot()
	st.Disaggregation = disaggStatus()
	addrs := s.upstreamAddrs()
	for _, name := range s.forest.Names() {
		t := s.forest.Get(name)
		if t == nil {
			continue
		}
		ms := ModelStatus{Chars: t.Chars(), TreeChars: map[string]int64{}}
		for _, a := range addrs {
			if c := t.TenantChars(a); c > 0 {
				ms.TreeChars[a] = c
			}
		}
		st.Models[name] = ms
	}
	bound := s.sessions.perUpstream()
	now := time.Now()
	s.mu.Lock()
	capacity := make(map[string]int64)
	for q := range s.regs {
		for a, prof := range q.profiles {
			if prof.KVCapacity > 0 {
				capacity[a] = prof.KVCapacity
			}
		}
	}
	for a, tokens := range s.tel.capacity {
		if _, annotated := capacity[a]; !annotated {
			capacity[a] = tokens
		}
	}
	s.mu.Unlock()
	for _, a := range addrs {
		us := UpstreamStatus{TreeChars: s.forest.TenantChars(a), Sessions: bound[a], Decisions: map[string]uint64{}}
		if v, ok := s.upstreams.Load(a); ok {
			u := v.(*upstreamState)
			us.InFlight = u.inFlight.Load()
			us.QueuedTokens = u.queuedTokens.Load()
			us.PrefillTokens = u.prefillTokens.Load()
			us.Load = s.load(u, now.UnixNano())
			us.Health = u.healthStatus()
			us.Feedback = u.feedbackStatus()
			var snap *telemetry.Snapshot
			if sc := s.tel.current.Load(); sc != nil {
				snap = sc.Snapshot(a)
			}
			us.Models = modelsStatus(snap)
			us.LoRA = u.loraStatus()
			for i, n := range pathNames {
				us.Decisions[n] = u.decisions[i].Load()
			}
			if t := u.lastUsed.Load(); t > 0 {
				tt := time.Unix(0, t).UTC()
				us.LastDecision = &tt
			}
		}
		if prof, ok := s.profile(a); ok {
			us.Profile = &prof
		}
		us.KVCapacityTokens = capacity[a]
		if c := capacity[a]; c > 0 {
			us.TreeBoundChars = int64(float64(tenantBound(c, s.upstreamCharsPerToken(a))) * s.shareOf(a))
		}
		us.Telemetry = s.telemetryStatus(a, now)
		us.Learned = s.learnedStatus(a)
		if us.Health.State == "" {
			us.Health.State = "up"
		}
		st.Upstreams[a] = us
	}
	return st
}
