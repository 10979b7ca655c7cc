package fleetsim

import (
	"bytes"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/decide"
)

// The flood scenarios' first class is the alone scenario's workload, call for call, at the
// same absolute rate; the second sends k times its requests and tokens over the same span.
func TestTwoClassAloneIsTheMixsFirst(t *testing.T) {
	for _, pair := range [][2]string{{"tenants_alone", "tenants_flood"}, {"priority_alone", "priority_flood"}} {
		alone, flood := scenario(t, pair[0]), scenario(t, pair[1])
		ba, err := Build(alone, 1)
		if err != nil {
			t.Fatal(err)
		}
		bf, err := Build(flood, 1)
		if err != nil {
			t.Fatal(err)
		}
		// The open loop's time scale (sim.Run): requests / span / (load × capacity).
		scale := func(sc *Scenario, b *Built) float64 {
			return float64(b.w.Calls()) / b.span.Seconds() / sc.Load
		}
		if a, f := scale(alone, ba), scale(flood, bf); math.Abs(a-f) > 1e-9*a {
			t.Errorf("%s: time scale %v, %s: %v", pair[0], a, pair[1], f)
		}
		first := ba.reqs[0][0].Class
		var firstTokens, secondTokens, firstN, secondN int
		other := ""
		for i, calls := range bf.reqs {
			for j, r := range calls {
				if r.Class == first {
					firstTokens += r.Tokens
					firstN++
					if i >= len(ba.reqs) {
						t.Fatalf("%s: more %s sessions than %s has", pair[1], first, pair[0])
					}
					a := ba.reqs[i][j]
					if a.Text != r.Text || a.Tokens != r.Tokens || a.Output != r.Output || a.Tenant != r.Tenant || a.Priority != r.Priority ||
						ba.w.sessions[i].calls[j].at != bf.w.sessions[i].calls[j].at {
						t.Fatalf("%s: session %d call %d differs from %s's", pair[1], i, j, pair[0])
					}
					continue
				}
				if other == "" {
					other = r.Class
				}
				if r.Class != other || r.Class == "" {
					t.Fatalf("%s: class %q beside %q and %q", pair[1], r.Class, first, other)
				}
				secondTokens += r.Tokens
				secondN++
			}
		}
		if firstN != ba.w.Calls() {
			t.Errorf("%s: %d %s requests, %s has %d", pair[1], firstN, first, pair[0], ba.w.Calls())
		}
		want := float64(flood.Requests/alone.Requests - 1)
		if k := float64(secondN) / float64(firstN); k != want {
			t.Errorf("%s: %s sends %v times %s's requests, want %v", pair[1], other, k, first, want)
		}
		if k := float64(secondTokens) / float64(firstTokens); k < 0.9*want || k > 1.1*want {
			t.Errorf("%s: %s sends %.2f times %s's tokens, want %v ± 10%%", pair[1], other, k, first, want)
		}
		if ba.span != bf.span {
			t.Errorf("%s: span %v, %s: %v", pair[1], bf.span, pair[0], ba.span)
		}
		t.Logf("%s: %s %d requests %d tokens, %s %d requests %d tokens (%.2f×), span %v",
			pair[1], first, firstN, firstTokens, other, secondN, secondTokens, float64(secondTokens)/float64(firstTokens), bf.span)
	}
	r := scenario(t, "tenants_flood")
	b, _ := Build(r, 1)
	if x, y := b.reqs[0][0], b.reqs[len(b.reqs)-1][0]; x.Tenant != "light" || y.Tenant != "heavy" || x.Priority != "" || x.Text == y.Text {
		t.Errorf("tenants: first %q/%q, last %q/%q", x.Tenant, x.Priority, y.Tenant, y.Priority)
	}
	p := scenario(t, "priority_flood")
	b, _ = Build(p, 1)
	if x, y := b.reqs[0][0], b.reqs[len(b.reqs)-1][0]; x.Priority != "interactive" || y.Priority != "batch" || x.Tenant != "" || y.Tenant != "" {
		t.Errorf("priority: first %q/%q, last %q/%q", x.Tenant, x.Priority, y.Tenant, y.Priority)
	}
}

