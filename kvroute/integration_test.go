package kvroute

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
)

// proxyConfig is a Caddyfile with the llm_prompt matcher and kv_cache_aware in front of f;
// policy is the body of the lb_policy block, extra goes into the reverse_proxy block.
func proxyConfig(f fleet, matcher, policy, extra string) string {
	return fmt.Sprintf(`{
	admin `+adminAddr+`
	http_port %d
	https_port `+httpsPort+`
	grace_period 1s
}
localhost:%d {
	@llm llm_prompt {
		%s
	}
	reverse_proxy @llm %s {
		lb_policy kv_cache_aware {
			%s
		}
		%s
	}
	reverse_proxy %s
}
`, httpPort, httpPort, matcher, f.addrs(), policy, extra, f.addrs())
}

func TestIntegrationPrefixAffinityAcrossTurns(t *testing.T) {
	f := newFleet(t, 4)
	startCaddy(t, proxyConfig(f, "", "", ""))
	client := &http.Client{Timeout: 10 * time.Second}
	systems := []string{
		strings.Repeat("You are a terse travel agent. ", 60),
		strings.Repeat("You are a patient math tutor. ", 60),
	}
	type conv struct {
		sys  string
		msgs []string
		home string
	}
	var convs []*conv
	for i := 0; i < 6; i++ {
		convs = append(convs, &conv{sys: systems[i%2], msgs: []string{fmt.Sprintf("question %d: %s", i, strings.Repeat("why? ", 20))}})
	}
	for turn := 0; turn < 4; turn++ {
		for i, c := range convs {
			rep, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", append([]string{c.sys}, c.msgs...)...))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("conversation %d turn %d: status %d", i, turn, resp.StatusCode)
			}
			if turn == 0 {
				c.home = rep.Upstream
			} else if rep.Upstream != c.home {
				t.Errorf("conversation %d turn %d served by %s, its first turn by %s", i, turn, rep.Upstream, c.home)
			}
			c.msgs = append(c.msgs, "answer "+strings.Repeat("because. ", 30), fmt.Sprintf("follow-up %d", turn))
		}
	}
}

func TestIntegrationModelTreesApart(t *testing.T) {
	f := newFleet(t, 3)
	startCaddy(t, proxyConfig(f, "", "", ""))
	client := &http.Client{Timeout: 10 * time.Second}
	prompt := strings.Repeat("the same words for two models ", 40)
	send(t, client, baseURL+"/v1/chat/completions", chatBody("model-a", prompt))
	st := currentState()
	hitsBefore := metricsDecisions(st, pathPrefixHit)
	send(t, client, baseURL+"/v1/chat/completions", chatBody("model-b", prompt))
	if got := metricsDecisions(st, pathPrefixHit); got != hitsBefore {
		t.Errorf("a request for model-b was a prefix hit on model-a's tree")
	}
	send(t, client, baseURL+"/v1/chat/completions", chatBody("model-a", prompt+" more"))
	if got := metricsDecisions(st, pathPrefixHit); got != hitsBefore+1 {
		t.Errorf("model-a's second request was not a prefix hit (%d → %d)", hitsBefore, got)
	}
	if st.forest.Get("model-a") == nil || st.forest.Get("model-b") == nil {
		t.Errorf("want a tree per model, have %v", st.forest.Names())
	}
}

// Model names are client input: after more junk model names than there may be trees, a real
// model still gets a tree of its own (the least recently used junk trees go), and one in use
// keeps its tree and its prefixes through the flood.
func TestIntegrationJunkModelsAgeOut(t *testing.T) {
	f := newFleet(t, 2)
	startCaddy(t, proxyConfig(f, "", "", ""))
	st := currentState()
	st.reset()
	t.Cleanup(st.reset)
	client := &http.Client{Timeout: 10 * time.Second}
	prompt := strings.Repeat("a real system prompt, long enough to be a prefix match ", 4)
	send(t, client, baseURL+"/v1/chat/completions", chatBody("real-a", prompt))
	for i := range maxTrees + 100 {
		send(t, client, baseURL+"/v1/chat/completions", chatBody(fmt.Sprintf("junk-%d", i), "hi"))
		if i%200 == 0 { // real-a is in use during the flood
			send(t, client, baseURL+"/v1/chat/completions", chatBody("real-a", prompt+fmt.Sprint(i)))
		}
	}
	if n := st.forest.Len(); n > maxTrees {
		t.Errorf("%d trees, bound %d", n, maxTrees)
	}
	if st.forest.Get("junk-0") != nil {
		t.Errorf("the oldest junk tree is still there")
	}
	if st.forest.Get("real-a") == nil {
		t.Fatalf("the model in use lost its tree")
	}
	hits := metricsDecisions(st, pathPrefixHit)
	send(t, client, baseURL+"/v1/chat/completions", chatBody("real-a", prompt+" next turn"))
	if metricsDecisions(st, pathPrefixHit) != hits+1 {
		t.Errorf("the model in use lost its prefixes")
	}
	// A model new after the flood gets its own tree, not one shared with every later model.
	send(t, client, baseURL+"/v1/chat/completions", chatBody("real-b", prompt))
	if tr := st.forest.Get("real-b"); tr == nil || tr.Chars() == 0 {
		t.Errorf("a new model after the flood has no tree of its own; trees: %d", st.forest.Len())
	}
}

