package kvroute

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

// Each option is checked once (options.go), from the Caddyfile (with file:line) and from JSON
// (at provision), with the same message.
func TestOptionChecksShared(t *testing.T) {
	for _, tt := range []struct {
		caddyfile, json, want string
	}{
		{"eviction_interval 1ns", `{"eviction_interval": 1}`, "eviction_interval: must be at least 1s"},
		{"session_ttl 10ms", `{"session_ttl": "10ms"}`, "session_ttl: must be at least 1s"},
		{"cache_threshold 2", `{"cache_threshold": 2}`, "cache_threshold: must be between 0 and 1"},
		{"balance_rel_threshold 0.5", `{"balance_rel_threshold": 0.5}`, "balance_rel_threshold: must be a finite number >= 1"},
		{"balance_abs_threshold -1", `{"balance_abs_threshold": -1}`, "balance_abs_threshold: must be >= 0"},
		{"on_imbalance sideways", `{"on_imbalance": "sideways"}`, "on_imbalance: must be prefix_in_band or least_busy"},
		{"max_sessions -5", `{"max_sessions": -5}`, "max_sessions: must be positive"},
		{"session_header \"X Session\"", `{"session_header": "X Session"}`, "session_header: \"X Session\" is not a valid HTTP header name"},
		{"session_cookie kv:session", `{"session_cookie": {"name": "kv:session"}}`, "session_cookie: invalid cookie name"},
		{"fallback cheapest", `{"fallback": "cheapest"}`, "fallback: unknown placement strategy"},
		{"decision cheapest", `{"decision": "cheapest"}`, "decision: must be cost or thresholds"},
		{"objective speed", `{"objective": "speed"}`, "objective: must be latency, completion, energy or carbon"},
		{"ttft_slack -0.1", `{"ttft_slack": -0.1}`, "ttft_slack: must be a fraction between 0 and 100"},
		{"ttft_slack 1000", `{"ttft_slack": 1000}`, "ttft_slack: must be a fraction between 0 and 100"},
		{"explain_header \"X Why\"", `{"explain_header": "X Why"}`, "explain_header: \"X Why\" is not a valid HTTP header name"},
		{"queue_timeout -1s", `{"queue_timeout": "-1s"}`, "queue_timeout: must be >= 0"},
	} {
		d := caddyfile.NewTestDispenser("kv_cache_aware {\n" + tt.caddyfile + "\n}")
		err := new(KVCacheAware).UnmarshalCaddyfile(d)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "Testfile:2") {
			t.Errorf("Caddyfile %q: got %v, want %q at Testfile:2", tt.caddyfile, err, tt.want)
		}
		var p KVCacheAware
		if err := json.Unmarshal([]byte(tt.json), &p); err != nil {
			t.Fatalf("%s: %v", tt.json, err)
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err = p.Provision(ctx)
		cancel()
		if err == nil {
			_ = p.Cleanup()
		}
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("JSON %s: got %v, want %q", tt.json, err, tt.want)
		}
		if err := p.Validate(); err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("JSON %s: Validate() = %v, want %q", tt.json, err, tt.want)
		}
	}
}

// A mistyped option name gets the nearest option suggested.
func TestOptionDidYouMean(t *testing.T) {
	d := caddyfile.NewTestDispenser("kv_cache_aware {\ncache_treshold 0.2\n}")
	err := new(KVCacheAware).UnmarshalCaddyfile(d)
	if err == nil || !strings.Contains(err.Error(), `did you mean "cache_threshold"?`) || !strings.Contains(err.Error(), "Testfile:2") {
		t.Errorf("got %v", err)
	}
	d = caddyfile.NewTestDispenser("kv_cache_aware {\nfrobnicate 1\n}")
	if err := new(KVCacheAware).UnmarshalCaddyfile(d); err == nil || !strings.Contains(err.Error(), "options: cache_threshold") {
		t.Errorf("got %v", err)
	}
}

// A mistyped option of the matcher gets the nearest option suggested too, with file:line,
// through the adapter a user's Caddyfile goes through.
func TestMatcherOptionDidYouMean(t *testing.T) {
	const cfg = `:8080 {
	@llm llm_prompt {
		modle llama-3
	}
	reverse_proxy @llm 127.0.0.1:9001
}
`
	ad := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
	_, _, err := ad.Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err == nil || !strings.Contains(err.Error(), `did you mean "model"?`) || !strings.Contains(err.Error(), "Caddyfile:3") {
		t.Errorf("got %v", err)
	}
	_, _, err = ad.Adapt([]byte(strings.Replace(cfg, "modle", "frobnicate", 1)), map[string]any{"filename": "Caddyfile"})
	if err == nil || !strings.Contains(err.Error(), "options: max_body, model") {
		t.Errorf("got %v", err)
	}
}