// Per-class figures add up to the policy's; shed requests are in no latency and in neither
// throughput nor goodput.
func TestClassFigures(t *testing.T) {
	sc := scenario(t, "priority_flood")
	sc.Requests = 600
	b, err := Build(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{limit: 4}
	res := Run(sc, b, 1, 30, g)
	f := Measure(res, 50*time.Millisecond)
	if len(f.Classes) != 2 || f.Classes["interactive"] == nil || f.Classes["batch"] == nil {
		t.Fatalf("classes %v", f.Classes)
	}
	var thr, good, shed float64
	unserved, sent := 0, 0
	for name, c := range f.Classes {
		if !math.IsNaN(float64(c.Imbalance)) || c.Classes != nil {
			t.Errorf("%s: imbalance %v, classes %v", name, c.Imbalance, c.Classes)
		}
		thr += float64(c.Throughput)
		good += float64(c.Goodput)
		shed += float64(c.Shed)
		unserved += c.Unserved
		sent += c.sent
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9*max(1, b) }
	if !near(thr, float64(f.Throughput)) || !near(good, float64(f.Goodput)) || !near(shed, float64(f.Shed)) || unserved != f.Unserved || sent != f.sent {
		t.Errorf("classes add up to %v %v %v %d %d, the policy has %v %v %v %d %d", thr, good, shed, unserved, sent,
			f.Throughput, f.Goodput, f.Shed, f.Unserved, f.sent)
	}
	if !(f.Shed > 0) || !(f.Classes["interactive"].Shed > 0) {
		t.Errorf("the gate shed nothing: %v", f.Shed)
	}
	// A shed request is answered by nobody: no first token, no engine.
	for _, r := range res.Requests {
		if r.Shed && (r.FirstToken != 0 || r.Engine >= 0) {
			t.Fatalf("shed request %d has a first token at %v on engine %d", r.ID, r.FirstToken, r.Engine)
		}
	}
}

// Only the scenarios whose requests have classes have "classes" in the card; those have one
// per class for every policy, and kv_flow runs there only.
func TestClassesOnlyWhereThereAreClasses(t *testing.T) {
	card, err := RunCard(Options{Scenarios: regexp.MustCompile(`^(chat-80|tenants_flood)$`), Seeds: 1, MaxRequests: 300,
		Policies: []Policy{policy(t, "least_conn"), policy(t, "kv_cache_aware")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range card.Scenarios {
		for name, f := range s.Policies {
			switch {
			case s.Name == "chat-80" && f.Classes != nil:
				t.Errorf("chat-80 %s has classes %v", name, f.Classes)
			case s.Name == "tenants_flood" && (len(f.Classes) != 2 || f.Classes["light"] == nil || f.Classes["heavy"] == nil):
				t.Errorf("tenants_flood %s: classes %v", name, f.Classes)
			}
		}
	}
	js, err := card.JSON()
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(js, []byte(`"classes"`)); n != 3 {
		t.Errorf("%d \"classes\" in the card, want 3 (tenants_flood's two policies and kv_flow)", n)
	}
	for _, s := range card.Scenarios {
		if _, ok := s.Policies["kv_flow"]; ok != (s.Name == "tenants_flood") {
			t.Errorf("%s: kv_flow ran: %v", s.Name, ok)
		}
	}
	if !bytes.Contains(js, []byte(`"light": {`)) || !bytes.Contains(js, []byte(`"imbalance": null`)) {
		t.Errorf("the card lacks the light class or a class's null imbalance:\n%s", js)
	}
}

// flowChecked wraps kv_flow and checks, at every answer of Route, the flow-control contract:
// a request goes only to an engine that is not full; a batch request never goes while an
// interactive one waits (one model); a held request is shed exactly at its band's timeout;
// and no event ends with a free slot and requests waiting (work-conserving: checked at the
// next call at a later time, and at the end). It counts what it saw.
type flowChecked struct {
	*kvRouter
	t                       *testing.T
	released, shed, blocked int
	routedAt                map[int]time.Duration
	strandedAt              time.Duration // a call left a free slot and requests waiting (-1: none)
}

func (c *flowChecked) waiting() int {
	n := c.queue.Len()
	if c.fc.pick != nil {
		n++
	}
	return n
}

func (c *flowChecked) Route(now time.Duration, r *Request) int {
	at := int64(now)
	if c.strandedAt >= 0 && now > c.strandedAt {
		c.t.Fatalf("%v: a slot was left free with %d requests waiting", c.strandedAt, c.waiting())
	}
	held := c.items[r.ID] != nil
	interactive := c.queue.LenBand(0)
	if p := c.fc.pick; p != nil && p.Band == 0 {
		interactive++
	}
	full := make([]bool, len(c.up))
	for i := range c.up {
		full[i] = c.full(i, at)
	}
	i := c.kvRouter.Route(now, r)
	switch {
	case i >= 0:
		c.routedAt[r.ID] = now
		if held {
			c.released++
		}
		if full[i] {
			c.t.Fatalf("%v: request %d went to engine %d, full (%d in flight before, %d slots)", now, r.ID, i, c.up[i].inFlight-1, c.up[i].slotCount)
		}
		if r.Priority == "batch" && interactive > 0 {
			c.t.Fatalf("%v: batch request %d went while %d interactive wait", now, r.ID, interactive)
		}
	case i == Shed && held:
		c.shed++
		if want := c.fc.bands[c.fc.band(r.Priority)].timeout; now-r.Arrival != want {
			c.t.Fatalf("request %d (%q) shed after %v, its band's timeout is %v", r.ID, r.Priority, now-r.Arrival, want)
		}
	case i == Wait && held && !c.anyFree(at):
		c.blocked++
	}
	c.strandedAt = -1
	if c.waiting() > 0 && c.anyFree(at) {
		c.strandedAt = now
	}
	return i
}

func flowRun(t *testing.T, name string, requests int) (*flowChecked, *Result) {
	t.Helper()
	sc := scenario(t, name)
	if requests > 0 {
		sc.Requests = requests
	}
	b, err := Build(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	capacity, _, err := Calibrate(scenario(t, "chat-50"))
	if err != nil {
		t.Fatal(err)
	}
	c := &flowChecked{kvRouter: FlowPolicy(decide.DefaultRule).New(1).(*kvRouter), t: t, routedAt: map[int]time.Duration{}, strandedAt: -1}
	res := Run(sc, b, 1, sc.Load*capacity, c)
	if c.strandedAt >= 0 && c.strandedAt < res.End {
		t.Fatalf("%v: a slot was left free with %d requests waiting", c.strandedAt, c.waiting())
	}
	return c, res
}

// kv_flow on the floods: the contract above at every answer; every request is answered,
// shed, or still waiting at the horizon, never two of these.
func TestFlowContract(t *testing.T) {
	for _, name := range []string{"tenants_flood", "priority_flood"} {
		c, res := flowRun(t, name, 0)
		waited, unserved := 0, 0
		for _, r := range res.Requests {
			at, routed := c.routedAt[r.ID]
			switch {
			case r.Shed && routed:
				t.Fatalf("%s: request %d shed and routed", name, r.ID)
			case routed && (r.Engine < 0 || r.Routed != at):
				t.Fatalf("%s: request %d routed at %v, recorded %v on engine %d", name, r.ID, at, r.Routed, r.Engine)
			case !routed && !r.Shed:
				if r.Done != 0 || r.Engine >= 0 {
					t.Fatalf("%s: request %d neither routed nor shed but done at %v", name, r.ID, r.Done)
				}
				unserved++
			}
			if routed && r.Routed > r.Arrival {
				waited++
			}
		}
		if c.released < waited || waited == 0 || c.blocked == 0 {
			t.Errorf("%s: %d released from the queue, %d requests waited, %d offers found the fleet full", name, c.released, waited, c.blocked)
		}
		if name == "tenants_flood" && c.shed == 0 {
			t.Errorf("%s: nothing shed at the 10 s timeout", name)
		}
		t.Logf("%s: %d released, %d shed at their timeout, %d unserved at the horizon, %d offers found the fleet full", name, c.released, c.shed, unserved, c.blocked)
	}
}

// With flow control and a fleet at 80% of capacity or less, the router's queue wait p99 is
// at most 1 ms (issue 35): requests wait only while every engine is saturated.
func TestFlowQueueWaitBelowCapacity(t *testing.T) {
	for _, name := range []string{"chat-80", "tenants_alone", "priority_alone"} {
		sc := scenario(t, name)
		b, err := Build(sc, 1)
		if err != nil {
			t.Fatal(err)
		}
		capacity, slo, err := Calibrate(scenario(t, "chat-50"))
		if err != nil {
			t.Fatal(err)
		}
		res := Run(sc, b, 1, sc.Load*capacity, FlowPolicy(decide.DefaultRule).New(1))
		f := Measure(res, slo)
		if !(f.QueueWaitP99 <= 1) || f.Unserved != 0 || f.Shed != 0 {
			t.Errorf("%s: queue wait p99 %v ms, %d unserved, shed %v", name, f.QueueWaitP99, f.Unserved, f.Shed)
		}
		t.Logf("%s: queue wait p99 %v ms, TTFT p99 %v ms", name, f.QueueWaitP99, f.TTFTP99)
	}
}

// The batch slots kv_flow holds requests at are learned from the engines' readings
// (decide.Slots): a reading with requests waiting is a sample of the capacity, and while the
// router holds requests a reading running the figure keeps it (ObserveHeld). With no margin
// the router never lets an engine run more than the figure, so a figure learned low (a queue
// formed below max_num_seqs: the token budget, KV room) is not corrected; with a margin of
// one request (KVSettings.HoldMargin) the engines run past it and every engine's figure
// reaches its max_num_seqs (docs/simulator.md).
func TestFlowSlotsLearned(t *testing.T) {
	sc := scenario(t, "priority_flood")
	b, err := Build(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	capacity, _, err := Calibrate(scenario(t, "chat-50"))
	if err != nil {
		t.Fatal(err)
	}
	for _, margin := range []int64{0, 1} {
		k := FlowPolicy(decide.DefaultRule, func(s *KVSettings) { s.HoldMargin = margin }).New(1).(*kvRouter)
		Run(sc, b, 1, sc.Load*capacity, k)
		var slots []int64
		for i := range k.up {
			slots = append(slots, k.up[i].slotCount)
		}
		t.Logf("margin %d: slots learned %v (max_num_seqs %d)", margin, slots, sc.Engines[0].MaxNumSeqs)
		for i, n := range slots {
			if n <= 0 || n > int64(sc.Engines[i].MaxNumSeqs) || (margin == 1 && n != int64(sc.Engines[i].MaxNumSeqs)) {
				t.Errorf("margin %d: engine %d's slots learned %d, max_num_seqs %d", margin, i, n, sc.Engines[i].MaxNumSeqs)
			}
		}
	}
}

// A tenant is charged at dispatch, as pending, the router's estimate of the prompt tokens plus
// the output weight times the output expected (expected_tokens before a mean output is
// learned, at most max_tokens), and the charge is settled at the answer's usage; an aborted
// request at its estimate (no usage to settle it with).
func TestFlowCharges(t *testing.T) {
	k := FlowPolicy(decide.DefaultRule).New(1).(*kvRouter)
	k.Start([]EngineInfo{{ID: "engine-0", Model: "m"}})
	r := &Request{ID: 7, Model: "m", Tenant: "a", Text: strings.Repeat("word ", 400), Output: 50}
	r.Chars = len(r.Text)
	if i := k.Route(time.Second, r); i != 0 {
		t.Fatalf("Route = %d, want engine 0 (no slots learned: never full)", i)
	}
	est := float64(k.tokensOf("m", int64(r.Chars))) + kvFlowOutputWeight*50
	if settled, pending := k.queue.Served("a"); settled != 0 || pending != est || est != 500+100 {
		t.Fatalf("charged %v (+%v settled) at dispatch, want the estimate %v pending (500 prompt tokens at 4 chars per token + 2 × 50)", pending, settled, est)
	}
	k.Done(2*time.Second, r, 0, Usage{PromptTokens: 480, CompletionTokens: 30, FirstToken: time.Second + time.Millisecond})
	if settled, pending := k.queue.Served("a"); settled != 480.0+kvFlowOutputWeight*30 || pending != 0 {
		t.Fatalf("served %v (+%v pending) after the answer, want its usage %v", settled, pending, 480.0+kvFlowOutputWeight*30)
	}
	// max_tokens above expected_tokens: charged at expected_tokens (256).
	r2 := &Request{ID: 8, Model: "m", Tenant: "a", Text: r.Text, Chars: r.Chars, Output: 100000}
	k.Route(3*time.Second, r2)
	if _, pending := k.queue.Served("a"); pending != 500+kvFlowOutputWeight*256 {
		t.Fatalf("charged %v for max_tokens 100000, want 500 + 2 × 256 (expected_tokens)", pending)
	}
	k.Done(4*time.Second, r2, 0, Usage{Aborted: true})
	if settled, pending := k.queue.Served("a"); settled != 540+500+kvFlowOutputWeight*256 || pending != 0 {
		t.Fatalf("served %v (+%v pending) after an aborted request, want %v", settled, pending, 540+500+kvFlowOutputWeight*256)
	}
	if len(k.fc.charged) != 0 {
		t.Errorf("charges left: %v", k.fc.charged)
	}
}
