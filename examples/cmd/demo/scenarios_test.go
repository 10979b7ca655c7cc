package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/replay"
	"github.com/kvroute/caddy-kvroute/examples/workload"
	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
)

// TestSlowFlags: -slow names the last N workers, its checks refuse what makes no fleet.
func TestSlowFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"-caddy", "x", "-slow", "2", "-restart-at", "3s", "-compare-telemetry"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.slowFactor != 4 || slowNames(cfg.workers, cfg.slow) != "w2, w3" || cfg.slowdown(0) != 1 || cfg.slowdown(3) != 4 || cfg.restartAt != 3*time.Second {
		t.Errorf("slow %d × %g (%s), restart at %v", cfg.slow, cfg.slowFactor, slowNames(cfg.workers, cfg.slow), cfg.restartAt)
	}
	for _, args := range [][]string{
		{"-slow", "5"}, {"-slow", "-1"}, {"-slow", "1", "-slow-factor", "0.5"}, {"-restart-at", "-1s"},
		{"-compare-telemetry", "-telemetry=false"},
	} {
		if _, err := parseFlags(append([]string{"-caddy", "x"}, args...)); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}

// TestCompareTelemetryPolicies: -compare-telemetry puts kv_cache_aware with `telemetry off` right
// after kv_cache_aware, and only kv_cache_aware.
func TestCompareTelemetryPolicies(t *testing.T) {
	ps := withTelemetryOff(allPolicies([]string{"cache_threshold 0.3"})[:4])
	var titles []string
	for _, p := range ps {
		titles = append(titles, fmt.Sprintf("%s on=%v", p.title(), telemetryOn(p)))
	}
	want := "kv_cache_aware on=true|kv_cache_aware (telemetry off) on=false|sglang_cache_aware on=false|prefix_hash on=false|round_robin on=false"
	if got := strings.Join(titles, "|"); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if b := ps[1].Block; len(b) != 2 || b[1] != "telemetry off" {
		t.Errorf("telemetry off block %q", b)
	}
}

// TestSimFleetSlowAndRestart: on real loopback workers, -slow's workers prefill slower by the
// factor (their own /metrics say so, as kvroute reads them: a prompt's tokens over its prefill
// step, the engine's fixed and per-sequence parts included), and Restart empties w0 and puts
// its totals back to zero with a new start time, which kvroute reads as a restart.
func TestSimFleetSlowAndRestart(t *testing.T) {
	cfg := &config{workers: 3, slow: 1, slowFactor: 4, blocks: 64, speed: 1}
	f, err := startSimFleet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	speeds := f.PrefillSpeeds()
	if near := func(a, b float64) bool { return math.Abs(a-b) < 1e-6*b }; !near(speeds[0], 25000) || !near(speeds[1], 25000) || !near(speeds[2], 6250) {
		t.Fatalf("configured prefill speeds %v, want 25000 25000 6250 (40µs per token, 160µs)", speeds)
	}
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog ", 40)
	for i, w := range f.Workers {
		before := readWorker(t, w.URL)
		postCompletion(t, w.URL, prompt)
		after := readWorker(t, w.URL)
		d := telemetry.Diff(&before, &after)
		want := d.ComputedTokens / w.Engine().StepTime(int(d.ComputedTokens), 1).Seconds()
		if got := d.ComputedTokens / d.PrefillSeconds; math.Abs(got-want) > 1e-6*want {
			t.Errorf("w%d: %v tokens in %vs = %v tokens/s of prefill, want %v", i, d.ComputedTokens, d.PrefillSeconds, got, want)
		}
	}
	before := readWorker(t, f.Workers[0].URL)
	// kvroute takes a start time that moved by more than a second for a restart.
	for time.Since(time.Unix(0, int64(before.Counters.StartTime*1e9))) < 1100*time.Millisecond {
		time.Sleep(50 * time.Millisecond)
	}
	if err := f.Restart(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	after := readWorker(t, f.Workers[0].URL)
	if d := telemetry.Diff(&before, &after); !d.Restart || after.Counters.PromptTokens != 0 || f.Workers[0].Stats().CacheBlocks != 0 {
		t.Errorf("after Restart: restart %v, prompt tokens %v, cache %d blocks", d.Restart, after.Counters.PromptTokens, f.Workers[0].Stats().CacheBlocks)
	}
	if f.Workers[1].Stats().PromptTokens == 0 {
		t.Error("restarting w0 reset w1")
	}
}

func readWorker(t *testing.T, url string) telemetry.Reading {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r, err := telemetry.Parse(resp.Body, 0)
	if err != nil {
		t.Fatal(err)
	}
	r.At = time.Now()
	return r
}

func postCompletion(t *testing.T, url, prompt string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": workload.DefaultChat.Model, "prompt": prompt, "max_tokens": 2})
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s", url, resp.Status)
	}
}

