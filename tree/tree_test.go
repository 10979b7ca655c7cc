package tree

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// The cases below follow the behaviours tested by SGLang's router tree (tree.rs), restated
// for this API: Match reports every tenant, not one arbitrary tenant of the deepest node.

func TestColdStart(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	for range 3 {
		m := match(tr, "hello")
		if m.Runes != 5 || len(m.Tenants) != 0 {
			t.Fatalf("cold match = %s, want {Runes:5}", showMatch(m))
		}
	}
	if got := f.Tenants(); len(got) != 0 {
		t.Fatalf("matching registered tenants %v", got)
	}
	check(t, f)
}

func TestExactMatch(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	pairs := [][2]string{{"hello", "t1"}, {"apple", "t2"}, {"banana", "t3"}}
	for _, p := range pairs {
		tr.Insert(p[0], p[1])
		check(t, f)
	}
	for _, p := range pairs {
		if tn, n := top(tr, p[0]); tn != p[1] || n != len(p[0]) {
			t.Errorf("match %q = %s %d, want %s %d", p[0], tn, n, p[1], len(p[0]))
		}
	}
}

func TestPartialMatch(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	texts := []string{"apple", "apabc", "acbdeds"}
	for _, s := range texts {
		tr.Insert(s, "t0")
		check(t, f)
	}
	for _, s := range texts {
		if tn, n := top(tr, s); tn != "t0" || n != len(s) {
			t.Errorf("match %q = %s %d", s, tn, n)
		}
	}
	for _, c := range []struct {
		text  string
		runes int
	}{{"ap", 2}, {"apx", 2}, {"apcxyz", 2}, {"acb", 3}, {"b", 0}, {"applesauce", 5}} {
		m := match(tr, c.text)
		got := 0
		if len(m.Tenants) > 0 {
			got = m.Tenants[0].Runes
		}
		if got != c.runes || m.Runes != len(c.text) {
			t.Errorf("match %q = %s, want %d of %d", c.text, showMatch(m), c.runes, len(c.text))
		}
	}
}

func TestGroupPrefix(t *testing.T) {
	prefixes := []string{
		"Clock strikes midnight, I'm still wide awake",
		"Got dreams bigger than these city lights",
		"Time waits for no one, gotta make my move",
		"Started from the bottom, that's no metaphor",
	}
	suffixes := []string{
		"Got too much to prove, ain't got time to lose",
		"History in the making, yeah, you can't erase this",
	}
	f := newTestForest(Limits{})
	tr := f.Tree("")
	for i, p := range prefixes {
		for _, s := range suffixes {
			tr.Insert(p+" "+s, fmt.Sprint("tenant", i))
		}
	}
	check(t, f)
	for i, p := range prefixes {
		if tn, n := top(tr, p); tn != fmt.Sprint("tenant", i) || n != len(p) {
			t.Errorf("match %q = %s %d", p, tn, n)
		}
	}
}

func TestUTF8(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	pairs := [][2]string{{"你好嗎", "t1"}, {"你好喔", "t2"}, {"你心情好嗎", "t3"}}
	for _, p := range pairs {
		tr.Insert(p[0], p[1])
		check(t, f)
	}
	for _, p := range pairs {
		runes := len([]rune(p[0]))
		if tn, n := top(tr, p[0]); tn != p[1] || n != runes {
			t.Errorf("match %q = %s %d, want %s %d", p[0], tn, n, p[1], runes)
		}
	}
	// 你好 is held by t1 and t2 (t2 more recent), 你 by all three.
	m := match(tr, "你好")
	want := "{Runes:2 t2:2 t1:2 t3:1}"
	if got := showMatch(m); got != want {
		t.Errorf("match 你好 = %s, want %s", got, want)
	}
	if got := tr.TenantChars("t3"); got != 5 {
		t.Errorf("t3 chars %d, want 5", got)
	}
}

