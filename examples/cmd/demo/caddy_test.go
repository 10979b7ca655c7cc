package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestCaddyfile(t *testing.T) {
	s := site{
		AdminPort: 2999, Port: 8080, Upstreams: []string{"127.0.0.1:8001", "127.0.0.1:8002"},
		Policy: allPolicies([]string{"cache_threshold 0.5", "balance_abs_threshold 8"})[0],
	}
	got := s.caddyfile()
	for _, want := range []string{
		"admin localhost:2999",
		":8080 {",
		"bind 127.0.0.1",
		"@llm llm_prompt",
		"reverse_proxy @llm 127.0.0.1:8001 127.0.0.1:8002 {",
		"lb_policy kv_cache_aware {\n\t\t\tcache_threshold 0.5\n\t\t\tbalance_abs_threshold 8\n\t\t}",
		"header_down X-Kvsim-Worker {http.reverse_proxy.upstream.hostport}",
		"\treverse_proxy 127.0.0.1:8001 127.0.0.1:8002\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Caddyfile lacks %q:\n%s", want, got)
		}
	}

	s.Policy.Block = upstreamLines(s.Upstreams, 4096, nil)
	if got := s.caddyfile(); !strings.Contains(got, "lb_policy kv_cache_aware {\n\t\t\tupstream 127.0.0.1:8001 {\n\t\t\t\tkv_capacity 4096\n\t\t\t}\n\t\t\tupstream 127.0.0.1:8002 {\n\t\t\t\tkv_capacity 4096\n\t\t\t}\n\t\t}") {
		t.Errorf("kv_capacity annotations:\n%s", got)
	}

	s.Policy, s.NoMatcher = policy{Name: "round_robin", Module: "round_robin"}, true
	got = s.caddyfile()
	if strings.Contains(got, "llm_prompt") || !strings.Contains(got, "reverse_proxy 127.0.0.1:8001 127.0.0.1:8002 {\n\t\tlb_policy round_robin\n") {
		t.Errorf("no-matcher Caddyfile:\n%s", got)
	}
}

// TestCaddyfileAdapts runs `caddy adapt --validate` on the Caddyfile of every policy the binary
// in KVROUTE_CADDY has (./xcaddy.sh test sets it), and checks that the policy and the matcher
// made it into the JSON.
func TestCaddyfileAdapts(t *testing.T) {
	path := os.Getenv("KVROUTE_CADDY")
	if path == "" {
		t.Skip("KVROUTE_CADDY not set: no Caddy binary to adapt with")
	}
	bin, err := newCaddyBinary(path)
	if err != nil {
		t.Fatal(err)
	}
	tried := 0
	policies := allPolicies([]string{"cache_threshold 0.3", "balance_abs_threshold 8", "on_imbalance prefix_in_band"})
	if bin.has(moduleFeedback) { // -compare-feedback's twin
		policies = withFeedback(policies)
	}
	for _, p := range policies {
		if !bin.has(policyModulePrefix + p.Module) {
			continue
		}
		tried++
		t.Run(p.Name+strings.ReplaceAll(p.Suffix, " ", "_"), func(t *testing.T) {
			ups := []string{"127.0.0.1:8001", "127.0.0.1:8002"}
			wants := []string{`"policy":"` + p.Module + `"`, `"llm_prompt"`, `"X-Kvsim-Worker"`}
			if p.Module == "kv_cache_aware" { // as the demo runs it, with -kv-capacity
				p.Block = append(slices.Clone(p.Block), upstreamLines(ups, 4096, nil)...)
				wants = append(wants, `"upstreams":{"127.0.0.1:8001":{"kv_capacity":4096},"127.0.0.1:8002":{"kv_capacity":4096}}`)
			}
			s := site{AdminPort: 2999, Port: 8080, Upstreams: ups, Policy: p}
			out, err := adapt(bin.path, s.caddyfile())
			if err != nil {
				t.Fatalf("%v\n%s", err, s.caddyfile())
			}
			if !json.Valid(out) {
				t.Fatalf("adapt output is not JSON: %s", out)
			}
			for _, want := range wants {
				if !bytes.Contains(out, []byte(want)) {
					t.Errorf("adapted JSON lacks %s: %s", want, out)
				}
			}
			// llm_feedback wraps the writer only when it runs ahead of the proxy.
			fb, rp := bytes.Index(out, []byte(`"handler":"llm_feedback"`)), bytes.Index(out, []byte(`"handler":"reverse_proxy"`))
			if p.Feedback != (fb >= 0) || (fb >= 0 && fb > rp) {
				t.Errorf("llm_feedback at %d, reverse_proxy at %d (want feedback %v, ahead): %s", fb, rp, p.Feedback, out)
			}
		})
	}
	if tried == 0 {
		t.Fatalf("%s has none of the demo's policies", path)
	}
}

