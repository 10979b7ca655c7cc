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
	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
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
	Cluster      *cluster.Stats            `json:"cluster,omitempty"` // with the cluster option, once running
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
			s.adminReset() // and on every peer, with a cluster
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
		if s == nil {
			return apiError(http.StatusNotFound, "no binding for that session")
		}
		// With a cluster the forget goes to every peer, which may hold a binding this replica
		// never saw: it is not a 404 then.
		found, published := s.adminForget(boundKey(id, maxSessionLen))
		if !found && !published {
			return apiError(http.StatusNotFound, "no binding for that session")
		}
		return writeJSON(w, http.StatusOK, map[string]any{"forgotten": found, "published": published})
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
	st.Cluster = s.clusterStats()
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
	for _, a := range addrs {
		us := UpstreamStatus{TreeChars: s.forest.TenantChars(a), Sessions: bound[a], Decisions: map[string]uint64{}}
		if v, ok := s.upstreams.Load(a); ok {
			u := v.(*upstreamState)
			us.InFlight = u.inFlight.Load()
			us.QueuedTokens = u.queuedTokens.Load()
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