func TestMatchCounts(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	tr.Insert("hello world", "t1")
	tr.Insert("你好世界呀", "t1")
	tr.Insert("hello你好", "t2")
	tr.Insert("hello 👋", "t3")
	tr.Insert("hello 👋🌍", "t4")
	check(t, f)
	for _, c := range []struct {
		text           string
		matched, runes int
	}{
		{"hello world", 11, 11},
		{"hello", 5, 5},
		{"hello world and more", 11, 20},
		{"goodbye", 0, 7},
		{"你好世界呀", 5, 5},
		{"你好", 2, 2},
		{"hello你好世界", 7, 9},
		{"hello 👋", 7, 7},
		{"hello 👋🌍", 8, 8},
		{"hello 👋🌎", 7, 8},
		{"", 0, 0},
	} {
		m := match(tr, c.text)
		got := 0
		if len(m.Tenants) > 0 {
			got = m.Tenants[0].Runes
		}
		if got != c.matched || m.Runes != c.runes {
			t.Errorf("match %q = %s, want %d of %d", c.text, showMatch(m), c.matched, c.runes)
		}
	}
}

func TestSpecialCharacters(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	cases := [][2]string{
		{"hello\nworld", "t1"},
		{"hello\tworld", "t2"},
		{"hello\x00world", "t3"},
		{"hello\u00a0world", "t4"},
		{"path/to/file", "t5"},
		{"query?param=value", "t6"},
		{"\x00\x00\n", "t7"},
		{"\x00", "t8"},
	}
	for _, c := range cases {
		tr.Insert(c[0], c[1])
		check(t, f)
	}
	for _, c := range cases {
		runes := len([]rune(c[0]))
		if tn, n := top(tr, c[0]); tn != c[1] || n != runes {
			t.Errorf("match %q = %s %d, want %s %d", c[0], tn, n, c[1], runes)
		}
	}
}

func TestInvalidUTF8(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	// Each invalid byte is one rune.
	tr.Insert("a\xff\xfeb", "t1")
	if m := match(tr, "a\xff\xfeb"); m.Runes != 4 || m.Tenants[0].Runes != 4 {
		t.Errorf("invalid bytes: %s", showMatch(m))
	}
	// A valid U+FFFD is not an invalid byte, though both decode to RuneError.
	if m := match(tr, "a\uFFFD"); m.Runes != 2 || m.Tenants[0].Runes != 1 {
		t.Errorf("U+FFFD vs invalid byte: %s", showMatch(m))
	}
	// A truncated encoding at the end of a stored text is one rune per byte, and not a
	// prefix of the full encoding.
	tr.Insert("xy\xe4\xbd", "t2")
	check(t, f)
	for _, c := range []struct {
		text           string
		matched, runes int
	}{
		{"xy\xe4\xbd", 4, 4},
		{"xy\xe4\xbd\xa0", 2, 3}, // xy你
		{"xy\xe4\xbdz", 4, 5},
		{"xy\xe4", 3, 3},
		{"xy\xe4z", 3, 4},
	} {
		m := match(tr, c.text)
		got := 0
		if len(m.Tenants) > 0 {
			got = m.Tenants[0].Runes
		}
		if got != c.matched || m.Runes != c.runes {
			t.Errorf("match %q = %s, want %d of %d", c.text, showMatch(m), c.matched, c.runes)
		}
		if mt := tr.MatchTenant(c.text, "t2"); mt != c.matched {
			t.Errorf("MatchTenant(%q) = %d, want %d", c.text, mt, c.matched)
		}
	}
	// Inserting the complete encoding splits before the truncated one.
	tr.Insert("xy\xe4\xbd\xa0!", "t3")
	check(t, f)
	if m := showMatch(match(tr, "xy\xe4\xbd\xa0!")); m != "{Runes:4 t3:4 t2:2}" {
		t.Errorf("after full encoding: %s", m)
	}
	if m := showMatch(match(tr, "xy\xe4\xbd")); m != "{Runes:4 t2:4 t3:2}" {
		t.Errorf("truncated after full encoding: %s", m)
	}
}

