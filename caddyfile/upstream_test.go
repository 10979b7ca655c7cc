package caddyfile

import (
	"reflect"
	"strings"
	"testing"

	cf "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/kvroute/caddy-kvroute/energy"
)

func mustJoules(t testing.TB, s string) energy.Joules {
	t.Helper()
	j, err := energy.ParseJoules(s)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func parseUpstreamText(text string) (string, energy.Profile, error) {
	d := cf.NewTestDispenser(text)
	d.Next() // the caller's loop leaves d on the directive
	return ParseUpstream(d)
}

func TestParseUpstream(t *testing.T) {
	tests := []struct {
		name string
		in   string
		addr string
		want energy.Profile
	}{
		{
			name: "every option",
			in: `upstream 10.0.0.1:8000 {
				accelerator              gpu      # comments are fine
				models                   llama-3.1-8b qwen2.5-7b "meta-llama/*"
				max_concurrency          64
				energy_per_token         150uJ
				prefill_energy_per_token 20µJ
				carbon_intensity         56
				zone                     EU-FR
				kv_capacity              2M
				prefill_tokens_per_second 12000
				metrics_url              http://10.0.0.1:9090/metrics
				continuous_batching
				paged_kv
			}`,
			addr: "10.0.0.1:8000",
			want: energy.Profile{
				Accelerator:            energy.GPU,
				Models:                 []string{"llama-3.1-8b", "qwen2.5-7b", "meta-llama/*"},
				MaxConcurrency:         64,
				EnergyPerToken:         mustJoules(t, "150uJ"),
				PrefillEnergyPerToken:  mustJoules(t, "20uJ"),
				CarbonIntensity:        56,
				Zone:                   "EU-FR",
				KVCapacity:             2_000_000,
				PrefillTokensPerSecond: 12000,
				MetricsURL:             "http://10.0.0.1:9090/metrics",
				ContinuousBatching:     true,
				PagedKV:                true,
			},
		},
		{name: "no block", in: "upstream 10.0.0.1:8000", addr: "10.0.0.1:8000"},
		{name: "empty block", in: "upstream 10.0.0.1:8000 {\n}", addr: "10.0.0.1:8000"},
		{name: "IPv6", in: "upstream [::1]:8000 {\n\tkv_capacity 512Ki\n}", addr: "[::1]:8000", want: energy.Profile{KVCapacity: 512 << 10}},
		{name: "host name", in: "upstream vllm-0.svc:80 {\n\tmodels *\n}", addr: "vllm-0.svc:80", want: energy.Profile{Models: []string{"*"}}},
		{name: "placeholder", in: "upstream {env.VLLM_ADDR} {\n\tzone us-west\n}", addr: "{env.VLLM_ADDR}", want: energy.Profile{Zone: "us-west"}},
		{name: "unix socket", in: "upstream unix//run/llm.sock {\n\taccelerator cpu\n}", addr: "unix//run/llm.sock", want: energy.Profile{Accelerator: energy.CPU}},
		{name: "fractional carbon", in: "upstream a:1 {\n\tcarbon_intensity 12.5\n}", addr: "a:1", want: energy.Profile{CarbonIntensity: 12.5}},
	}
	for _, tt := range tests {
		addr, p, err := parseUpstreamText(tt.in)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if addr != tt.addr || !reflect.DeepEqual(p, tt.want) {
			t.Errorf("%s: got %q %+v, want %q %+v", tt.name, addr, p, tt.addr, tt.want)
		}
	}
}

func TestParseUpstreamErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string // substrings of the error, with the file:line
	}{
		{"missing address", "upstream {\n}", []string{"upstream: missing address", "Testfile:1"}},
		{"missing address, no block", "upstream", []string{"missing address", "Testfile:1"}},
		{"two addresses", "upstream a:1 b:2", []string{`unexpected argument "b:2"`, "Testfile:1"}},
		{"no port", "upstream 10.0.0.1 {\n}", []string{`invalid address "10.0.0.1": want host:port`, "Testfile:1"}},
		{"scheme", "upstream http://10.0.0.1:8000", []string{"without a scheme", "Testfile:1"}},
		{"bad port", "upstream a:http", []string{"port must be 1-65535", "Testfile:1"}},
		{"port 0", "upstream a:0", []string{"port must be 1-65535"}},
		{"port range", "upstream a:8000-8003", []string{"port must be 1-65535"}},
		{"port too large", "upstream a:70000", []string{"port must be 1-65535"}},
		{"bare unix", "upstream unix/", []string{"missing socket path"}},
		{"unknown option", "upstream a:1 {\n\tacelerator gpu\n}", []string{`upstream a:1: unknown option "acelerator"`, "accelerator, models", "Testfile:2"}},
		{"duplicate", "upstream a:1 {\n\tzone a\n\tzone b\n}", []string{"upstream a:1: zone: duplicate option", "Testfile:3"}},
		{"accelerator value", "upstream a:1 {\n\taccelerator fpga\n}", []string{`accelerator: unknown accelerator "fpga"`, "Testfile:2"}},
		{"accelerator args", "upstream a:1 {\n\taccelerator gpu cpu\n}", []string{"accelerator: want 1 argument, got 2", "Testfile:2"}},
		{"models none", "upstream a:1 {\n\tmodels\n}", []string{"models: want at least 1", "Testfile:2"}},
		{"models block", "upstream a:1 {\n\tmodels x {\n\t\ty\n\t}\n}", []string{"models: unexpected block", "Testfile:2"}},
		{"max_concurrency zero", "upstream a:1 {\n\tmax_concurrency 0\n}", []string{"max_concurrency: must be >= 1", "Testfile:2"}},
		{"max_concurrency text", "upstream a:1 {\n\n\tmax_concurrency many\n}", []string{`max_concurrency: invalid integer "many"`, "Testfile:3"}},
		{"max_concurrency missing", "upstream a:1 {\n\tmax_concurrency\n}", []string{"max_concurrency: want 1 argument, got 0", "Testfile:2"}},
		{"energy no unit", "upstream a:1 {\n\tenergy_per_token 150\n}", []string{"upstream a:1: energy_per_token:", "missing unit", "Testfile:2"}},
		{"energy zero", "upstream a:1 {\n\tenergy_per_token 0J\n}", []string{"energy_per_token:", "greater than zero", "Testfile:2"}},
		{"energy negative", "upstream a:1 {\n\tenergy_per_token -5uJ\n}", []string{"energy_per_token:", "Testfile:2"}},
		{"prefill", "upstream a:1 {\n\tprefill_energy_per_token 20kJ\n}", []string{"prefill_energy_per_token:", `unknown unit "kJ"`, "Testfile:2"}},
		{"carbon zero", "upstream a:1 {\n\tcarbon_intensity 0\n}", []string{"carbon_intensity: must be > 0", "Testfile:2"}},
		{"carbon negative", "upstream a:1 {\n\tcarbon_intensity -4\n}", []string{"carbon_intensity: must be > 0", "Testfile:2"}},
		{"carbon NaN", "upstream a:1 {\n\tcarbon_intensity NaN\n}", []string{"carbon_intensity: invalid number", "Testfile:2"}},
		{"zone missing", "upstream a:1 {\n\tzone\n}", []string{"zone: want 1 argument, got 0", "Testfile:2"}},
		{"kv_capacity suffix", "upstream a:1 {\n\tkv_capacity 2X\n}", []string{"kv_capacity: invalid size", "Testfile:2"}},
		{"kv_capacity zero", "upstream a:1 {\n\tkv_capacity 0\n}", []string{"kv_capacity: must be >= 1", "Testfile:2"}},
		{"prefill speed zero", "upstream a:1 {\n\tprefill_tokens_per_second 0\n}", []string{"prefill_tokens_per_second: must be a finite number of tokens per second > 0", "Testfile:2"}},
		{"prefill speed negative", "upstream a:1 {\n\tprefill_tokens_per_second -3\n}", []string{"prefill_tokens_per_second: must be", "Testfile:2"}},
		{"prefill speed word", "upstream a:1 {\n\tprefill_tokens_per_second fast\n}", []string{"prefill_tokens_per_second: invalid number", "Testfile:2"}},
		{"metrics_url scheme", "upstream a:1 {\n\tmetrics_url unix:///x.sock\n}", []string{"metrics_url: bad URL", "Testfile:2"}},
		{"metrics_url host", "upstream a:1 {\n\tmetrics_url http:///metrics\n}", []string{"metrics_url: bad URL", "Testfile:2"}},
		{"flag with argument", "upstream a:1 {\n\tpaged_kv true\n}", []string{`paged_kv: takes no argument, got "true"`, "Testfile:2"}},
		{"flag with block", "upstream a:1 {\n\tcontinuous_batching {\n\t\tx\n\t}\n}", []string{"continuous_batching: unexpected block", "Testfile:2"}},
		{"nested upstream", "upstream a:1 {\n\tupstream b:2\n}", []string{`unknown option "upstream"`, "Testfile:2"}},
	}
	for _, tt := range tests {
		_, _, err := parseUpstreamText(tt.in)
		if err == nil {
			t.Errorf("%s: no error", tt.name)
			continue
		}
		for _, want := range tt.want {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q does not contain %q", tt.name, err, want)
			}
		}
	}
}

