package main

import (
	"bytes"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/kvroute/caddy-kvroute/examples/replay"
)

// TestEnergyFlag: -energy takes presets, PREFILL/DECODE or one energy for both, one per worker
// or one for all, and refuses what an operator could not write in an upstream block.
func TestEnergyFlag(t *testing.T) {
	cfg, err := parseFlags([]string{"-caddy", "x", "-energy", "h100, h100,A100,30mJ/0.2J"})
	if err != nil {
		t.Fatal(err)
	}
	want := []workerEnergy{{25e-3, 150e-3}, {25e-3, 150e-3}, {40e-3, 210e-3}, {30e-3, 0.2}}
	if len(cfg.energy) != 4 {
		t.Fatalf("energy %v", cfg.energy)
	}
	for i, e := range cfg.energy {
		if math.Abs(float64(e.Prefill-want[i].Prefill)) > 1e-12 || math.Abs(float64(e.Decode-want[i].Decode)) > 1e-12 {
			t.Errorf("w%d: %v, want %v", i, e, want[i])
		}
	}
	if got := strings.Join(cfg.params().Energy, ","); got != "25mJ/150mJ,25mJ/150mJ,40mJ/210mJ,30mJ/200mJ" {
		t.Errorf("params %s", got)
	}

	cfg, err = parseFlags([]string{"-caddy", "x", "-workers", "3", "-energy", "500uJ"})
	if err != nil || len(cfg.energy) != 3 || cfg.energy[2] != (workerEnergy{500e-6, 500e-6}) {
		t.Errorf("one for all: %v, %v", cfg.energy, err)
	}
	if cfg, err = parseFlags([]string{"-caddy", "x"}); err != nil || cfg.energy != nil {
		t.Errorf("no -energy: %v, %v", cfg.energy, err)
	}
	for _, bad := range []string{"h100,a100", "150", "25mJ/", "/150mJ", "25mJ/150", "h100,,h100,h100", "v100", "0mJ", "-1mJ/2mJ", "25mJ/150mJ/1J"} {
		if _, err := parseFlags([]string{"-caddy", "x", "-energy", bad}); err == nil {
			t.Errorf("-energy %q: accepted", bad)
		}
	}
}

// TestEnergyCaddyfile: the annotations go into one upstream block per worker, with kv_capacity
// when it is on, and nothing when neither is; kv_energy is decision cost with objective energy.
func TestEnergyCaddyfile(t *testing.T) {
	ups := []string{"127.0.0.1:8001", "127.0.0.1:8002"}
	en := []workerEnergy{energyPresets["h100"], energyPresets["a100"]}
	var kvEnergy policy
	for _, p := range variantPolicies([]string{"cache_threshold 0.3"}) {
		if p.Name == "kv_energy" {
			kvEnergy = p
		}
	}
	if strings.Join(kvEnergy.Block, ";") != "cache_threshold 0.3;decision cost;objective energy" || kvEnergy.title() != "kv_cache_aware (objective energy)" {
		t.Fatalf("kv_energy: %q %q", kvEnergy.Block, kvEnergy.title())
	}
	kvEnergy.Block = append(kvEnergy.Block, upstreamLines(ups, 4096, en)...)
	s := site{AdminPort: 2999, Port: 8080, Upstreams: ups, Policy: kvEnergy}
	got := s.caddyfile()
	want := "lb_policy kv_cache_aware {\n\t\t\tcache_threshold 0.3\n\t\t\tdecision cost\n\t\t\tobjective energy\n" +
		"\t\t\tupstream 127.0.0.1:8001 {\n\t\t\t\tkv_capacity 4096\n\t\t\t\tprefill_energy_per_token 25mJ\n\t\t\t\tenergy_per_token 150mJ\n\t\t\t}\n" +
		"\t\t\tupstream 127.0.0.1:8002 {\n\t\t\t\tkv_capacity 4096\n\t\t\t\tprefill_energy_per_token 40mJ\n\t\t\t\tenergy_per_token 210mJ\n\t\t\t}\n\t\t}"
	if !strings.Contains(got, want) {
		t.Errorf("Caddyfile:\n%s\nwant within it:\n%s", got, want)
	}
	if got := strings.Join(upstreamLines(ups, 0, []workerEnergy{{500e-6, 2e-3}}), "\n"); got != "upstream 127.0.0.1:8001 {\n\t\t\t\tprefill_energy_per_token 500uJ\n\t\t\t\tenergy_per_token 2mJ\n\t\t\t}" {
		t.Errorf("energy alone, first worker only:\n%s", got)
	}
	if got := upstreamLines(ups, 0, nil); len(got) != 0 {
		t.Errorf("no annotation: %q", got)
	}

	path := os.Getenv("KVROUTE_CADDY")
	if path == "" {
		t.Skip("KVROUTE_CADDY not set: no Caddy binary to adapt with")
	}
	bin, err := newCaddyBinary(path)
	if err != nil {
		t.Fatal(err)
	}
	out, err := adapt(bin.path, s.caddyfile())
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`"decision":"cost"`, `"objective":"energy"`,
		`"127.0.0.1:8001":{"energy_per_token":"150mJ","kv_capacity":4096,"prefill_energy_per_token":"25mJ"}`,
		`"127.0.0.1:8002":{"energy_per_token":"210mJ","kv_capacity":4096,"prefill_energy_per_token":"40mJ"}`} {
		if !bytes.Contains(out, []byte(w)) {
			t.Errorf("adapted JSON lacks %s: %s", w, out)
		}
	}
}