// Policies of one config share one state: they must agree on the process-wide options they
// give; a policy that leaves one out takes the config's value.
func TestProcessOptionsAgreeWithinAConfig(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	a := &KVCacheAware{MaxSessions: 500}
	if err := a.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer a.Cleanup()
	b := &KVCacheAware{} // leaves max_sessions out
	if err := b.Provision(ctx); err != nil {
		t.Fatalf("a policy leaving max_sessions out refused: %v", err)
	}
	defer b.Cleanup()
	a.state.ready(a.reg) // the config's first decision puts its options in force
	if got := a.state.sessions.max.Load(); got != 500 {
		t.Errorf("max_sessions in force %d, want the config's 500", got)
	}
	c := &KVCacheAware{MaxSessions: 600}
	if err := c.Provision(ctx); err == nil || !strings.HasPrefix(err.Error(), "max_sessions:") {
		t.Errorf("disagreeing max_sessions: got %v", err)
		_ = c.Cleanup()
	}
	// Another config (a reload) may change it.
	ctx2, cancel2 := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel2()
	d := &KVCacheAware{MaxSessions: 700}
	if err := d.Provision(ctx2); err != nil {
		t.Fatal(err)
	}
	defer d.Cleanup()
	a.state.ready(a.reg) // the old config's traffic leaves the newer config's options pending
	if got := a.state.sessions.max.Load(); got != 500 {
		t.Errorf("max_sessions in force %d after the old config routed, want its 500 still", got)
	}
	d.state.ready(d.reg)
	if got := a.state.sessions.max.Load(); got != 700 {
		t.Errorf("max_sessions in force %d after a newer config, want 700", got)
	}
}

// The same through Caddy: two servers of one config (Caddy gives each server a context of its
// own) must agree on max_sessions; a server that leaves it out takes the config's value.
func TestProcessOptionsAgreeAcrossServers(t *testing.T) {
	ps := newProbes(t, 2)
	startCaddy(t, relConfig(ps.addrs(), "", "", ""))
	twoServers := func(a, b string) string {
		return fmt.Sprintf(`{
	admin `+adminAddr+`
	http_port %[1]d
	https_port `+httpsPort+`
}
localhost:%[1]d {
	reverse_proxy %[2]s {
		lb_policy kv_cache_aware {
			%[3]s
		}
	}
}
localhost:%[4]d {
	reverse_proxy %[2]s {
		lb_policy kv_cache_aware {
			%[5]s
		}
	}
}
`, httpPort, strings.Join(ps.addrs(), " "), a, httpPort2, b)
	}
	resp, err := http.Post(adminURL+"/load", "text/caddyfile", strings.NewReader(twoServers("max_sessions 500", "max_sessions 600")))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK || !strings.Contains(string(body), "max_sessions") {
		t.Errorf("two servers disagreeing on max_sessions: %d %s", resp.StatusCode, body)
	}
	load(t, twoServers("max_sessions 500", ""))
	if s := currentState(); s == nil || s.sessions.max.Load() != 500 {
		t.Errorf("max_sessions in force: want the config's 500")
	}
}

// flow_control's errors name the option, the sub-option and the line it is on (Caddyfile),
// and the same check refuses the JSON form at provision.
func TestFlowControlChecks(t *testing.T) {
	for _, tt := range []struct {
		caddyfile string
		line      int
		json      string
		want      string
	}{
		{"flow_control {\nmax_queued 0\n}", 3, `{"flow_control": {"max_queued": -1}}`, "max_queued: must be positive"},
		{"flow_control {\nmax_queued_per_tenant -2\n}", 3, `{"flow_control": {"max_queued_per_tenant": -2}}`, "max_queued_per_tenant: must be positive"},
		{"flow_control {\noutput_weight -1\n}", 3, `{"flow_control": {"output_weight": -1}}`, "output_weight: must be a finite number >= 0"},
		{"flow_control {\nband a {\nqueue_timeout 1s\n}\nband a\n}", 6, `{"flow_control": {"bands": [{"name": "a"}, {"name": "a"}]}}`, "band a: given twice"},
		{"flow_control {\nband b {\nqueue_timeout -1s\n}\n}", 5, `{"flow_control": {"bands": [{"name": "b", "queue_timeout": "-1s"}]}}`, "band b: queue_timeout: must be >= 0"},
		{"flow_control {\ntenant {http.request.header.X\n}", 3, `{"flow_control": {"tenant": "{http.request.header.X"}}`, "tenant: unbalanced braces"},
	} {
		d := caddyfile.NewTestDispenser("kv_cache_aware {\n" + tt.caddyfile + "\n}")
		err := new(KVCacheAware).UnmarshalCaddyfile(d)
		at := fmt.Sprintf("Testfile:%d", tt.line)
		if err == nil || !strings.Contains(err.Error(), "flow_control: "+tt.want) || !strings.Contains(err.Error(), at) {
			t.Errorf("Caddyfile %q: got %v, want %q at %s", tt.caddyfile, err, "flow_control: "+tt.want, at)
		}
		var p KVCacheAware
		if err := json.Unmarshal([]byte(tt.json), &p); err != nil {
			t.Fatalf("%s: %v", tt.json, err)
		}
		if err := p.Validate(); err == nil || !strings.HasPrefix(err.Error(), "flow_control: "+tt.want) {
			t.Errorf("JSON %s: Validate() = %v, want %q", tt.json, err, "flow_control: "+tt.want)
		}
	}
	for _, ok := range []string{"flow_control", "flow_control {\n}", "flow_control {\ntenant {http.auth.user.id}\npriority {http.request.header.X-Priority}\nband interactive {\nqueue_timeout 10s\n}\nband batch {\nqueue_timeout 5m\n}\nmax_queued 10000\nmax_queued_per_tenant 1000\noutput_weight 2\n}\nqueue_timeout 0"} {
		d := caddyfile.NewTestDispenser("kv_cache_aware {\n" + ok + "\n}")
		if err := new(KVCacheAware).UnmarshalCaddyfile(d); err != nil {
			t.Errorf("Caddyfile %q: %v", ok, err)
		}
	}
}