// TestStatusFigures: the scenarios' reading of GET /kvroute/ (from a loopback server answering
// as Caddy's admin does): shares of the trees, restarts, learned prefill against configured.
func TestStatusFigures(t *testing.T) {
	body := `{"chars_per_token":{"m":5.2},"upstreams":{
		"a:1":{"tree_chars":300,"learned":{"prefill_tokens_per_second":21000,"prefill_learned":true,"restarts":1}},
		"a:2":{"tree_chars":700,"learned":{"prefill_tokens_per_second":5000,"prefill_learned":false}},
		"a:3":{"tree_chars":0,"learned":{"prefill_tokens_per_second":4500,"prefill_learned":true}}}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/kvroute/" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(body))
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	admin, _ := strconv.Atoi(port)
	st, err := readStatus(context.Background(), admin)
	if err != nil {
		t.Fatal(err)
	}
	if st.share("a:1") != 0.3 || st.share("a:3") != 0 || st.restarts() != 1 {
		t.Errorf("shares %v %v, restarts %d", st.share("a:1"), st.share("a:3"), st.restarts())
	}
	addrs := []string{"a:1", "a:2", "a:3"}
	r := st.prefillRatios(addrs, []float64{20000, 20000, 5000})
	if r[0] != 1.05 || !math.IsNaN(r[1]) || r[2] != 0.9 {
		t.Errorf("ratios %v", r)
	}
	line := st.prefillLine(addrs, []float64{20000, 20000, 5000}, []bool{false, false, true})
	if want := "w0 21000/20000 (1.05), w1 not learned (prior 5000), w2 4500/5000 (0.90) slow"; !strings.HasSuffix(line, want) {
		t.Errorf("line %q, want it to end %q", line, want)
	}
}

// TestWindowFigures: the hit ratio and p99 TTFT of a window count the calls that started in it
// and were answered.
func TestWindowFigures(t *testing.T) {
	var recs []replay.Record
	for i := range 200 {
		recs = append(recs, replay.Record{StartMs: float64(i * 10), TTFTMs: float64(i), PromptTokens: 100, CachedTokens: i % 2 * 100})
	}
	recs = append(recs, replay.Record{StartMs: 1500, Error: "boom", TTFTMs: 1e6, PromptTokens: 100})
	hit, p99, n := windowFigures(recs, time.Second, 2*time.Second)
	if hit != 0.5 || n != 100 || p99 != 198 {
		t.Errorf("window 1-2s: hit %v, p99 %v, %d calls; want 0.5, 198, 100", hit, p99, n)
	}
	if hit, p99, n := windowFigures(recs, 5*time.Second, 6*time.Second); hit != 0 || p99 != 0 || n != 0 {
		t.Errorf("empty window: %v %v %d", hit, p99, n)
	}
}

// TestMedianSpan: the median of an even count is the mean of the middle two.
func TestMedianSpan(t *testing.T) {
	if m, lo, hi := medianSpan([]float64{3, 1, 4, 2}); m != 2.5 || lo != 1 || hi != 4 {
		t.Errorf("%v %v %v", m, lo, hi)
	}
	if m, _, _ := medianSpan([]float64{5, 1, 9}); m != 5 {
		t.Errorf("odd median %v", m)
	}
}

// TestLLMDFleetSlowAndRestart runs llm-d's simulator (examples/llmdsim/bin, or KVROUTE_LLMD_BIN):
// -slow's worker gets its flags, and Restart kills w0 and starts it again on its port, its
// counters from zero.
func TestLLMDFleetSlowAndRestart(t *testing.T) {
	bin := os.Getenv("KVROUTE_LLMD_BIN")
	if bin == "" {
		dir, err := findDir(llmdDir)
		if err == nil {
			bin = filepath.Join(dir, llmdBinName)
		}
	}
	if _, err := os.Stat(bin); bin == "" || err != nil {
		t.Skip("no llm-d-inference-sim binary (examples/llmdsim/bin or KVROUTE_LLMD_BIN)")
	}
	cfg := &config{workers: 2, slow: 1, slowFactor: 4, blocks: 256, speed: 10, kind: "mooncake", llmdBin: bin}
	ctx := context.Background()
	f, err := startLLMDFleet(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if s := f.PrefillSpeeds(); math.Abs(s[0]-200000) > 1 || math.Abs(s[1]-50000) > 1 {
		t.Errorf("configured prefill speeds %v, want 200000 and 50000", s)
	}
	if !strings.Contains(strings.Join(f.perWorker[1], " "), "--prefill-time-per-token 20µs --inter-token-latency 800µs") {
		t.Errorf("slow worker's flags %q", f.perWorker[1])
	}
	url := "http://" + f.addrs[0]
	postCompletion(t, url, strings.Repeat("the quick brown fox jumps over the lazy dog ", 40))
	before := readWorker(t, url)
	if before.Counters.PromptTokens == 0 {
		t.Fatalf("no prompt tokens counted before the restart: %+v", before.Counters)
	}
	pid := f.procs[0].Process.Pid
	if err := f.Restart(ctx, 0); err != nil {
		t.Fatal(err)
	}
	after := readWorker(t, url)
	if f.procs[0].Process.Pid == pid || after.Counters.PromptTokens != 0 {
		t.Errorf("after Restart: pid %d (was %d), prompt tokens %v", f.procs[0].Process.Pid, pid, after.Counters.PromptTokens)
	}
}

// TestExternalSampler: the sampler reads each upstream's external load from GET /kvroute/ (a
// loopback server answering as Caddy's admin does) until stopped.
func TestExternalSampler(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := served.Add(1)
		fmt.Fprintf(w, `{"upstreams":{"a:1":{"telemetry":{"external_load":%d}},"a:2":{"telemetry":{"external_load":0}},"a:3":{}}}`, n%2*3)
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	admin, _ := strconv.Atoi(port)
	stop := sampleExternal(context.Background(), admin, time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for served.Load() < 4 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	e := stop()
	// Two upstreams with telemetry per read, a:1 at 3 every other read.
	if e.samples < 6 || e.samples%2 != 0 || e.peak != 3 || e.nonZero == 0 || e.nonZero > e.samples/2 {
		t.Errorf("%d samples, %d non-zero, peak %d: %s", e.samples, e.nonZero, e.peak, e)
	}
	if !strings.Contains(e.String(), "non-zero") {
		t.Errorf("%s", e)
	}
}