func TestSplits(t *testing.T) {
	t.Run("first character", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		tr.Insert("abc", "t1")
		tr.Insert("aXX", "t2")
		check(t, f)
		for _, c := range [][3]string{{"abc", "t1", "3"}, {"aXX", "t2", "3"}, {"a", "t2", "1"}} {
			if tn, n := top(tr, c[0]); tn != c[1] || fmt.Sprint(n) != c[2] {
				t.Errorf("match %q = %s %d", c[0], tn, n)
			}
		}
	})
	t.Run("last character", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		tr.Insert("abcd", "t1")
		tr.Insert("abcX", "t2")
		check(t, f)
		for _, c := range [][3]string{{"abcd", "t1", "4"}, {"abcX", "t2", "4"}, {"abc", "t2", "3"}} {
			if tn, n := top(tr, c[0]); tn != c[1] || fmt.Sprint(n) != c[2] {
				t.Errorf("match %q = %s %d", c[0], tn, n)
			}
		}
		if got := tr.Chars(); got != 5 {
			t.Errorf("chars %d, want 5", got)
		}
	})
	t.Run("repeated on one path", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		tr.Insert("abcdefgh", "t1")
		tr.Insert("abcdef", "t2")
		tr.Insert("abcd", "t3")
		tr.Insert("ab", "t4")
		check(t, f)
		for _, s := range []string{"abcdefgh", "abcdef", "abcd", "ab", "a"} {
			if m := match(tr, s); m.Tenants[0].Runes != len(s) {
				t.Errorf("match %q = %s", s, showMatch(m))
			}
		}
		want := "{Runes:8 t1:8 t2:6 t3:4 t4:2}"
		if got := showMatch(match(tr, "abcdefgh")); got != want {
			t.Errorf("match abcdefgh = %s, want %s", got, want)
		}
		if tr.Chars() != 8 || tr.TenantChars("t1") != 8 || tr.TenantChars("t4") != 2 {
			t.Errorf("chars %d t1 %d t4 %d", tr.Chars(), tr.TenantChars("t1"), tr.TenantChars("t4"))
		}
	})
	t.Run("prefix of existing", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		tr.Insert("application", "t1")
		tr.Insert("app", "t2")
		check(t, f)
		if got := showMatch(match(tr, "app")); got != "{Runes:3 t2:3 t1:3}" {
			t.Errorf("match app = %s", got)
		}
		if tn, n := top(tr, "application"); tn != "t1" || n != 11 {
			t.Errorf("match application = %s %d", tn, n)
		}
		if got := showMatch(match(tr, "apple")); got != "{Runes:5 t1:4 t2:3}" {
			t.Errorf("match apple = %s", got)
		}
	})
	t.Run("existing is prefix", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		tr.Insert("app", "t1")
		tr.Insert("application", "t2")
		check(t, f)
		if got := showMatch(match(tr, "app")); got != "{Runes:3 t2:3 t1:3}" {
			t.Errorf("match app = %s", got)
		}
		if got := showMatch(match(tr, "applesauce")); got != "{Runes:10 t2:4 t1:3}" {
			t.Errorf("match applesauce = %s", got)
		}
		if got := tr.Chars(); got != 11 {
			t.Errorf("chars %d, want 11", got)
		}
	})
}

func TestSingleCharacters(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	tr.Insert("a", "t1")
	tr.Insert("b", "t2")
	tr.Insert("c", "t1")
	check(t, f)
	for _, c := range [][3]string{{"a", "t1", "1"}, {"b", "t2", "1"}, {"abc", "t1", "1"}} {
		if tn, n := top(tr, c[0]); tn != c[1] || fmt.Sprint(n) != c[2] {
			t.Errorf("match %q = %s %d", c[0], tn, n)
		}
	}
}