// TestJoulesPerRequest: each request is charged at the worker that served it, its uncached
// prompt tokens at the prefill energy and its output at the decode energy; failed requests
// cost nothing and count for nothing, a request no worker claimed costs the fleet's mean.
func TestJoulesPerRequest(t *testing.T) {
	addrs := []string{"w0:1", "w1:1"}
	en := []workerEnergy{{Prefill: 0.02, Decode: 0.1}, {Prefill: 0.04, Decode: 0.3}}
	recs := []replay.Record{
		{Worker: "w0:1", PromptTokens: 1000, CachedTokens: 800, CompletionTokens: 50}, // 200×0.02 + 50×0.1 = 9
		{Worker: "w1:1", PromptTokens: 1000, CachedTokens: 0, CompletionTokens: 10},   // 1000×0.04 + 10×0.3 = 43
		{Worker: "w1:1", PromptTokens: 500, Error: "502", CompletionTokens: 99},
		{Worker: "w1:1", PromptTokens: 100, CachedTokens: 200, CompletionTokens: 0}, // cached beyond the prompt: 0
	}
	j, un := joulesPerRequest(recs, addrs, en)
	if math.Abs(j-(9+43+0)/3.0) > 1e-9 || un != 0 {
		t.Errorf("%v J/request, %d unattributed; want %v, 0", j, un, (9+43)/3.0)
	}
	j, un = joulesPerRequest(append(recs[:0:0], replay.Record{PromptTokens: 100, CompletionTokens: 10}), addrs, en) // mean 0.03/0.2: 3+2
	if math.Abs(j-5) > 1e-9 || un != 1 {
		t.Errorf("unattributed: %v J, %d", j, un)
	}
	if j, _ := joulesPerRequest(nil, addrs, en); j != 0 {
		t.Errorf("no requests: %v", j)
	}
}

// TestPrintEnergy: medians (min-max) of joules per request and TTFT p99, and each policy's
// medians over kv_cost's.
func TestPrintEnergy(t *testing.T) {
	runs := func(p99s ...float64) []*replay.Result {
		var out []*replay.Result
		for _, p := range p99s {
			out = append(out, &replay.Result{TTFTP99Ms: p})
		}
		return out
	}
	results := []*policyResult{
		{Policy: "kv_cost", Label: "kv_cache_aware (decision cost)", Joules: []float64{100, 120, 110}, Runs: runs(200, 300, 250)},
		{Policy: "kv_energy", Label: "kv_cache_aware (objective energy)", Joules: []float64{90, 80, 99}, Runs: runs(260, 240, 280)},
	}
	var b bytes.Buffer
	printEnergy(&b, results, &config{energy: []workerEnergy{{1, 1}}})
	got := b.String()
	for _, want := range []string{
		"kv_cache_aware (decision cost)     110.0 (100.0-120.0)  250 (200-300)        1.000           1.00",
		"kv_cache_aware (objective energy)     90.0 (80.0-99.0)  260 (240-280)        0.818           1.04",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("lacks %q:\n%s", want, got)
		}
	}
	// A reference that spent 0 J (it reported no tokens) gives no ratio, not Inf.
	b.Reset()
	printEnergy(&b, []*policyResult{
		{Policy: "kv_cost", Label: "kv_cache_aware (decision cost)", Joules: []float64{0, 0, 0}, Runs: runs(200, 300, 250)},
		results[1],
	}, &config{energy: []workerEnergy{{1, 1}}})
	if got := b.String(); strings.Contains(got, "Inf") || strings.Contains(got, "NaN") ||
		!strings.Contains(got, "90.0 (80.0-99.0)  260 (240-280)            -           1.04") {
		t.Errorf("against a reference of 0 J:\n%s", got)
	}
	b.Reset()
	printEnergy(&b, results, &config{})
	if b.Len() != 0 {
		t.Errorf("without -energy: %q", b.String())
	}
}
