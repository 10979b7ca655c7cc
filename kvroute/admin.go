package kvroute

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/kvroute/caddy-kvroute/energy"
)

func init() {
	caddy.RegisterModule(Admin{})
}

// Admin is the admin API module `admin.api.kvroute`. It serves, on Caddy's admin listener only:
//
//	GET    /kvroute/               the router's state, per model and upstream (JSON)
//	DELETE /kvroute/sessions/{id}  forget a session's bindings (for every model)
//	POST   /kvroute/reset          drop all prefix trees and session bindings
//
// Admin modules are created for every config, whether or not it uses the policy, so Admin
// reads the process-wide state.
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.kvroute",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (a Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/kvroute/", Handler: caddy.AdminHandlerFunc(a.serve)}}
}

// Status is the JSON answer of GET /kvroute/.
type Status struct {
	Loaded       bool                      `json:"loaded"` // a kv_cache_aware policy is in the running config
	StoredChars  int64                     `json:"stored_chars"`
	Sessions     int                       `json:"sessions"`
	Models       map[string]ModelStatus    `json:"models"`
	Upstreams    map[string]UpstreamStatus `json:"upstreams"`
	Evictions    int64                     `json:"evictions"`
	EvictedChars int64                     `json:"evicted_chars"`
	LastEviction *evictionRecord           `json:"last_eviction,omitempty"`
}

// ModelStatus is one model's tree.
type ModelStatus struct {
	Chars     int64            `json:"chars"`      // stored in the tree, each node counted once
	TreeChars map[string]int64 `json:"tree_chars"` // per upstream
}

// UpstreamStatus is what the router knows of one upstream.
type UpstreamStatus struct {
	TreeChars    int64             `json:"tree_chars"` // over all models
	Sessions     int               `json:"sessions"`
	InFlight     int64             `json:"in_flight"`
	QueuedTokens int64             `json:"queued_tokens"`
	Decisions    map[string]uint64 `json:"decisions"`
	LastDecision *time.Time        `json:"last_decision,omitempty"`
	Profile      *energy.Profile   `json:"profile,omitempty"` // from the newest config's upstream block
	// Load is the load the decision sees: in_flight plus the engine's external load.
	Load int64 `json:"load"`
	// KVCapacityTokens bounds the upstream's share of the trees: kv_capacity, else what the
	// engine reports; 0 when unknown.
	KVCapacityTokens int64            `json:"kv_capacity_tokens,omitempty"`
	Telemetry        *TelemetryStatus `json:"telemetry,omitempty"` // absent when not read
	Health           HealthStatus     `json:"health"`
}

func (a Admin) serve(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(r.URL.Path, "/kvroute")
	switch {
	case rest == "/" || rest == "":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			return apiError(http.StatusMethodNotAllowed, "method %s not allowed; use GET", r.Method)
		}
		return writeJSON(w, http.StatusOK, status(currentState()))
	case rest == "/reset":
		if r.Method != http.MethodPost {
			return apiError(http.StatusMethodNotAllowed, "method %s not allowed; use POST", r.Method)
		}
		if s := currentState(); s != nil {
			s.reset()
		}
		return writeJSON(w, http.StatusOK, map[string]any{"reset": true})
	case strings.HasPrefix(rest, "/sessions/"):
		if r.Method != http.MethodDelete {
			return apiError(http.StatusMethodNotAllowed, "method %s not allowed; use DELETE", r.Method)
		}
		raw := strings.TrimPrefix(r.URL.EscapedPath(), "/kvroute/sessions/")
		id, err := url.PathUnescape(raw)
		if err != nil || id == "" {
			return apiError(http.StatusBadRequest, "bad session id")
		}
		s := currentState()
		if s == nil || !s.forgetSession(boundKey(id, maxSessionLen)) {
			return apiError(http.StatusNotFound, "no binding for that session")
		}
		return writeJSON(w, http.StatusOK, map[string]any{"forgotten": true})
	default:
		return apiError(http.StatusNotFound, "no such endpoint; see GET /kvroute/")
	}
}

func status(s *state) Status {
	st := Status{Models: map[string]ModelStatus{}, Upstreams: map[string]UpstreamStatus{}}
	if s == nil {
		return st
	}
	st.Loaded = s.loaded()
	st.StoredChars = s.forest.Chars()
	st.Sessions = s.sessions.len()
	st.Evictions = s.evictions.Load()
	st.EvictedChars = s.evictedChars.Load()
	st.LastEviction = s.lastEviction.Load()
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
			us.Load = s.load(u, 0, now.UnixNano())
			us.Health = u.healthStatus()
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
		us.Telemetry = s.telemetryStatus(a, now)
		if us.Health.State == "" {
			us.Health.State = "up"
		}
		st.Upstreams[a] = us
	}
	return st
}

func writeJSON(w http.ResponseWriter, code int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	return json.NewEncoder(w).Encode(v)
}

func apiError(code int, format string, args ...any) error {
	return caddy.APIError{HTTPStatus: code, Err: fmt.Errorf(format, args...)}
}

// Interface guard.
var _ caddy.AdminRouter = Admin{}
