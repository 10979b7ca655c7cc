package kvroute

import (
	"github.com/caddyserver/caddy/v2"
)

func init() {
	caddy.RegisterModule(new(App))
}

// App is the `kvroute` app: it starts the background work of the process-wide state (the
// telemetry readers, the cluster connection) when the config that holds kv_cache_aware
// policies starts.
//
// Why an app: Provision also runs under `caddy validate` (and `caddy adapt --validate`), which
// must start nothing, and a policy's first request comes too late (a replica next to running
// peers would route its first requests alone, GET /kvroute/ would show no engine reading until
// traffic flows). Caddy starts the apps of a config, and only of a config it runs. A policy
// loads the app with ctx.App("kvroute"): Caddy instantiates an app absent from the JSON config
// with an empty config and starts it with the others, so no config needs to name it.
//
// Caddy starts apps in map order, so the http app may serve before this one starts: the first
// decisions wait for it (state.ready), bounded by firstDecisionWait.
type App struct {
	config <-chan struct{} // the Done channel of its config's context (registration.config)
	state  *state          // set by the policies of its config (attach); nil: none
}

// CaddyModule returns the Caddy module information.
func (*App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "kvroute",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision remembers which config the app belongs to.
func (a *App) Provision(ctx caddy.Context) error {
	a.config = ctx.Done()
	return nil
}

// Start puts the config's process-wide options in force and starts the background work. It
// never waits on the network.
func (a *App) Start() error {
	if a.state != nil {
		a.state.start(a.config)
	}
	return nil
}

// Stop does nothing: the state outlives configs (a reload keeps what it learned); its
// background work stops when the last policy lets go of it (state.Destruct).
func (a *App) Stop() error { return nil }

// attach is how a policy of the app's config hands it the state.
func (a *App) attach(s *state) { a.state = s }

// loadApp returns the kvroute app of ctx's config, loading it if needed; nil when ctx belongs
// to no config. caddy.Context gives no other way to tell: ctx.App dereferences the config, and
// a Context built by hand (Go tests that provision a policy without Caddy) has none. Such a
// policy starts the background work on its first decision instead, without waiting.
func loadApp(ctx caddy.Context) (app *App, err error) {
	defer func() {
		if recover() != nil {
			app, err = nil, nil
		}
	}()
	v, err := ctx.App("kvroute")
	if err != nil {
		return nil, err
	}
	a, ok := v.(*App)
	if !ok {
		return nil, nil
	}
	return a, nil
}

// Interface guards.
var (
	_ caddy.App         = (*App)(nil)
	_ caddy.Provisioner = (*App)(nil)
)
