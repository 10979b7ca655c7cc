package fleetsim

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
)

func scenario(t testing.TB, name string) *Scenario {
	t.Helper()
	for _, sc := range Scenarios() {
		if sc.Name == name {
			return sc
		}
	}
	t.Fatalf("no scenario %s", name)
	return nil
}

func policy(t testing.TB, name string) Policy {
	t.Helper()
	for _, p := range Policies {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no policy %s", name)
	return Policy{}
}

// The same card twice is the same JSON, byte for byte, whatever the parallelism.
func TestCardDeterministic(t *testing.T) {
	opts := Options{Scenarios: regexp.MustCompile(`^(chat-80|chat-restart-80|chat-lora-80|tenants_flood)$`), Seeds: 1, MaxRequests: 400, Default: "thresholds"}
	var out [2][]byte
	for i := range out {
		opts.Parallel = 1 + i
		card, err := RunCard(opts)
		if err != nil {
			t.Fatal(err)
		}
		if out[i], err = card.JSON(); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(out[0], out[1]) {
		t.Errorf("two runs differ:\n%s\n---\n%s", out[0], out[1])
	}
	if !bytes.Contains(out[0], []byte(`"default": "thresholds"`)) || !bytes.Contains(out[0], []byte(`"queue_wait_p99_ms"`)) {
		t.Errorf("the card lacks fields:\n%s", out[0])
	}
	for _, p := range []string{"kv_cache_aware", "kv_thresholds", "kv_cost"} {
		if !bytes.Contains(out[0], []byte(`"`+p+`"`)) {
			t.Errorf("the card lacks policy %s", p)
		}
	}
}

// A short scorecard and what must hold on it.
func TestShortCardInvariants(t *testing.T) {
	card, err := RunCard(Options{Scenarios: regexp.MustCompile(`^(chat-80|chat-110|chat-closed-16)$`), Seeds: 1, MaxRequests: 800})
	if err != nil {
		t.Fatal(err)
	}
	get := func(scen, pol string) *Figures {
		for _, s := range card.Scenarios {
			if s.Name == scen {
				return s.Policies[pol]
			}
		}
		t.Fatalf("no %s", scen)
		return nil
	}
	var table bytes.Buffer
	card.Table(&table)
	t.Logf("\n%s", table.String())
	for _, scen := range []string{"chat-80", "chat-closed-16"} {
		o, rr := get(scen, "oracle"), get(scen, "round_robin")
		if o.HitRatio < rr.HitRatio {
			t.Errorf("%s: the oracle's hit ratio %v is below round_robin's %v", scen, o.HitRatio, rr.HitRatio)
		}
		if o.TTFTP50 > rr.TTFTP50 {
			t.Errorf("%s: the oracle's TTFT p50 %v is above round_robin's %v", scen, o.TTFTP50, rr.TTFTP50)
		}
	}
	for _, s := range card.Scenarios {
		for name, f := range s.Policies {
			if s.Name == "chat-80" && f.Unserved != 0 {
				t.Errorf("%s %s: %d unserved at 80%% load", s.Name, name, f.Unserved)
			}
		}
	}
	// kvroute's decisions: prefix-aware, they hit more than round_robin; kv_cache_aware runs
	// the default decision, choice for choice.
	for _, scen := range []string{"chat-80", "chat-closed-16"} {
		rr := get(scen, "round_robin")
		for _, pol := range []string{"kv_thresholds", "kv_cost"} {
			if f := get(scen, pol); f.HitRatio < rr.HitRatio+0.1 {
				t.Errorf("%s: %s's hit ratio %v is not 0.1 above round_robin's %v", scen, pol, f.HitRatio, rr.HitRatio)
			}
		}
	}
	for _, s := range card.Scenarios {
		if def, kv := s.Policies["kv_"+card.Default], s.Policies["kv_cache_aware"]; !reflect.DeepEqual(def, kv) {
			t.Errorf("%s: kv_cache_aware %+v is not kv_%s %+v", s.Name, *kv, card.Default, *def)
		}
	}
	if f := get("chat-110", "round_robin"); !(f.Goodput < f.Throughput) {
		t.Errorf("round_robin at 110%%: goodput %v not below throughput %v", f.Goodput, f.Throughput)
	}
}

// Capacity is what round_robin sustains with the prefix cache off: on a trace whose prompts
// share little, 110% of it leaves requests unserved when the run ends.
func TestOverloadLeavesUnserved(t *testing.T) {
	if _, err := MooncakeWorkload(1); err != nil {
		t.Skip(err)
	}
	card, err := RunCard(Options{Scenarios: regexp.MustCompile(`^mooncake-110$`), Seeds: 1, MaxRequests: 500,
		Policies: []Policy{policy(t, "round_robin")}})
	if err != nil {
		t.Fatal(err)
	}
	if f := card.Scenarios[0].Policies["round_robin"]; f.Unserved == 0 {
		t.Errorf("round_robin at 110%% of capacity served everything (%+v)", *f)
	}
}

// checked wraps a router and checks the simulator's side of the contract: Done exactly once
// for each request routed, FirstToken before Done, readings at the telemetry interval.
type checked struct {
	Router
	t        *testing.T
	routed   map[int]int
	done     map[int]bool
	first    map[int]bool
	readings []time.Duration
}

func (c *checked) Route(now time.Duration, r *Request) int {
	i := c.Router.Route(now, r)
	if i >= 0 {
		c.routed[r.ID] = i
	}
	return i
}

func (c *checked) FirstToken(now time.Duration, r *Request, i int) {
	if c.routed[r.ID] != i || c.first[r.ID] {
		c.t.Errorf("first token of %d from engine %d (routed to %d, seen %v)", r.ID, i, c.routed[r.ID], c.first[r.ID])
	}
	c.first[r.ID] = true
	c.Router.FirstToken(now, r, i)
}

func (c *checked) Done(now time.Duration, r *Request, i int, u Usage) {
	if c.done[r.ID] {
		c.t.Errorf("Done twice for %d", r.ID)
	}
	if !u.Aborted && (!c.first[r.ID] || u.PromptTokens != r.Tokens || u.CachedTokens > u.PromptTokens || u.FirstToken != r.FirstToken) {
		c.t.Errorf("Done for %d: usage %+v, request %+v", r.ID, u, r)
	}
	c.done[r.ID] = true
	c.Router.Done(now, r, i, u)
}

func (c *checked) Reading(now time.Duration, i int, rd engine.Reading) {
	if i == 0 {
		c.readings = append(c.readings, now)
	}
	c.Router.Reading(now, i, rd)
}

func TestRunContract(t *testing.T) {
	sc := scenario(t, "chat-restart-80")
	sc.Requests = 400
	sc.Restart.At = 5 * time.Second
	b, err := Build(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	c := &checked{Router: policy(t, "least_conn").New(1), t: t, routed: map[int]int{}, done: map[int]bool{}, first: map[int]bool{}}
	res := Run(sc, b, 1, 20, c)
	aborted := 0
	for _, r := range res.Requests {
		if _, ok := c.routed[r.ID]; ok != c.done[r.ID] {
			t.Errorf("request %d: routed %v, done %v", r.ID, ok, c.done[r.ID])
		}
		if r.Aborted {
			aborted++
		}
	}
	if aborted == 0 {
		t.Error("the restart aborted nothing")
	}
	for i, at := range c.readings {
		if at != time.Duration(i+1)*time.Second {
			t.Fatalf("reading %d at %v, want every second", i, at)
		}
	}
	if len(c.readings) < 10 {
		t.Errorf("%d readings", len(c.readings))
	}
}

// gate is a router that keeps requests waiting while every engine has limit in flight, and
// sheds every 50th request: the late-binding and shedding paths a decision core may use.
type gate struct {
	inflight
	limit, seen int
}

func (g *gate) Route(time.Duration, *Request) int {
	g.seen++
	if g.seen%50 == 0 {
		return Shed
	}
	best := 0
	for i, n := range g.n {
		if n < g.n[best] {
			best = i
		}
	}
	if g.n[best] >= g.limit {
		return Wait
	}
	return g.pick(best)
}

func TestWaitAndShed(t *testing.T) {
	sc := scenario(t, "chat-closed-64")
	sc.Requests = 400
	b, err := Build(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{limit: 2}
	res := Run(sc, b, 1, 0, g)
	f := Measure(res, time.Second)
	if f.Unserved != 0 || !(f.Shed > 0) || !(f.QueueWaitP99 > 0) {
		t.Errorf("unserved %d, shed %v, queue wait p99 %v", f.Unserved, f.Shed, f.QueueWaitP99)
	}
	for _, r := range res.Requests {
		if r.Engine >= 0 && r.Routed < r.Arrival {
			t.Fatalf("request %d routed before it arrived", r.ID)
		}
	}
	if max(g.n[0], g.n[1], g.n[2], g.n[3]) != 0 {
		t.Errorf("in flight at the end: %v", g.n)
	}
}

// The workloads' prompts share text exactly where they share KV blocks.
func TestTextAndBlocksAgree(t *testing.T) {
	sc := scenario(t, "chat-sessions-80")
	sc.Requests = 64
	b, err := Build(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	turns := b.reqs[0]
	for k := 1; k < len(turns); k++ {
		prev, cur := turns[k-1], turns[k]
		if cur.Text[:len(prev.Text)] != prev.Text {
			t.Fatalf("turn %d does not start with turn %d's text", k, k-1)
		}
		for i, h := range prev.hashes {
			if cur.hashes[i] != h {
				t.Fatalf("turn %d's block %d differs from turn %d's", k, i, k-1)
			}
		}
		if got, want := float64(cur.Chars)/float64(cur.Tokens), sc.CharsPerToken; got < want-0.05 || got > want+0.05 {
			t.Errorf("chars per token %.3f, want %.2f", got, want)
		}
	}
	other := b.reqs[1][0]
	if len(other.hashes) > 0 && other.hashes[len(other.hashes)-1] == turns[0].hashes[len(turns[0].hashes)-1] {
		t.Error("two conversations share their last block")
	}
	if turns[0].Session == "" || turns[0].Session != turns[1].Session || turns[0].Session == other.Session {
		t.Errorf("sessions: %q %q %q", turns[0].Session, turns[1].Session, other.Session)
	}
}

func BenchmarkRun(b *testing.B) {
	sc := scenario(b, "chat-80")
	built, err := Build(sc, 1)
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"round_robin", "sglang", "oracle", "kv_thresholds", "kv_cost"} {
		p := policy(b, name)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				Run(sc, built, 1, 20, p.New(1))
			}
		})
	}
}

// Figures with nothing to measure are null in the JSON, never NaN (which encoding/json refuses).
func TestUndefinedFiguresAreNull(t *testing.T) {
	r := &Request{ID: 0, Engine: -1}
	f := Measure(&Result{Requests: []*Request{r}, EngineLoad: []float64{0, 0}}, time.Second)
	card := &Card{Default: "thresholds", Scenarios: []*ScenarioResult{{Name: "x", Seed: 1, SLO: 10, Policies: map[string]*Figures{"p": f}}}}
	js, err := card.JSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"hit_ratio", "ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms", "throughput_rps", "goodput_rps", "imbalance", "queue_wait_p99_ms", "shed_rps"} {
		if !bytes.Contains(js, []byte(`"`+k+`": null`)) {
			t.Errorf("%s is not null:\n%s", k, js)
		}
	}
	if f.Unserved != 1 {
		t.Errorf("unserved %d, want 1", f.Unserved)
	}
}