// metricsDecisions sums a decision path's counts over all upstreams.
func metricsDecisions(s *state, path int) uint64 {
	var n uint64
	s.upstreams.Range(func(_, v any) bool {
		n += v.(*upstreamState).decisions[path].Load()
		return true
	})
	return n
}

func TestIntegrationImbalanceGoesLeastBusy(t *testing.T) {
	f := newFleet(t, 3)
	startCaddy(t, proxyConfig(f, "", "balance_abs_threshold 2\nbalance_rel_threshold 1.5", ""))
	client := &http.Client{Timeout: 20 * time.Second}
	prompt := strings.Repeat("a prefix everybody shares ", 40)
	rep, _ := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", prompt))
	home := f.byName(rep.Upstream)
	home.setHang(true)
	done := make(chan struct{})
	for i := 0; i < 3; i++ {
		go func(i int) {
			defer func() { done <- struct{}{} }()
			send(t, client, baseURL+"/v1/chat/completions", chatBody("m", prompt, fmt.Sprintf("hanging %d", i)))
		}(i)
		want := int64(i + 1)
		waitUntil(t, 5*time.Second, func() bool { return home.active.Load() == want }, "requests hanging on the prefix holder")
	}
	// 3 in flight on home, 0 elsewhere: 3-0 > 2 and 3 > 0×1.5.
	rep, _ = send(t, client, baseURL+"/v1/chat/completions", chatBody("m", prompt, "one more"))
	if rep.Upstream == home.name {
		t.Errorf("imbalanced load: request went to the busy prefix holder %s", home.name)
	}
	home.setHang(false)
	for i := 0; i < 3; i++ {
		<-done
	}
}

func TestIntegrationUnavailableUpstreamSkipped(t *testing.T) {
	f := newFleet(t, 2)
	startCaddy(t, proxyConfig(f, "", "", "health_uri /health\n\t\thealth_interval 50ms\n\t\thealth_fails 1\n\t\thealth_passes 1"))
	client := &http.Client{Timeout: 10 * time.Second}
	prompt := strings.Repeat("cached on one upstream ", 40)
	rep, _ := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", prompt))
	home := f.byName(rep.Upstream)
	home.setUnhealthy(true)
	// Caddy's checker takes home out as soon as it reads a failed check's answer (health_fails
	// 1); by the third failed check, two ticks later, it has read the first. (A fixed 300 ms
	// was too short for six ticks on a loaded machine.)
	failed := home.failedChecks()
	waitUntil(t, 10*time.Second, func() bool { return home.failedChecks() >= failed+3 }, "three failed health checks of "+home.name)
	for i := 0; i < 10; i++ {
		rep, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", prompt, fmt.Sprint(i)))
		if resp.StatusCode != http.StatusOK || rep.Upstream == home.name {
			t.Fatalf("request %d: status %d, upstream %s; %s is unhealthy", i, resp.StatusCode, rep.Upstream, home.name)
		}
	}
	// Once healthy again, it takes requests again (cold ones: the prefix now lives on the other
	// upstream too, which served it meanwhile).
	home.setUnhealthy(false)
	i := 0
	waitUntil(t, 20*time.Second, func() bool {
		i++
		rep, _ := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(i)))
		return rep.Upstream == home.name
	}, "the recovered upstream to take requests again")
}

func TestIntegrationBodyIntegrity(t *testing.T) {
	f := newFleet(t, 2)
	const maxBody = 64 << 10
	startCaddy(t, proxyConfig(f, fmt.Sprintf("max_body %d", maxBody), "", ""))
	client := &http.Client{Timeout: 30 * time.Second}
	random := func(n int) []byte {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		return b
	}
	chatOf := func(n int) []byte {
		body := chatBody("m", "system prompt", strings.Repeat("x", n))
		return []byte(body)
	}
	cases := []struct {
		name    string
		body    []byte
		chunked bool
	}{
		{"empty", nil, false},
		{"small chat", chatOf(100), false},
		{"chat just below max_body", padTo(t, chatOf(maxBody-200), maxBody-1), false},
		{"chat at max_body", padTo(t, chatOf(maxBody-200), maxBody), false},
		{"chat just above max_body", padTo(t, chatOf(maxBody-200), maxBody+1), false},
		{"chat above max_body", chatOf(maxBody * 3), false},
		{"large chat", chatOf(5 << 20), false},
		{"binary", random(3 * maxBody), false},
		{"chunked chat", chatOf(maxBody * 2), true},
		{"chunked binary", random(maxBody + 7), true},
		{"invalid utf-8 chat", append([]byte(`{"model":"m","messages":[{"role":"user","content":"`), append(random(1000), []byte(`"}]}`)...)...), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A chat case is the valid request its name says (a case that is not would test
			// another path of the matcher).
			if strings.Contains(tc.name, "chat") && !strings.Contains(tc.name, "invalid") && !json.Valid(tc.body) {
				t.Fatalf("the %q case is not valid JSON", tc.name)
			}
			var body io.Reader = bytes.NewReader(tc.body)
			if tc.chunked {
				body = io.MultiReader(bytes.NewReader(tc.body)) // hides the length: sent chunked
			}
			req, _ := http.NewRequest(http.MethodPost, baseURL+"/v1/chat/completions", body)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, raw)
			}
			sum := sha256.Sum256(tc.body)
			want := hex.EncodeToString(sum[:])
			if !strings.Contains(string(raw), want) || !strings.Contains(string(raw), fmt.Sprintf(`"len":%d`, len(tc.body))) {
				t.Errorf("upstream received a different body: reply %s, want sha256 %s len %d", raw, want, len(tc.body))
			}
		})
	}
}

