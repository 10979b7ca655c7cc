package kvroute

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

func TestMain(m *testing.M) {
	// caddytest looks for its test certificates next to its source, which -trimpath (xcaddy,
	// some CI setups) hides; its tests would then skip silently. These tests need no TLS.
	caddytest.Default.Certificates = nil
	// The in-process Caddy's admin API on this run's free port (ports_test.go), not on 2999,
	// where another run's Caddy would take this run's configs.
	caddytest.Default.AdminPort = adminPort
	// Its storage (the local CA of a TLS site, locks) and autosaved config in a directory of
	// this run's, not the user's: two runs then share no file either. Caddy computed both
	// paths when it was initialised, before TestMain: set them, not only the environment.
	dir, err := os.MkdirTemp("", "kvroute-test-caddy-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvroute tests:", err)
		os.Exit(1)
	}
	os.Setenv("XDG_DATA_HOME", dir)
	os.Setenv("XDG_CONFIG_HOME", dir)
	caddy.DefaultStorage.Path = filepath.Join(dir, "caddy")
	caddy.ConfigAutosavePath = filepath.Join(dir, "autosave.json")
	redirectCaddyLog()
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// testSecret is a cookie secret long enough to be accepted (16 bytes or more).
const testSecret = "test-secret-0123456789"
