package kvroute

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
)

// capturedEngine is a loopback vLLM whose /metrics serves a real capture and counts the GETs.
type capturedEngine struct {
	srv     *httptest.Server
	scrapes atomic.Int64
}

func newCapturedEngine(t *testing.T) *capturedEngine {
	t.Helper()
	page, err := os.ReadFile("telemetry/testdata/vllm_v1_qwen3.txt")
	if err != nil {
		t.Fatal(err)
	}
	e := &capturedEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			http.NotFound(w, r) // the readers' model list: not a request
			return
		}
		if r.URL.Path == "/metrics" {
			e.scrapes.Add(1)
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = w.Write(page)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[{"message":{"role":"assistant","content":"ok"}}]}`))
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *capturedEngine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

// lifecycleConfig proxies to the engine with telemetry on, and a cluster whose NATS URL is
// natsAddr when it is not empty.
func lifecycleConfig(adminPort, httpPort int, e *capturedEngine, natsAddr string) string {
	cl := ""
	if natsAddr != "" {
		cl = fmt.Sprintf("\n\t\t\tcluster nats://%s {\n\t\t\t\tname lifecycle\n\t\t\t\tsecret %s\n\t\t\t}", natsAddr, testClusterSecret)
	}
	return fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	log {
		level ERROR
	}
}
:%d {
	@llm llm_prompt
	reverse_proxy @llm %s {
		lb_policy kv_cache_aware {
			telemetry {
				interval 200ms
				timeout 150ms
			}%s
		}
	}
}
`, adminPort, httpPort, httpPort, e.addr(), cl)
}

// Telemetry starts with the config, not with the first request: GET /kvroute/ shows the
// engine's reading while no request was ever sent.
func TestBinaryTelemetryReadsBeforeTraffic(t *testing.T) {
	e := newCapturedEngine(t)
	adminPort, httpPort := freePort(t), freePort(t)
	c := startBinary(t, lifecycleConfig(adminPort, httpPort, e, ""), adminPort)
	var last []byte
	ok := false
	deadline := time.Now().Add(10 * time.Second)
	for !ok && time.Now().Before(deadline) {
		code, body := c.adminDo(http.MethodGet, "/kvroute/", "", nil)
		last = body
		var st Status
		if code == http.StatusOK && json.Unmarshal(body, &st) == nil {
			if us, found := st.Upstreams[e.addr()]; found && us.Telemetry != nil && us.Telemetry.ReadAt != nil {
				ok = us.Telemetry.Engine == telemetry.EngineVLLM && us.Telemetry.Outcome == "ok"
			}
		}
		if !ok {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !ok {
		t.Fatalf("no engine reading in GET /kvroute/ 10s after start without traffic (%d scrapes): %s", e.scrapes.Load(), last)
	}
}

// caddy validate provisions the config and starts nothing: the engine sees no metrics read and
// the NATS address no connection.
func TestBinaryValidateStartsNothing(t *testing.T) {
	bin := caddyBinary(t)
	e := newCapturedEngine(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns atomic.Int64
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			conn.Close()
		}
	}()
	dir := t.TempDir()
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(lifecycleConfig(freePort(t), freePort(t), e, ln.Addr().String())), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "validate", "--config", path)
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "Valid configuration") {
		t.Fatalf("caddy validate: %v\n%s", err, out)
	}
	if n := e.scrapes.Load(); n != 0 {
		t.Errorf("caddy validate read the engine's metrics %d times", n)
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("caddy validate connected to the NATS address %d times", n)
	}
}
