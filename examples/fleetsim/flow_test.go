package fleetsim

import (
	"bytes"
	"math"
	"regexp"
	"testing"
	"time"
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
		unserved += c.unserved
		sent += c.sent
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9*max(1, b) }
	if !near(thr, float64(f.Throughput)) || !near(good, float64(f.Goodput)) || !near(shed, float64(f.Shed)) || unserved != f.unserved || sent != f.sent {
		t.Errorf("classes add up to %v %v %v %d %d, the policy has %v %v %v %d %d", thr, good, shed, unserved, sent,
			f.Throughput, f.Goodput, f.Shed, f.unserved, f.sent)
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
// per class for every policy.
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
	if n := bytes.Count(js, []byte(`"classes"`)); n != 2 {
		t.Errorf("%d \"classes\" in the card, want 2 (tenants_flood's two policies)", n)
	}
	if !bytes.Contains(js, []byte(`"light": {`)) || !bytes.Contains(js, []byte(`"imbalance": null`)) {
		t.Errorf("the card lacks the light class or a class's null imbalance:\n%s", js)
	}
}