// A card whose run fails keeps the runs that finished: RunCard returns them with the error,
// and OnRun saw each as it finished. An input that cannot be read at all stops the card
// before its first run.
func TestCardKeepsFinishedRuns(t *testing.T) {
	ok := *scenario(t, "chat-80")
	failing := ok
	failing.Name = "chat-80-seed-2-fails"
	failing.Workload = func(requests int, seed uint64) (*Workload, error) {
		if seed == 2 {
			return nil, errors.New("no workload for seed 2")
		}
		return ok.Workload(requests, seed)
	}
	var seen []int
	opts := Options{List: []*Scenario{&ok, &failing}, Seeds: 2, MaxRequests: 200, Parallel: 1,
		OnRun: func(c *Card, total int) {
			if total != 4 {
				t.Errorf("OnRun: %d runs in all, want 4", total)
			}
			seen = append(seen, len(c.Scenarios))
		}}
	card, err := RunCard(opts)
	if err == nil || !strings.Contains(err.Error(), "chat-80-seed-2-fails seed 2: no workload for seed 2") {
		t.Fatalf("err %v, want the failing run's", err)
	}
	if card == nil || len(card.Scenarios) != 3 {
		t.Fatalf("card %+v: want the 3 runs that finished", card)
	}
	if !reflect.DeepEqual(seen, []int{1, 2, 3}) {
		t.Errorf("OnRun saw cards of %v runs, want 1, 2, 3", seen)
	}

	failing.Workload = func(int, uint64) (*Workload, error) { return nil, errors.New("trace missing") }
	seen = nil
	card, err = RunCard(opts)
	if err == nil || !strings.Contains(err.Error(), "trace missing") || card != nil || seen != nil {
		t.Fatalf("an unreadable input: card %v, err %v, %d runs done; want no run and the error", card, err, len(seen))
	}
}