func TestEmptyString(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	tr.Insert("", "t1")
	if m := match(tr, ""); m.Runes != 0 || len(m.Tenants) != 0 {
		t.Errorf("match empty = %s", showMatch(m))
	}
	if tr.Chars() != 0 || f.Chars() != 0 {
		t.Errorf("empty insert stored %d chars", tr.Chars())
	}
	tr.Insert("hello", "t2")
	if m := match(tr, ""); m.Runes != 0 || len(m.Tenants) != 0 {
		t.Errorf("match empty = %s", showMatch(m))
	}
	if got := tr.MatchTenant("", "t2"); got != 0 {
		t.Errorf("MatchTenant empty = %d", got)
	}
	check(t, f)
}

func TestTenantChars(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	steps := []struct {
		text, tenant string
		want         map[string]int64
	}{
		{"hello", "t1", map[string]int64{"t1": 5}},
		{"world", "t1", map[string]int64{"t1": 10}},
		{"hello", "t2", map[string]int64{"t1": 10, "t2": 5}},
		{"help", "t2", map[string]int64{"t1": 10, "t2": 6}},
		{"你好", "t3", map[string]int64{"t1": 10, "t2": 6, "t3": 2}},
	}
	for _, s := range steps {
		tr.Insert(s.text, s.tenant)
		check(t, f)
		for tn, want := range s.want {
			if got := tr.TenantChars(tn); got != want {
				t.Errorf("after %q: %s chars %d, want %d", s.text, tn, got, want)
			}
		}
	}
	if got := tr.Chars(); got != 13 {
		t.Errorf("tree chars %d, want 13 (hel lo p world 你好)", got)
	}

	// The SGLang phases: many overlapping inserts, counts recomputed after each.
	f = newTestForest(Limits{})
	tr = f.Tree("")
	for _, p := range [][2]string{
		{"apple", "t1"}, {"apricot", "t1"}, {"banana", "t1"}, {"amplify", "t2"}, {"application", "t2"},
		{"apartment", "t1"}, {"appetite", "t2"}, {"ball", "t1"}, {"box", "t2"},
		{"zebra", "t1"}, {"zebra", "t2"}, {"zero", "t1"}, {"zero", "t2"},
	} {
		tr.Insert(p[0], p[1])
		check(t, f)
	}
	f.SetLimits(Limits{TenantMaxChars: map[string]int64{"t1": 10, "t2": 10}})
	check(t, f)
	for _, tn := range []string{"t1", "t2"} {
		if got := tr.TenantChars(tn); got > 10 {
			t.Errorf("%s holds %d chars after eviction to 10", tn, got)
		}
	}
}

func TestMatchTenant(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	tr.Insert("hello", "t1")
	tr.Insert("hello", "t2")
	tr.Insert("hello world", "t2")
	tr.Insert("help", "t1")
	tr.Insert("helicopter", "t2")
	check(t, f)
	for _, c := range []struct {
		text, tenant string
		want         int
	}{
		{"hello", "t1", 5},
		{"help", "t1", 4},
		{"hel", "t1", 3},
		{"hello world", "t1", 5},
		{"helicopter", "t1", 3},
		{"hello", "t2", 5},
		{"hello world", "t2", 11},
		{"helicopter", "t2", 10},
		{"hel", "t2", 3},
		{"help", "t2", 3},
		{"hello", "t3", 0},
		{"help", "t3", 0},
		{"helicopters", "t2", 10},
		{"hellx", "t1", 4},
	} {
		if got := tr.MatchTenant(c.text, c.tenant); got != c.want {
			t.Errorf("MatchTenant(%q, %s) = %d, want %d", c.text, c.tenant, got, c.want)
		}
	}
	// Match reports the same numbers in one walk.
	if got := showMatch(match(tr, "hello world")); got != "{Runes:11 t2:11 t1:5}" {
		t.Errorf("match hello world = %s", got)
	}
}

