package kvroute

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"testing"
)

// The in-process Caddy logs every config load, server start and stop as JSON on stderr: two
// thousand lines in a run of this package, in which a failure was hard to find. They go to a
// file instead, and a failing test prints the part written while it ran.
var (
	caddyLog     *os.File // nil when the log is left on stderr
	caddyLogSeen sync.Map // the tests that print their part of it when they fail
)

// caddyLogTail is how much of its part of the log a failing test prints at most: the end, where
// the failure is.
const caddyLogTail = 200

// redirectCaddyLog points os.Stderr, which Caddy's default logger opens at every config load
// that configures no log, at a file that is unlinked at once (nothing to clean up, even after a
// crash). The race detector and the runtime write to file descriptor 2 itself, so their reports
// stay on the terminal. KVROUTE_TEST_LOG=stderr leaves everything on stderr.
func redirectCaddyLog() {
	if os.Getenv("KVROUTE_TEST_LOG") == "stderr" {
		return
	}
	f, err := os.CreateTemp("", "kvroute-test-caddy-*.log")
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvroute tests: Caddy's log stays on stderr:", err)
		return
	}
	os.Remove(f.Name())
	caddyLog, os.Stderr = f, f
}

// captureCaddyLog makes t print, if it fails, what Caddy logged from now until it ends. Call it
// before starting a Caddy (startCaddy and leakCheck do): cleanups run last first, so it prints
// after the others, the leak check among them, have had their say.
func captureCaddyLog(t testing.TB) {
	if caddyLog == nil {
		return
	}
	if _, dup := caddyLogSeen.LoadOrStore(t, true); dup {
		return
	}
	start := caddyLogSize()
	t.Cleanup(func() {
		caddyLogSeen.Delete(t)
		if !t.Failed() {
			return
		}
		part := make([]byte, caddyLogSize()-start)
		n, _ := caddyLog.ReadAt(part, start)
		lines := bytes.SplitAfter(bytes.TrimSuffix(part[:n], []byte("\n")), []byte("\n"))
		if len(lines) == 1 && len(lines[0]) == 0 {
			return
		}
		cut := max(0, len(lines)-caddyLogTail)
		t.Logf("Caddy's log while the test ran (%d lines, the last %d):\n%s", len(lines), len(lines)-cut, bytes.Join(lines[cut:], nil))
	})
}

func caddyLogSize() int64 {
	fi, err := caddyLog.Stat()
	if err != nil {
		return 0
	}
	return fi.Size()
}
