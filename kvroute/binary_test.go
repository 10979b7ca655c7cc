package kvroute

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// caddyBinary returns the Caddy built by `./xcaddy.sh build` (KVROUTE_CADDY, which
// `./xcaddy.sh test` sets). Locally, without it, the test skips; in CI it must be there.
func caddyBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("KVROUTE_CADDY")
	if bin == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("KVROUTE_CADDY is not set: run the tests with ./xcaddy.sh test")
		}
		t.Skip("KVROUTE_CADDY not set; ./xcaddy.sh test builds Caddy and sets it")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("KVROUTE_CADDY=%s: %v", bin, err)
	}
	return bin
}

func TestBinaryModulesAndAdapt(t *testing.T) {
	bin := caddyBinary(t)
	out, err := exec.Command(bin, "list-modules").CombinedOutput()
	if err != nil {
		t.Fatalf("list-modules: %v\n%s", err, out)
	}
	for _, id := range []string{"http.reverse_proxy.selection_policies.kv_cache_aware", "http.matchers.llm_prompt", "admin.api.kvroute"} {
		if !strings.Contains(string(out), id) {
			t.Errorf("the built Caddy lacks module %s", id)
		}
	}
	files, _ := filepath.Glob("../examples/*Caddyfile*")
	more, _ := filepath.Glob("../examples/*/*Caddyfile*")
	for _, fn := range append(files, more...) {
		if out, err := exec.Command(bin, "adapt", "--config", fn).CombinedOutput(); err != nil {
			t.Errorf("caddy adapt --config %s: %v\n%s", fn, err, out)
		}
	}
}

// binCaddy runs the built Caddy with a Caddyfile and talks to it over its admin API.
type binCaddy struct {
	t       *testing.T
	bin     string
	cfgPath string
	admin   string
	cmd     *exec.Cmd
	out     *bytes.Buffer
}