// TestParseUpstreamInPolicyBlock checks the position contract: upstream
// blocks parsed from a policy's NextBlock loop leave it on track.
func TestParseUpstreamInPolicyBlock(t *testing.T) {
	d := cf.NewTestDispenser(`lb_policy kv_cache_aware {
		cache_threshold 0.3
		upstream 10.0.0.1:8000 {
			energy_per_token 150uJ
			paged_kv
		}
		upstream 10.0.0.2:8000
		max_tree_size 64Mi
		upstream 10.0.0.3:8000 {
		}
		fallback carbon
	}`)
	var (
		upstreams = map[string]energy.Profile{}
		order     []string
		threshold float64
		treeSize  int64
		fallback  string
	)
	for d.Next() {
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			var err error
			switch d.Val() {
			case "cache_threshold":
				threshold, err = FloatArg(d)
			case "max_tree_size":
				treeSize, err = SizeArg(d)
			case "fallback":
				fallback, err = StringArg(d)
			case "upstream":
				var addr string
				var p energy.Profile
				addr, p, err = ParseUpstream(d)
				upstreams[addr] = p
				order = append(order, addr)
			default:
				err = d.Errf("unknown option %q", d.Val())
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if threshold != 0.3 || treeSize != 64<<20 || fallback != "carbon" {
		t.Errorf("options: %v %v %q", threshold, treeSize, fallback)
	}
	if want := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}; !reflect.DeepEqual(order, want) {
		t.Errorf("upstreams %v, want %v", order, want)
	}
	if p := upstreams["10.0.0.1:8000"]; p.EnergyPerToken != mustJoules(t, "150uJ") || !p.PagedKV {
		t.Errorf("first upstream = %+v", p)
	}
}

func TestParseUpstreamNotOnDirective(t *testing.T) {
	d := cf.NewTestDispenser("upstream a:1")
	if _, _, err := ParseUpstream(d); err == nil {
		t.Error("ParseUpstream on a fresh dispenser succeeded, want error")
	}
}

func FuzzParseUpstream(f *testing.F) {
	for _, s := range []string{
		"upstream 10.0.0.1:8000 {\n\taccelerator gpu\n\tmodels a b*\n\tmax_concurrency 64\n\tenergy_per_token 150uJ\n\tprefill_energy_per_token 20uJ\n\tcarbon_intensity 56\n\tzone EU-FR\n\tkv_capacity 2M\n\tcontinuous_batching\n\tpaged_kv\n}",
		"upstream a:1",
		"upstream a:1 {\n}",
		"upstream a:1 {\n\tmodels x {\n\t\ty\n\t}\n}",
		"upstream a:1 { }",
		"upstream {\n}",
		"upstream a:1 {\n\tzone a\n\tzone b\n}",
		"upstream [::1]:80 {\n\tkv_capacity 8Ei\n}",
		"upstream a:1 {\n\tpaged_kv {\n\t}\n}",
		"upstream a:1 {\n\tenergy_per_token \"1 uJ\"\n}\nnext 1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		tokens, err := cf.Tokenize([]byte(text), "Fuzzfile")
		if err != nil {
			return
		}
		d := cf.NewDispenser(tokens)
		if !d.Next() {
			return
		}
		addr, p, err := ParseUpstream(d)
		if err != nil {
			if !strings.Contains(err.Error(), "Fuzzfile:") {
				t.Fatalf("error without file:line: %v", err)
			}
			return
		}
		if addr == "" {
			t.Fatalf("empty address accepted from %q", text)
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("accepted an invalid profile from %q: %v", text, err)
		}
	})
}