func TestTieBreak(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	tr.Insert("hello", "t1")
	tr.Insert("hello", "t2")
	if got := showMatch(match(tr, "hello")); got != "{Runes:5 t2:5 t1:5}" {
		t.Errorf("after t1, t2: %s", got)
	}
	tr.Insert("hello", "t1")
	if got := showMatch(match(tr, "hello")); got != "{Runes:5 t1:5 t2:5}" {
		t.Errorf("after t1 again: %s", got)
	}
	// An insert through a node counts as use of it, even when it goes further.
	tr.Insert("hello there", "t2")
	if got := showMatch(match(tr, "hello")); got != "{Runes:5 t2:5 t1:5}" {
		t.Errorf("after t2 through: %s", got)
	}
	// Matching is not use.
	for range 3 {
		match(tr, "hello")
		tr.MatchTenant("hello", "t1")
	}
	if got := showMatch(match(tr, "hello")); got != "{Runes:5 t2:5 t1:5}" {
		t.Errorf("after matches: %s", got)
	}
}

// A match lists every tenant of the path, longest first: the caller takes the first it
// accepts (an upstream that is down is skipped, not the whole match lost).
func TestMatchListsEveryTenantLongestFirst(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	tr.Insert("system prompt, question one", "10.0.0.1:8000")
	tr.Insert("system prompt, question two", "10.0.0.2:8000")
	tr.Insert("system", "10.0.0.3:8000")
	m := match(tr, "system prompt, question one!")
	want := []TenantMatch{{"10.0.0.1:8000", 27}, {"10.0.0.2:8000", 24}, {"10.0.0.3:8000", 6}}
	if m.Runes != 28 || !slices.Equal(m.Tenants, want) {
		t.Errorf("match = %s, want Runes 28 and %v", showMatch(m), want)
	}
}

func TestManyTenantsOnePath(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	for i := range 100 {
		tr.Insert("shared_path", fmt.Sprint("tenant", i))
	}
	check(t, f)
	m := match(tr, "shared_path")
	if len(m.Tenants) != 100 {
		t.Fatalf("%d tenants, want 100", len(m.Tenants))
	}
	for i, tm := range m.Tenants {
		if want := fmt.Sprint("tenant", 99-i); tm.Tenant != want || tm.Runes != 11 {
			t.Fatalf("Tenants[%d] = %v, want %s 11", i, tm, want)
		}
	}
	if got := len(f.Tenants()); got != 100 {
		t.Errorf("%d tenants hold chars, want 100", got)
	}
	if tr.Chars() != 11 || f.Chars() != 11 {
		t.Errorf("chars %d, want 11 (stored once)", tr.Chars())
	}
	// Steady state: no allocation.
	if a := testing.AllocsPerRun(100, func() { tr.Match("shared_path", m) }); a != 0 {
		t.Errorf("Match allocates %v times", a)
	}
}

func TestLongStrings(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	var sb strings.Builder
	for i := range 10000 {
		sb.WriteByte(byte('a' + i%26))
	}
	long := sb.String()
	tr.Insert(long, "t1")
	if tn, n := top(tr, long); tn != "t1" || n != 10000 {
		t.Errorf("long match = %s %d", tn, n)
	}
	if m := match(tr, long[:5000]); m.Tenants[0].Runes != 5000 || m.Runes != 5000 {
		t.Errorf("half match = %s", showMatch(m))
	}
	// 10,000 runes of CJK and emoji, split deep inside.
	wide := strings.Repeat("你好👋", 3334)[:len("你好👋")*3333]
	tr.Insert(wide, "t2")
	tr.Insert(wide[:len(wide)/2]+"!", "t3")
	check(t, f)
	if m := match(tr, wide); m.Runes != 9999 || m.Tenants[0].Runes != 9999 {
		t.Errorf("wide match = %s", showMatch(m)[:40])
	}
	if got := tr.MatchTenant(wide, "t3"); got != 9999/2 {
		t.Errorf("t3 holds %d, want %d", got, 9999/2)
	}
}

