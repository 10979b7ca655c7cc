package kvroute

import (
	"os"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

func TestMain(m *testing.M) {
	// caddytest looks for its test certificates next to its source, which -trimpath (xcaddy,
	// some CI setups) hides; its tests would then skip silently. These tests need no TLS.
	caddytest.Default.Certificates = nil
	redirectCaddyLog()
	os.Exit(m.Run())
}

// testSecret is a cookie secret long enough to be accepted (16 bytes or more).
const testSecret = "test-secret-0123456789"