// padTo pads the JSON object b with spaces before its final brace to n bytes; b must not be
// longer (cutting it would make it invalid JSON).
func padTo(t testing.TB, b []byte, n int) []byte {
	t.Helper()
	if len(b) > n {
		t.Fatalf("padTo: %d bytes, longer than %d", len(b), n)
	}
	if len(b) == n {
		return b
	}
	out := append([]byte{}, b[:len(b)-1]...)
	out = append(out, bytes.Repeat([]byte(" "), n-len(b))...)
	return append(out, '}')
}

func TestIntegrationJSONConfig(t *testing.T) {
	f := newFleet(t, 2)
	cfg := fmt.Sprintf(`{
	"admin": {"listen": %q},
	"apps": {"http": {"http_port": %d, "servers": {"srv0": {
		"listen": [":%d"],
		"routes": [{
			"match": [{"llm_prompt": {"max_body": 1048576, "model": ["m*"]}}],
			"handle": [{
				"handler": "reverse_proxy",
				"upstreams": [{"dial": %q}, {"dial": %q}],
				"load_balancing": {"selection_policy": {
					"policy": "kv_cache_aware",
					"cache_threshold": 0.5,
					"balance_abs_threshold": 8,
					"balance_rel_threshold": 2,
					"eviction_interval": "30s",
					"max_tree_size": 1000000,
					"session_header": "X-Conversation",
					"session_ttl": "10m",
					"max_sessions": 1000,
					"expected_tokens": 100,
					"fallback": "joule",
					"upstreams": {
						%q: {"accelerator": "gpu", "models": ["m1"], "energy_per_token": "200uJ", "max_concurrency": 4},
						%q: {"accelerator": "gpu", "models": ["m1"], "energy_per_token": "50uJ", "carbon_intensity": 56, "kv_capacity": 2000000}
					}
				}}
			}]
		}]
	}}}}
}`, adminAddr, httpPort, httpPort, f[0].addr(), f[1].addr(), f[0].addr(), f[1].addr())
	captureCaddyLog(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(cfg, "json")
	if t.Failed() {
		t.FailNow()
	}
	currentState().reset()
	client := &http.Client{Timeout: 10 * time.Second}
	for i := 0; i < 5; i++ {
		rep, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("m1", coldPrompt(i)))
		if resp.StatusCode != http.StatusOK || rep.Upstream != f[1].name {
			t.Fatalf("cold request %d: status %d upstream %q, want the 50µJ upstream %s", i, resp.StatusCode, rep.Upstream, f[1].name)
		}
	}
}

func TestIntegrationBadConfigNamesOptionAndLine(t *testing.T) {
	f := newFleet(t, 1)
	for _, tc := range []struct{ policy, want string }{
		{"cache_threshold 2", "cache_threshold"},
		{"balance_rel_threshold 0.5", "balance_rel_threshold"},
		{"fallback cheapest", "fallback"},
		{"decision cheapest", "decision"},
		{"ttft_slack lots", "ttft_slack"},
		{"objective speed", "objective"},
		{"max_tree_size lots", "max_tree_size"},
		{"no_such_option 1", "no_such_option"},
		{"upstream 127.0.0.1:1 {\n\t\t\t\tenergy_per_token 150\n\t\t\t}", "energy_per_token"},
	} {
		cfg := proxyConfig(f, "", tc.policy, "")
		_, _, err := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}.Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
		if err == nil {
			t.Errorf("%q: adapt succeeded, want an error", tc.policy)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "Caddyfile:1") {
			t.Errorf("%q: error %q should name %q and the file:line (Caddyfile:1x)", tc.policy, err, tc.want)
		}
	}
}

func TestAdaptExamples(t *testing.T) {
	files, _ := filepath.Glob("../examples/*Caddyfile*")
	more, _ := filepath.Glob("../examples/*/*Caddyfile*")
	files = append(files, more...)
	if len(files) == 0 {
		t.Fatal("no example Caddyfiles found under ../examples")
	}
	for _, fn := range files {
		body, err := os.ReadFile(fn)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := (caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}).Adapt(body, map[string]any{"filename": fn}); err != nil {
			t.Errorf("caddy adapt %s: %v", fn, err)
		}
	}
}
