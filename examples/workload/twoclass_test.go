package workload

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

var (
	light = Class{Name: "light", Headers: map[string]string{"X-Tenant": "light"}}
	heavy = Class{Name: "heavy", Headers: map[string]string{"X-Tenant": "heavy"}}
)

// TestTwoClass: the flood has the first class's requests and k times as many of the second,
// each call carrying its class's header (and the session header beside it), sessions named
// and labelled by class; the second class sends over the same span as the first (k times its
// rate) with other system prompts; alone is the flood's first class, call for call and time
// for time.
func TestTwoClass(t *testing.T) {
	cfg := ChatConfig{SessionHeader: "X-Session-ID", Seed: 3}
	const n, k = 96, 10
	flood := TwoClass(cfg, n*(1+k), k, false, light, heavy)
	alone := TwoClass(cfg, n, k, true, light, heavy)
	if flood.Name != "light+heavy" || alone.Name != "light" {
		t.Errorf("names %q, %q", flood.Name, alone.Name)
	}
	calls := map[string]int{}
	firstAt := map[string]time.Duration{}
	last := map[string]time.Duration{}
	systems := map[string]map[string]bool{"light": {}, "heavy": {}}
	ids := map[string]bool{}
	for i, s := range flood.Sessions {
		if want := map[bool]string{true: "light", false: "heavy"}[i < n/8]; s.Class != want || !strings.HasPrefix(s.ID, want+"-") {
			t.Fatalf("session %d: class %q, id %q; want %s first, then heavy", i, s.Class, s.ID, want)
		}
		if ids[s.ID] {
			t.Fatalf("session id %q twice", s.ID)
		}
		ids[s.ID] = true
		for _, c := range s.Calls {
			if c.Headers["X-Tenant"] != s.Class || c.Headers["X-Session-ID"] == "" || len(c.Headers) != 2 {
				t.Fatalf("%s call headers %v", s.ID, c.Headers)
			}
			calls[s.Class]++
			if _, ok := firstAt[s.Class]; !ok || c.At < firstAt[s.Class] {
				firstAt[s.Class] = c.At
			}
			last[s.Class] = max(last[s.Class], c.At)
		}
		systems[s.Class][s.Calls[0].Messages[0].Content] = true
	}
	if calls["light"] != n || calls["heavy"] != k*n {
		t.Errorf("calls %v, want light %d and heavy %d", calls, n, k*n)
	}
	if last["heavy"] != last["light"] {
		t.Errorf("heavy's last call at %v, light's at %v: not the same span", last["heavy"], last["light"])
	}
	for s := range systems["heavy"] {
		if systems["light"][s] {
			t.Errorf("a system prompt shared by both classes")
		}
	}
	if len(alone.Sessions) != n/8 || !reflect.DeepEqual(alone.Sessions, flood.Sessions[:n/8]) {
		t.Errorf("alone (%d sessions) is not the flood's light class", len(alone.Sessions))
	}
	if alone.Span() != last["light"] {
		t.Errorf("alone spans %v, the flood's light class %v", alone.Span(), last["light"])
	}

	prio := TwoClass(cfg, 3*40, 2, false,
		Class{Name: "interactive", Headers: map[string]string{"X-Priority": "interactive"}},
		Class{Name: "batch", Headers: map[string]string{"X-Priority": "batch"}})
	for _, s := range prio.Sessions {
		for _, c := range s.Calls {
			if c.Headers["X-Priority"] != s.Class || c.Headers["X-Tenant"] != "" {
				t.Fatalf("%s: headers %v", s.ID, c.Headers)
			}
		}
	}
	if prio.Calls() != 120 {
		t.Errorf("priority: %d calls, want 120", prio.Calls())
	}
}

// TestTokens: the estimate is chars / 4 of every message plus max_tokens, per call.
func TestTokens(t *testing.T) {
	w := Workload{Sessions: []Session{{Calls: []Call{
		{Messages: []Message{{Content: strings.Repeat("a", 400)}, {Content: strings.Repeat("b", 40)}}, MaxTokens: 7},
		{API: APICompletions, Prompt: strings.Repeat("c", 80), MaxTokens: 3},
	}}}}
	if p, o := w.Tokens(); p != 110+20 || o != 10 {
		t.Errorf("tokens %d prompt, %d output; want 130, 10", p, o)
	}
}