func startBinary(t *testing.T, cfg string, adminPort int) *binCaddy {
	t.Helper()
	bin := caddyBinary(t)
	dir := t.TempDir()
	c := &binCaddy{t: t, bin: bin, cfgPath: filepath.Join(dir, "Caddyfile"), admin: fmt.Sprintf("localhost:%d", adminPort), out: new(bytes.Buffer)}
	if err := os.WriteFile(c.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(bin, "run", "--config", c.cfgPath)
	c.cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = c.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("caddy output:\n%s", c.out.String())
		}
	})
	waitUntil(t, 15*time.Second, func() bool {
		resp, err := http.Get("http://" + c.admin + "/config/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "caddy's admin API")
	return c
}

// adminDo sends a request to the admin API and returns the status and body.
func (c *binCaddy) adminDo(method, path, contentType string, body []byte) (int, []byte) {
	c.t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), method, "http://"+c.admin+path, bytes.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

func binaryConfig(adminPort, httpPort int, f fleet) string {
	return fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	metrics
}
:%d {
	@llm llm_prompt
	reverse_proxy @llm %s {
		lb_policy kv_cache_aware
	}
}
`, adminPort, httpPort, httpPort, f.addrs())
}

func TestBinaryAffinitySurvivesReloads(t *testing.T) {
	f := newFleet(t, 4)
	adminPort, httpPort := freePort(t), freePort(t)
	cfg := binaryConfig(adminPort, httpPort, f)
	c := startBinary(t, cfg, adminPort)
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", httpPort)
	client := &http.Client{Timeout: 10 * time.Second}
	sys := strings.Repeat("You are the assistant of a very long system prompt. ", 40)
	msgs := []string{sys, "first question"}
	rep, resp := send(t, client, url, chatBody("m", msgs...))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	home := rep.Upstream
	next := func(what string) {
		t.Helper()
		msgs = append(msgs, "an answer", "a question after "+what)
		rep, resp := send(t, client, url, chatBody("m", msgs...))
		if resp.StatusCode != http.StatusOK || rep.Upstream != home {
			t.Fatalf("after %s: status %d, upstream %s, want %s", what, resp.StatusCode, rep.Upstream, home)
		}
	}
	next("nothing")

	// POST /load with the same config, adapted by Caddy itself.
	if code, body := c.adminDo(http.MethodPost, "/load", "text/caddyfile", []byte(cfg)); code != http.StatusOK {
		t.Fatalf("POST /load: %d %s", code, body)
	}
	next("POST /load")

	// caddy reload.
	if out, err := exec.Command(c.bin, "reload", "--config", c.cfgPath, "--address", c.admin, "--force").CombinedOutput(); err != nil {
		t.Fatalf("caddy reload: %v\n%s", err, out)
	}
	next("caddy reload")

	// The admin API reports the state, and the metrics are served.
	code, body := c.adminDo(http.MethodGet, "/kvroute/", "", nil)
	if code != http.StatusOK {
		t.Fatalf("GET /kvroute/: %d %s", code, body)
	}
	var st Status
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("GET /kvroute/: %v in %s", err, body)
	}
	homeAddr := f.byName(home).addr()
	if !st.Loaded || st.Upstreams[homeAddr].TreeChars == 0 || st.Models["m"].TreeChars[homeAddr] == 0 {
		t.Errorf("GET /kvroute/ does not show the prefixes held by %s: %s", homeAddr, body)
	}
	if st.Upstreams[homeAddr].Decisions["prefix_hit"] < 3 {
		t.Errorf("want at least 3 prefix hits on %s, status %s", homeAddr, body)
	}
	code, body = c.adminDo(http.MethodGet, "/metrics", "", nil)
	if code != http.StatusOK || !strings.Contains(string(body), `caddy_kvroute_decisions_total{path="prefix_hit"}`) {
		t.Errorf("/metrics lacks caddy_kvroute_decisions_total: %d", code)
	}
}

// TestBinarySessionCookieSecret: what the built Caddy checks of a session_cookie secret, and
// when. `caddy adapt` translates: a {env.*} placeholder stays in the JSON it writes (the secret
// is never baked into it, and the JSON may be loaded where the variable is set), as Caddy's
// own {env.*} placeholders do; loading the config (`caddy validate`, as run and POST /load)
// resolves it and refuses one that resolves to nothing or to fewer than 16 bytes, naming the
// option. A {$VAR} the Caddyfile substitutes at adapt time and that is unset leaves an empty
// secret: adapt refuses it with the Caddyfile's line, rather than turning signing off.
func TestBinarySessionCookieSecret(t *testing.T) {
	bin := caddyBinary(t)
	const name = "KVROUTE_TEST_COOKIE_SECRET"
	dir := t.TempDir()
	caddyfile := func(secret string) string {
		fn := filepath.Join(dir, fmt.Sprintf("Caddyfile-%d", len(secret)))
		cfg := fmt.Sprintf(":0 {\n\treverse_proxy 127.0.0.1:9 {\n\t\tlb_policy kv_cache_aware {\n\t\t\tsession_cookie kvroute_session %s\n\t\t}\n\t}\n}\n", secret)
		if err := os.WriteFile(fn, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		return fn
	}
	caddy := func(value string, args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, name+"=") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		if value != "" {
			cmd.Env = append(cmd.Env, name+"="+value)
		}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	placeholder := caddyfile("{env." + name + "}")
	good := "0123456789abcdef0123456789abcdef"
	for _, value := range []string{"", good} {
		out, err := caddy(value, "adapt", "--config", placeholder)
		if err != nil || !strings.Contains(out, `{env.`+name+`}`) || (value != "" && strings.Contains(out, value)) {
			t.Errorf("adapt with %s=%q: %v, want exit 0 and the placeholder kept in the JSON:\n%s", name, value, err, out)
		}
	}
	if out, err := caddy("", "validate", "--config", placeholder); err == nil || !strings.Contains(out, "session_cookie") || !strings.Contains(out, "did not resolve") {
		t.Errorf("validate with %s unset: %v, want a refusal naming session_cookie:\n%s", name, err, out)
	}
	if out, err := caddy("short", "validate", "--config", placeholder); err == nil || !strings.Contains(out, "session_cookie") || !strings.Contains(out, "at least 16 bytes") {
		t.Errorf("validate with a 5-byte secret: %v, want a refusal naming session_cookie:\n%s", err, out)
	}
	if out, err := caddy(good, "validate", "--config", placeholder); err != nil {
		t.Errorf("validate with a 32-byte secret: %v\n%s", err, out)
	}
	substituted := caddyfile(`"{$` + name + `}"`)
	if out, err := caddy("", "adapt", "--config", substituted); err == nil || !strings.Contains(out, "session_cookie") || !strings.Contains(out, filepath.Base(substituted)+":4") {
		t.Errorf("adapt of a {$%s} that is unset: %v, want a refusal naming session_cookie and the line:\n%s", name, err, out)
	}
	if out, err := caddy(good, "adapt", "--config", substituted); err != nil {
		t.Errorf("adapt of a {$%s} that is set: %v\n%s", name, err, out)
	}
}
