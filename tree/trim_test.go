package tree

import (
	"fmt"
	"strings"
	"testing"
)

func TestTrim(t *testing.T) {
	sys := strings.Repeat("s", 100)
	a := sys + strings.Repeat("a", 50)
	b := sys + strings.Repeat("b", 50)
	c := sys[:40] + strings.Repeat("c", 60)
	cases := []struct {
		name      string
		keep      int
		budget    int
		wantB     int // B's runes the tenant holds afterwards
		wantC     int
		wantChars int64
	}{
		// b leaves a's path at 100, c at 40.
		{"below both branches", 0, 100, 100, 40, 50 + 60},
		{"below b only", 60, 100, 100, 100, 50},
		{"nothing below the keep depth", 101, 100, 150, 100, 0},
		{"no budget", 0, 0, 150, 100, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestForest(Limits{})
			tr := f.Tree("m")
			for _, s := range []string{a, b, c} {
				tr.Insert(s, "u1")
			}
			tr.Insert(b, "u2")
			got := tr.Trim(a, "u1", tc.keep, tc.budget)
			check(t, f)
			if got != tc.wantChars {
				t.Errorf("Trim removed %d chars, want %d", got, tc.wantChars)
			}
			if m := tr.MatchTenant(a, "u1"); m != len([]rune(a)) {
				t.Errorf("the trimmed prompt's own path: u1 holds %d runes, want all %d", m, len([]rune(a)))
			}
			if m := tr.MatchTenant(b, "u1"); m != tc.wantB {
				t.Errorf("b: u1 holds %d runes, want %d", m, tc.wantB)
			}
			if m := tr.MatchTenant(c, "u1"); m != tc.wantC {
				t.Errorf("c: u1 holds %d runes, want %d", m, tc.wantC)
			}
			if m := tr.MatchTenant(b, "u2"); m != len(b) {
				t.Errorf("another tenant lost its claim: u2 holds %d of b, want %d", m, len(b))
			}
			if tc.wantChars > 0 && f.TenantChars("u1") != int64(150+50+60)-tc.wantChars {
				t.Errorf("u1 charged %d chars, want %d", f.TenantChars("u1"), int64(260)-tc.wantChars)
			}
		})
	}
}

// TestTrimBudget: a branch larger than the budget loses its deepest nodes first, and the
// tenant's nodes still hang from the root (check verifies it).
func TestTrimBudget(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("m")
	sys := strings.Repeat("s", 64)
	tr.Insert(sys+"keep", "u")
	for i := range 200 {
		tr.Insert(fmt.Sprintf("%sother %03d tail", sys, i), "u")
	}
	before := f.TenantChars("u")
	removed := tr.Trim(sys+"keep", "u", 64, 10)
	check(t, f)
	if removed <= 0 || removed >= before/2 {
		t.Fatalf("Trim with a budget of 10 nodes removed %d of %d chars: want a few nodes' worth", removed, before)
	}
	if got := f.TenantChars("u"); got != before-removed {
		t.Fatalf("tenant chars %d, want %d", got, before-removed)
	}
	// Repeated trims eventually clear every branch but the kept path.
	for range 200 {
		tr.Trim(sys+"keep", "u", 64, 10)
	}
	check(t, f)
	if got, want := f.TenantChars("u"), int64(len(sys+"keep")); got != want {
		t.Fatalf("after repeated trims the tenant holds %d chars, want its kept path's %d", got, want)
	}
}

func TestTrimUnknown(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("m")
	tr.Insert("hello world", "u")
	if n := tr.Trim("hello", "nobody", 0, 10); n != 0 {
		t.Fatalf("Trim of an unknown tenant removed %d", n)
	}
	if n := tr.Trim("", "u", 0, 10); n != 11 {
		t.Fatalf("Trim of an empty path from depth 0 removed %d chars, want the whole 11", n)
	}
	check(t, f)
}

// BenchmarkTrim: one answer's correction on a tree of many prompts sharing a system prompt,
// with the default budget kvroute uses.
func BenchmarkTrim(b *testing.B) {
	b.ReportAllocs()
	f := NewForest(Limits{})
	tr := f.Tree("m")
	sys := strings.Repeat("system prompt ", 100)
	prompts := make([]string, 4096)
	for i := range prompts {
		prompts[i] = fmt.Sprintf("%suser %d: %s", sys, i, benchText(uint64(i), 512))
		tr.Insert(prompts[i], "u")
	}
	b.ResetTimer()
	for i := range b.N {
		p := prompts[i%len(prompts)]
		tr.Trim(p, "u", len(sys), 64)
		if i%64 == 63 {
			b.StopTimer()
			for _, q := range prompts {
				tr.Insert(q, "u")
			}
			b.StartTimer()
		}
	}
}