// ReadCard reads back everything a card writes, the flow scenarios' classes and the nulls
// included: the JSON of the card read is the JSON written, byte for byte.
func TestReadCardRoundTrip(t *testing.T) {
	card, err := RunCard(Options{Scenarios: regexp.MustCompile(`^(chat-80|tenants_flood)$`), Seeds: 1, MaxRequests: 300})
	if err != nil {
		t.Fatal(err)
	}
	js, err := card.JSON()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "scorecard.json")
	if err := os.WriteFile(path, js, 0o644); err != nil {
		t.Fatal(err)
	}
	back, err := ReadCard(path)
	if err != nil {
		t.Fatal(err)
	}
	again, err := back.JSON()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(js, again) {
		t.Errorf("the card read back differs:\n%s\n---\n%s", js, again)
	}
	if !reflect.DeepEqual(back.order, card.order) {
		t.Errorf("policies in order %v, the card ran %v", back.order, card.order)
	}
}

// The printed tables are medians over the seeds: the best of each column marked among the
// policies (never the oracle), and Standing naming the best baseline per figure.
func TestCardTables(t *testing.T) {
	figs := func(hit, p50 float64) *Figures {
		nan := Num(math.NaN())
		return &Figures{HitRatio: Num(hit), TTFTP50: Num(p50), TTFTP99: Num(2 * p50), E2EP99: nan, Throughput: 1,
			Goodput: 1, Imbalance: 1, QueueWaitP99: 0, Shed: 0}
	}
	card := &Card{order: []string{"kv_cache_aware", "sglang", "least_conn", "round_robin", "prefix_hash", "oracle"}}
	for seed, kv := range []float64{0.5, 0.9, 0.7} { // kv_cache_aware's hit: median 0.7
		card.Scenarios = append(card.Scenarios, &ScenarioResult{Name: "s", Seed: seed + 1, SLO: 40, Policies: map[string]*Figures{
			"kv_cache_aware": figs(kv, 10), "sglang": figs(0.8, 12), "least_conn": figs(0.4, 9),
			"round_robin": figs(0.3, 20), "prefix_hash": figs(0.6, 11), "oracle": figs(0.95, 5)}})
	}
	var med, st bytes.Buffer
	card.Medians(&med)
	card.Standing(&st, "kv_cache_aware")
	lines := map[string]string{}
	for _, l := range strings.Split(med.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			lines[f[0]] = l
		}
	}
	for p, want := range map[string][]string{
		"kv_cache_aware": {"0.700 ", "10.0 "},
		"sglang":         {"0.800*", "12.0 "},
		"least_conn":     {"0.400 ", "9.0*"},
		"oracle":         {"0.950 ", "5.0 "},
	} {
		for _, w := range want {
			if !strings.Contains(lines[p]+" ", w) {
				t.Errorf("medians: %s's row %q lacks %q", p, lines[p], w)
			}
		}
	}
	if !strings.Contains(med.String(), "s: 3 seed(s), slo 40 ms") {
		t.Errorf("medians: no scenario header:\n%s", med.String())
	}
	row := ""
	for _, l := range strings.Split(st.String(), "\n") {
		if strings.HasPrefix(l, "s ") {
			row = l
		}
	}
	if f := strings.Fields(row); len(f) < 9 || f[1] != "0.700" || f[2] != "0.800" || f[3] != "sglang" || f[4] != "10.0" || f[5] != "9.0" || f[6] != "least_conn" {
		t.Errorf("standing: row %q, want kv's hit 0.700 against sglang's 0.800, its TTFT p50 10.0 against least_conn's 9.0", row)
	}
	if !strings.Contains(st.String(), "of 1 scenarios: hit 0, ttft_p50 0, ttft_p99 0, goodput 1") {
		t.Errorf("standing: summary line:\n%s", st.String())
	}
}
