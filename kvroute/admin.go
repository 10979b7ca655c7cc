package kvroute

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
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
	// "/kvroute" too: the mux alone would answer it with a redirect body, which is what a user
	// trying the API with curl (no -L) sees.
	h := caddy.AdminHandlerFunc(a.serve)
	return []caddy.AdminRoute{{Pattern: "/kvroute/", Handler: h}, {Pattern: "/kvroute", Handler: h}}
}

func (a Admin) serve(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(r.URL.Path, "/kvroute")
	switch {
	case rest == "/" || rest == "":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			return apiError(http.StatusMethodNotAllowed, "method %s not allowed; use GET", r.Method)
		}
		st := Status{Models: map[string]ModelStatus{}, Upstreams: map[string]UpstreamStatus{}}
		if s := currentState(); s != nil {
			st = s.status()
		}
		return writeJSON(w, http.StatusOK, st)
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
		// The id is cut from the path the route was chosen by (unescaped): cut from the escaped
		// one, "/kvroute/%73essions/abc" would name no session.
		id := strings.TrimPrefix(rest, "/sessions/")
		if id == "" {
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
