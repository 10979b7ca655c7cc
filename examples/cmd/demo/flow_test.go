package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/fleetsim"
	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/replay"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// TestFlowFlags: -workload names one flow scenario, a family's two or all four; a fleet whose
// capacity the demo cannot estimate needs -capacity; the flow workloads run open loop with
// their records kept, on the simulator's chat engine's cache.
func TestFlowFlags(t *testing.T) {
	for kind, want := range map[string]string{
		"flow":           "tenants_alone tenants_flood priority_alone priority_flood",
		"tenants":        "tenants_alone tenants_flood",
		"priority":       "priority_alone priority_flood",
		"tenants_flood":  "tenants_flood",
		"priority_alone": "priority_alone",
	} {
		cfg, err := parseFlags([]string{"-caddy", "x", "-workload", kind})
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		var got []string
		for _, sc := range cfg.flow {
			got = append(got, sc.Name)
		}
		if strings.Join(got, " ") != want || !cfg.openLoop || !cfg.keepRecords || cfg.blocks != flowBlocksPerWorker || cfg.maxInFlight != flowMaxInFlight {
			t.Errorf("%s: scenarios %v, open %v, records %v, blocks %d, in flight %d", kind, got, cfg.openLoop, cfg.keepRecords, cfg.blocks, cfg.maxInFlight)
		}
	}
	if cfg, err := parseFlags([]string{"-caddy", "x"}); err != nil || len(cfg.flow) != 0 || cfg.keepRecords {
		t.Errorf("chat: flow %v, records %v, %v", cfg.flow, cfg.keepRecords, err)
	}
	for _, args := range [][]string{
		{"-workload", "tenants", "-fleet", "llmd"}, {"-workload", "tenants", "-capacity", "-1"},
		{"-workload", "flow", "-flow-requests", "4"}, {"-workload", "flow", "-slo", "-1s"}, {"-workload", "tenants", "-slow", "1"}, {"-workload", "tenants", "-max-num-seqs", "4"}, {"-workload", "tenant"},
	} {
		if _, err := parseFlags(append([]string{"-caddy", "x"}, args...)); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
	if _, err := parseFlags([]string{"-caddy", "x", "-workload", "tenants", "-fleet", "llmd", "-capacity", "40"}); err != nil {
		t.Errorf("llmd with -capacity: %v", err)
	}
}

// TestFlowWorkloadRates: each scenario sends its first class at the simulator's fraction of
// the capacity (light 15%, interactive 50%) and, flooded, the second class at 10× (heavy) or 2×
// (batch) that, over the same span; alone and flood share the time scale; the headers name the
// class.
func TestFlowWorkloadRates(t *testing.T) {
	cfg, err := parseFlags([]string{"-caddy", "x", "-workload", "flow"})
	if err != nil {
		t.Fatal(err)
	}
	const capacity = 40.0
	scales := map[string]float64{}
	for _, sc := range cfg.flow {
		w, scale := cfg.flowWorkload(sc, capacity)
		fam := flowFamilies[sc.Family]
		header := map[string]string{"tenants": "X-Tenant", "priority": "X-Priority"}[sc.Family]
		calls := map[string]int{}
		for _, s := range w.Sessions {
			for _, c := range s.Calls {
				if c.Headers[header] != s.Class || len(c.Headers) != 1 {
					t.Fatalf("%s: %s call headers %v", sc.Name, s.ID, c.Headers)
				}
				calls[s.Class]++
			}
		}
		secs := w.Span().Seconds() * scale
		first := float64(calls[fam.first.Name]) / secs
		if math.Abs(first/(fam.load*capacity)-1) > 1e-9 {
			t.Errorf("%s: %s at %.3f requests/s, want %.0f%% of %g", sc.Name, fam.first.Name, first, 100*fam.load, capacity)
		}
		second := float64(calls[fam.second.Name]) / secs
		want := float64(fam.k) * first
		if sc.Alone {
			want = 0
		}
		if math.Abs(second-want) > 1e-9*want+1e-12 {
			t.Errorf("%s: %s at %.3f requests/s, want %.3f", sc.Name, fam.second.Name, second, want)
		}
		if calls[fam.first.Name] != fam.requests {
			t.Errorf("%s: %d %s requests, want %d", sc.Name, calls[fam.first.Name], fam.first.Name, fam.requests)
		}
		if s, ok := scales[sc.Family]; ok && s != scale {
			t.Errorf("%s: time scale %g, the family's alone %g", sc.Name, scale, s)
		}
		scales[sc.Family] = scale
	}
	// The simulator's rates: light 15% and heavy 10× it, interactive 50% and batch 2×.
	if f := flowFamilies["tenants"]; f.load != 0.15 || f.k != 10 {
		t.Errorf("tenants: %+v", f)
	}
	if f := flowFamilies["priority"]; f.load != 0.5 || f.k != 2 {
		t.Errorf("priority: %+v", f)
	}
}

// TestFlowCapacity: the classes' rates are fractions of the fleet simulator's calibrated
// capacity of its chat fleet (llmsim runs its engine model), scaled by -speed and -workers over
// its 4 engines, and goodput's SLO is the simulator's at -speed; -capacity and -slo override
// them.
func TestFlowCapacity(t *testing.T) {
	var cal fleetsim.Scenario
	for _, sc := range fleetsim.Scenarios() {
		if sc.Family == "chat" {
			cal = *sc
			break
		}
	}
	want, wantSLO, err := fleetsim.Calibrate(&cal)
	if err != nil || len(cal.Engines) != 4 || cal.Engines[0].MaxNumSeqs != llmsim.DefaultSlots {
		t.Fatalf("the simulator's chat fleet: %d engines, %+v, %v", len(cal.Engines), cal.Engines, err)
	}
	cfg, err := parseFlags([]string{"-caddy", "x", "-workload", "tenants", "-workers", "2", "-speed", "0.5"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := cfg.flowCapacity()
	if err != nil || math.Abs(got/(want*0.5*2/4)-1) > 1e-12 {
		t.Errorf("capacity %g (%v), want %g × 0.5 × 2/4", got, err, want)
	}
	if slo, err := cfg.flowSLO(); err != nil || slo != 2*wantSLO {
		t.Errorf("SLO %v (%v), want 2 × %v", slo, err, wantSLO)
	}
	cfg.capacity, cfg.slo = 12, time.Second
	if got, _ := cfg.flowCapacity(); got != 12 {
		t.Errorf("-capacity 12: %g", got)
	}
	if slo, _ := cfg.flowSLO(); slo != time.Second {
		t.Errorf("-slo 1s: %v", slo)
	}
}

// TestClassSplit replays a two-class workload through a front that sheds every third heavy
// request with a 429 and fails every fifth light one with a 502, in front of a real llmsim
// worker: the split counts what the front did, per class, from the headers the calls carried;
// shed and failed requests are out of the TTFT and the throughput.
func TestClassSplit(t *testing.T) {
	wk, err := llmsim.StartWorker("127.0.0.1:0", llmsim.Config{Name: "w0", Speed: 50, CapacityBlocks: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer wk.Close()
	up, _ := url.Parse("http://" + wk.Addr)
	proxy := httputil.NewSingleHostReverseProxy(up)
	proxy.FlushInterval = -1
	var mu sync.Mutex
	seen := map[string]int{}
	shed, failed := 0, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		tenant := r.Header.Get("X-Tenant")
		seen[tenant]++
		n := seen[tenant]
		switch {
		case tenant == "heavy" && n%3 == 0:
			shed++
			mu.Unlock()
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":{"message":"the fleet is full","type":"rate_limit_exceeded"}}`, http.StatusTooManyRequests)
			return
		case tenant == "light" && n%5 == 0:
			failed++
			mu.Unlock()
			http.Error(w, "bad gateway", http.StatusBadGateway)
			return
		}
		mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	defer srv.Close()

	fam := flowFamilies["tenants"]
	w := workload.TwoClass(workload.ChatConfig{Turns: 4, Seed: 5}, 8*(1+3), 3, false, fam.first, fam.second)
	classOf := map[string]string{}
	for _, s := range w.Sessions {
		classOf[s.ID] = s.Class
	}
	res, err := replay.Run(context.Background(), w, replay.Options{BaseURL: srv.URL, OpenLoop: true, TimeScale: 0.01, KeepRecords: true, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	all, by := classSplit(res, classOf, time.Hour)
	if seen["light"] != 8 || seen["heavy"] != 24 || len(seen) != 2 {
		t.Fatalf("the front saw %v, want light 8 and heavy 24", seen)
	}
	l, h := by["light"], by["heavy"]
	if l.Requests != 8 || l.Errors != failed || l.Shed != 0 || l.Answered != 8-failed {
		t.Errorf("light %+v; the front failed %d", l, failed)
	}
	if h.Requests != 24 || h.Shed != shed || h.Errors != 0 || h.Answered != 24-shed {
		t.Errorf("heavy %+v; the front shed %d", h, shed)
	}
	if all.Requests != 32 || all.Shed != shed || all.Errors != failed || all.Answered != 32-shed-failed {
		t.Errorf("all %+v", all)
	}
	if len(by) != 2 {
		t.Errorf("classes %v", by)
	}
	var lightTTFT []float64
	for _, r := range res.Records {
		if classOf[r.Session] == "light" && r.Error == "" {
			lightTTFT = append(lightTTFT, r.TTFTMs)
		}
	}
	slices.Sort(lightTTFT)
	if l.TTFTP99Ms != lightTTFT[len(lightTTFT)-1] || l.TTFTP50Ms != lightTTFT[(len(lightTTFT)+1)/2-1] {
		t.Errorf("light TTFT p50 %g p99 %g, from the answered %v", l.TTFTP50Ms, l.TTFTP99Ms, lightTTFT)
	}
	if want := float64(h.Answered) / res.WallSeconds; math.Abs(h.Throughput-want) > 1e-9 || h.Goodput != h.Throughput {
		t.Errorf("heavy throughput %g goodput %g, want %g (every answer within an hour)", h.Throughput, h.Goodput, want)
	}
	if _, by0 := classSplit(res, classOf, time.Nanosecond); by0["heavy"].Goodput != 0 {
		t.Errorf("goodput within 1ns: %g", by0["heavy"].Goodput)
	}
	if l.HitRatio <= 0 || l.HitRatio >= 1 {
		t.Errorf("light hit ratio %g", l.HitRatio)
	}
}

// TestFlowTargets: each repeat goes to the simulator's judge as a seed, the medians over the
// repeats make the ratios, and each target is met or missed as issue 35 sets it.
func TestFlowTargets(t *testing.T) {
	run := func(all float64, classes map[string][2]float64) flowRun {
		r := flowRun{All: classFigures{Throughput: all, TTFTP99Ms: math.NaN()}, Classes: map[string]classFigures{}}
		for c, v := range classes { // p99, throughput
			r.Classes[c] = classFigures{TTFTP99Ms: v[0], Throughput: v[1]}
		}
		return r
	}
	pol := func(name string, runs ...flowRun) *flowPolicy { return &flowPolicy{Policy: name, Runs: runs} }
	results := []*flowResult{
		{Scenario: "tenants_alone", Policies: []*flowPolicy{
			pol("kv_cache_aware", run(4, map[string][2]float64{"light": {20, 4}}), run(4, map[string][2]float64{"light": {30, 4}}), run(4, map[string][2]float64{"light": {1000, 4}})),
			pol("kv_flow", run(4, map[string][2]float64{"light": {20, 4}}), run(4, map[string][2]float64{"light": {40, 4}}), run(4, map[string][2]float64{"light": {40, 4}})),
		}},
		{Scenario: "tenants_flood", Policies: []*flowPolicy{
			pol("kv_cache_aware", run(40, map[string][2]float64{"light": {9000, 3}, "heavy": {9000, 37}}), run(42, map[string][2]float64{"light": {8000, 3}, "heavy": {9000, 39}}), run(38, map[string][2]float64{"light": {7000, 3}, "heavy": {9000, 35}})),
			pol("kv_flow", run(39, map[string][2]float64{"light": {50, 4}, "heavy": {900, 35}}), run(39, map[string][2]float64{"light": {60, 4}, "heavy": {900, 35}}), run(39, map[string][2]float64{"light": {70, 4}, "heavy": {900, 35}})),
		}},
		{Scenario: "priority_alone", Policies: []*flowPolicy{pol("kv_flow", run(10, map[string][2]float64{"interactive": {100, 10}}))}},
		{Scenario: "priority_flood", Policies: []*flowPolicy{pol("kv_flow", run(30, map[string][2]float64{"interactive": {120, 10}, "batch": {5000, 20}}))}},
	}
	got := map[string]string{}
	for _, tg := range flowCard(results).FlowTargets([]string{"kv_cache_aware", "kv_flow"}) {
		got[tg.Policy+" "+tg.Name] = fmt.Sprintf("%.4f %v", tg.Value, tg.Met)
	}
	want := map[string]string{
		// kv_cache_aware: light p99 median 8000 / 30; heavy 37 / (40 − 3); fleet 40 / 40.
		"kv_cache_aware light_ttft_p99":   fmt.Sprintf("%.4f false", 8000.0/30),
		"kv_cache_aware heavy_throughput": "1.0000 true",
		"kv_cache_aware fleet_throughput": "1.0000 true",
		// kv_flow: 60 / 40 = 1.5 met; heavy 35 / (40 − 4) = 0.972; fleet 39 / 40 = 0.975;
		// interactive 120 / 100 = 1.2 met.
		"kv_flow light_ttft_p99":       "1.5000 true",
		"kv_flow heavy_throughput":     fmt.Sprintf("%.4f true", 35.0/36),
		"kv_flow fleet_throughput":     "0.9750 true",
		"kv_flow interactive_ttft_p99": "1.2000 true",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("targets\n got %v\nwant %v", got, want)
	}
}

// TestKVFlowPolicy: kv_flow is kv_cache_aware with issue 35's flow_control block; a default
// run of a flow workload puts it right after kv_cache_aware, another default run leaves it
// out; with a Caddy binary (KVROUTE_CADDY), the block adapts to the policy's flow_control.
func TestKVFlowPolicy(t *testing.T) {
	bin := &caddyBinary{modules: map[string]bool{moduleMatcher: true, moduleKV: true, policyModulePrefix + "least_conn": true}}
	names := func(args ...string) string {
		cfg, err := parseFlags(append([]string{"-caddy", "x"}, args...))
		if err != nil {
			t.Fatal(err)
		}
		ps, _, err := selectPolicies(cfg, bin)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range ps {
			out = append(out, p.Name)
		}
		return strings.Join(out, ",")
	}
	if got := names("-workload", "flow"); got != "kv_cache_aware,kv_flow,least_conn" {
		t.Errorf("flow default: %s", got)
	}
	if got := names(); got != "kv_cache_aware,least_conn" {
		t.Errorf("chat default: %s", got)
	}
	if got := names("-policies", "kv_flow,least_conn"); got != "kv_flow,least_conn" {
		t.Errorf("named: %s", got)
	}

	var p policy
	for _, v := range variantPolicies([]string{"cache_threshold 0.3"}) {
		if v.Name == "kv_flow" {
			p = v
		}
	}
	ups := []string{"127.0.0.1:8001", "127.0.0.1:8002"}
	s := site{AdminPort: 2999, Port: 8080, Upstreams: ups, Policy: p}
	text := s.caddyfile()
	want := "lb_policy kv_cache_aware {\n\t\t\tcache_threshold 0.3\n\t\t\tflow_control {\n" +
		"\t\t\t\ttenant   {http.request.header.X-Tenant}\n\t\t\t\tpriority {http.request.header.X-Priority}\n" +
		"\t\t\t\tband interactive {\n\t\t\t\t\tqueue_timeout 10s\n\t\t\t\t}\n" +
		"\t\t\t\tband batch {\n\t\t\t\t\tqueue_timeout 5m\n\t\t\t\t}\n\t\t\t}\n\t\t}"
	if !strings.Contains(text, want) {
		t.Errorf("kv_flow's Caddyfile:\n%s\nlacks\n%s", text, want)
	}
	path := os.Getenv("KVROUTE_CADDY")
	if path == "" {
		t.Skip("KVROUTE_CADDY not set: no Caddy binary to adapt with")
	}
	real, err := newCaddyBinary(path)
	if err != nil {
		t.Fatal(err)
	}
	p.Block = append(slices.Clone(p.Block), upstreamLines(ups, 4096, nil)...)
	s.Policy = p
	out, err := adapt(real.path, s.caddyfile())
	if err != nil {
		t.Fatalf("%v\n%s", err, s.caddyfile())
	}
	for _, want := range []string{
		`"flow_control":{"bands":[{"name":"interactive","queue_timeout":10000000000},{"name":"batch","queue_timeout":300000000000}],"priority":"{http.request.header.X-Priority}","tenant":"{http.request.header.X-Tenant}"}`,
		`"kv_capacity":4096`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("adapted JSON lacks %s: %s", want, out)
		}
	}
}

// TestClassFiguresJSON: a class with nothing answered (its TTFT NaN) still writes -json, with
// null for the TTFT; the other figures as they are.
func TestClassFiguresJSON(t *testing.T) {
	f := classFigures{Requests: 3, Shed: 3, TTFTP50Ms: math.NaN(), TTFTP99Ms: math.NaN(), Throughput: 0.5}
	b, err := json.Marshal(flowRun{All: f, Classes: map[string]classFigures{"heavy": f}})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"requests":3,"answered":0,"shed":3,"errors":0,"hit_ratio":0,"ttft_p50_ms":null,"ttft_p99_ms":null,"throughput_rps":0.5,"goodput_rps":0}`
	if got := string(b); got != `{"all":`+want+`,"classes":{"heavy":`+want+`}}` {
		t.Errorf("got %s", got)
	}
}