// adapt runs `caddy adapt --validate` on a Caddyfile text and returns the JSON.
func adapt(bin, text string) ([]byte, error) {
	dir, err := os.MkdirTemp("", "kvroute-demo-adapt-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "adapt", "--config", file, "--adapter", "caddyfile", "--validate")
	cmd.Stderr = &stderr
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir)
	out, err := cmd.Output()
	if err != nil {
		return nil, &adaptError{err: err, stderr: stderr.String()}
	}
	return out, nil
}

type adaptError struct {
	err    error
	stderr string
}

func (e *adaptError) Error() string { return "caddy adapt: " + e.err.Error() + ": " + e.stderr }

func TestSelectPolicies(t *testing.T) {
	bin := &caddyBinary{modules: map[string]bool{moduleMatcher: true, moduleKV: true}}
	for _, m := range []string{"round_robin", "least_conn", "random", "header"} {
		bin.modules[policyModulePrefix+m] = true
	}
	cfg := &config{caddy: "caddy"}
	got, notes, err := selectPolicies(cfg, bin)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range got {
		names = append(names, p.Name)
	}
	if strings.Join(names, ",") != "kv_cache_aware,round_robin,least_conn,random,header" || len(notes) != 2 {
		t.Errorf("default policies = %v, notes %q", names, notes)
	}

	cfg.policies = "round_robin, kv_cache_aware"
	if got, _, err = selectPolicies(cfg, bin); err != nil || len(got) != 2 || got[0].Name != "round_robin" {
		t.Errorf("-policies %q = %v, %v", cfg.policies, got, err)
	}
	// kv_cache_aware by name is the policy itself, not a variant that shares its label.
	if len(got) == 2 && (got[1].Name != "kv_cache_aware" || got[1].Variant) {
		t.Errorf("-policies %q: kv_cache_aware ran as %s%s", cfg.policies, got[1].Name, got[1].Suffix)
	}
	for _, bad := range []string{"prefix_hash", "nope"} {
		cfg.policies = bad
		if _, _, err := selectPolicies(cfg, bin); err == nil {
			t.Errorf("-policies %s: no error", bad)
		}
	}
	// Lines after ":" go into the block, and name the policy apart from the one without.
	cfg.policies = "kv_cost, kv_cost:ttft_slack 1; balance_abs_threshold 2"
	got, _, err = selectPolicies(cfg, bin)
	if err != nil || len(got) != 2 {
		t.Fatalf("-policies %q = %v, %v", cfg.policies, got, err)
	}
	if g := got[1]; g.Name != "kv_cost:ttft_slack 1; balance_abs_threshold 2" || g.Name == got[0].Name ||
		strings.Join(g.Block, "|") != "decision cost|ttft_slack 1|balance_abs_threshold 2" ||
		g.title() != "kv_cache_aware (decision cost; ttft_slack 1; balance_abs_threshold 2)" {
		t.Errorf("-policies %q: second is %q, block %q, title %q", cfg.policies, g.Name, g.Block, g.title())
	}
	if strings.Join(got[0].Block, "|") != "decision cost" {
		t.Errorf("-policies %q: kv_cost's block became %q", cfg.policies, got[0].Block)
	}
	// A line that sets an option the block already sets replaces it (-kv-options', the
	// variant's own): Caddy refuses an option given twice.
	cfg.policies, cfg.kvOptions = "kv_cost:ttft_slack 1;objective completion", []string{"ttft_slack 2", "telemetry off"}
	if got, _, err = selectPolicies(cfg, bin); err != nil || len(got) != 1 ||
		strings.Join(got[0].Block, "|") != "ttft_slack 1|telemetry off|decision cost|objective completion" {
		t.Errorf("-policies %q with -kv-options %q: %v, %v", cfg.policies, cfg.kvOptions, got, err)
	}
	cfg.kvOptions = nil
	for _, bad := range []string{"least_conn:ttft_slack 1", "kv_cost:", "kv_cost:x 1,kv_cost:x 1", "kv_cost:x 1;y 2,kv_cost: x 1 ; y 2"} {
		cfg.policies = bad
		if _, _, err := selectPolicies(cfg, bin); err == nil {
			t.Errorf("-policies %q: no error", bad)
		}
	}
	cfg.policies = "none"
	if got, _, err = selectPolicies(cfg, bin); err != nil || len(got) != 0 {
		t.Errorf("-policies none = %v, %v", got, err)
	}
}