func TestRemoveTenant(t *testing.T) {
	t.Run("simple", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		tr.Insert("hello", "t1")
		tr.Insert("world", "t1")
		tr.Insert("hello", "t2")
		tr.Insert("help", "t2")
		if tr.TenantChars("t1") != 10 || tr.TenantChars("t2") != 6 {
			t.Fatalf("t1 %d t2 %d", tr.TenantChars("t1"), tr.TenantChars("t2"))
		}
		tr.RemoveTenant("t1")
		check(t, f)
		if tr.TenantChars("t1") != 0 || tr.TenantChars("t2") != 6 {
			t.Errorf("after removal t1 %d t2 %d", tr.TenantChars("t1"), tr.TenantChars("t2"))
		}
		if tr.MatchTenant("hello", "t1") != 0 || tr.MatchTenant("world", "t1") != 0 {
			t.Error("t1 still matches")
		}
		if tr.MatchTenant("hello", "t2") != 5 || tr.MatchTenant("help", "t2") != 4 {
			t.Error("t2 lost its text")
		}
		if got := showMatch(match(tr, "world")); got != "{Runes:5}" {
			t.Errorf("world still stored: %s", got)
		}
		if tr.Chars() != 6 {
			t.Errorf("chars %d, want 6", tr.Chars())
		}
	})
	t.Run("complex", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		for _, p := range [][2]string{
			{"apple", "t1"}, {"application", "t1"}, {"apple", "t2"}, {"appetite", "t2"},
			{"banana", "t1"}, {"banana", "t2"}, {"ball", "t2"},
		} {
			tr.Insert(p[0], p[1])
		}
		tr.RemoveTenant("t1")
		check(t, f)
		for _, s := range []string{"apple", "application", "banana"} {
			if tr.MatchTenant(s, "t1") != 0 {
				t.Errorf("t1 still holds %q", s)
			}
		}
		for _, s := range []string{"apple", "appetite", "banana", "ball"} {
			if got := tr.MatchTenant(s, "t2"); got != len(s) {
				t.Errorf("t2 holds %d of %q", got, s)
			}
		}
		if got := tr.TenantChars("t2"); got != 5+5+6+2 {
			t.Errorf("t2 chars %d, want 18", got)
		}
		if got := tr.Chars(); got != 18 {
			t.Errorf("chars %d, want 18", got)
		}
		if got := f.Tenants(); len(got) != 1 || got[0] != "t2" {
			t.Errorf("Tenants = %v", got)
		}
	})
	t.Run("stale tie cache", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		tr.Insert("hello", "t1")
		tr.Insert("hello", "t2")
		match(tr, "hello")
		tr.RemoveTenant("t2")
		if got := showMatch(match(tr, "hello")); got != "{Runes:5 t1:5}" {
			t.Errorf("after removal: %s", got)
		}
	})
	t.Run("rapid cycles", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		for cycle := range 50 {
			tn := fmt.Sprint("tenant", cycle%5)
			for i := range 10 {
				tr.Insert(fmt.Sprintf("cycle%dentry%d", cycle, i), tn)
			}
			f.RemoveTenant(tn)
			if tr.TenantChars(tn) != 0 || f.TenantChars(tn) != 0 {
				t.Fatalf("cycle %d: %s still holds chars", cycle, tn)
			}
			check(t, f)
		}
		if f.Chars() != 0 || len(f.Tenants()) != 0 {
			t.Errorf("left %d chars, tenants %v", f.Chars(), f.Tenants())
		}
	})
	t.Run("unknown", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		tr.Insert("hello", "t1")
		tr.RemoveTenant("nobody")
		f.RemoveTenant("nobody")
		check(t, f)
		if tr.Chars() != 5 {
			t.Error("removing an unknown tenant changed the tree")
		}
	})
}

func TestConsistencyAfterOperations(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	for i := range 50 {
		tr.Insert(fmt.Sprint("prefix", i), "t1")
		tr.Insert(fmt.Sprint("other", i), "t2")
	}
	check(t, f)
	for i := range 25 {
		tr.Insert(fmt.Sprint("prefix", i), "t2")
	}
	check(t, f)
	f.SetLimits(Limits{TenantMaxChars: map[string]int64{"t1": 100, "t2": 100}})
	check(t, f)
	tr.RemoveTenant("t1")
	check(t, f)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		tr.Insert(fmt.Sprint("key", rng.IntN(50)), fmt.Sprint("t", rng.IntN(4)))
	}
	check(t, f)
}
