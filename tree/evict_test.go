package tree

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestEvictSimple(t *testing.T) {
	// SGLang's simple eviction: a per-tenant bound evicts that tenant's oldest leaf only.
	f := newTestForest(Limits{})
	tr := f.Tree("")
	tr.Insert("hello", "t1")
	tr.Insert("hello", "t2")
	tr.Insert("world", "t2")
	if tr.TenantChars("t1") != 5 || tr.TenantChars("t2") != 10 {
		t.Fatalf("t1 %d t2 %d", tr.TenantChars("t1"), tr.TenantChars("t2"))
	}
	f.SetLimits(Limits{TenantMaxChars: map[string]int64{"t1": 5, "t2": 5}})
	check(t, f)
	if tr.TenantChars("t1") != 5 || tr.TenantChars("t2") != 5 {
		t.Errorf("after eviction t1 %d t2 %d, want 5 5", tr.TenantChars("t1"), tr.TenantChars("t2"))
	}
	if got := showMatch(match(tr, "world")); got != "{Runes:5 t2:5}" {
		t.Errorf("match world = %s", got)
	}
	if got := showMatch(match(tr, "hello")); got != "{Runes:5 t1:5}" {
		t.Errorf("match hello = %s", got)
	}
	// The node t1 still holds stays: the forest total does not move.
	if f.Chars() != 10 {
		t.Errorf("forest chars %d, want 10", f.Chars())
	}
}

func TestEvictAdvanced(t *testing.T) {
	// SGLang's advanced eviction: four tenants, shared prefixes, random suffixes, a bound of
	// 100 chars each. Inserts past the bound evict at once, so the bound holds throughout.
	f := newTestForest(Limits{TenantMaxChars: map[string]int64{}})
	limits := Limits{TenantMaxChars: map[string]int64{}}
	for j := range 4 {
		limits.TenantMaxChars[fmt.Sprint("tenant", j+1)] = 100
	}
	f.SetLimits(limits)
	tr := f.Tree("")
	rng := rand.New(rand.NewPCG(7, 7))
	prefixes := []string{"aqwefcisdf", "iajsdfkmade", "kjnzxcvewqe", "iejksduqasd"}
	for range 100 {
		for j, p := range prefixes {
			tn := fmt.Sprint("tenant", j+1)
			tr.Insert(p+randomString(rng, 10), tn)
			if got := tr.TenantChars(tn); got > 100 {
				t.Fatalf("%s holds %d chars, bound 100", tn, got)
			}
		}
	}
	check(t, f)
	for j := range 4 {
		tn := fmt.Sprint("tenant", j+1)
		if got := tr.TenantChars(tn); got < 50 {
			t.Errorf("%s holds %d chars: evicted far below the bound", tn, got)
		}
	}
}

func randomString(rng *rand.Rand, n int) string {
	const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alnum[rng.IntN(len(alnum))]
	}
	return string(b)
}

func TestEvictGlobalLRU(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	tr.Insert("aaaa", "t1")
	tr.Insert("bbbb", "t2")
	tr.Insert("cccc", "t1")
	tr.Insert("aaaa", "t3") // uses aaaa again: bbbb is now the oldest
	match(tr, "bbbb")       // a match is not a use
	if st := f.Evict(); st.Chars != 0 || st.Nodes != 0 {
		t.Errorf("Evict without a bound = %+v", st)
	}
	f.SetLimits(Limits{MaxChars: 10})
	check(t, f)
	// 12 chars over a bound of 10: evict down to 9, one leaf.
	if got := showMatch(match(tr, "bbbb")); got != "{Runes:4}" {
		t.Errorf("bbbb survived: %s", got)
	}
	if got := showMatch(match(tr, "aaaa")); got != "{Runes:4 t3:4 t1:4}" {
		t.Errorf("aaaa = %s", got)
	}
	if got := showMatch(match(tr, "cccc")); got != "{Runes:4 t1:4}" {
		t.Errorf("cccc = %s", got)
	}
	if f.Chars() != 8 || f.TenantChars("t2") != 0 {
		t.Errorf("chars %d, t2 %d", f.Chars(), f.TenantChars("t2"))
	}
	// A tenant left with nothing is forgotten.
	if got := f.Tenants(); strings.Join(got, " ") != "t1 t3" {
		t.Errorf("Tenants = %v", got)
	}
}

func TestEvictStats(t *testing.T) {
	f := newTestForest(Limits{})
	tr := f.Tree("")
	for i := range 10 {
		tr.Insert(fmt.Sprintf("%c%s", 'a'+i, strings.Repeat("x", 9)), "t1") // 10 leaves of 10
	}
	f.storeLimits(Limits{MaxChars: 60})
	st := f.Evict()
	check(t, f)
	// Down to 54: five leaves.
	if st.Chars != 50 || st.Nodes != 5 || f.Chars() != 50 {
		t.Errorf("stats %+v, chars %d; want 50 chars, 5 nodes", st, f.Chars())
	}
	// The oldest five went.
	for i := range 10 {
		s := fmt.Sprintf("%c%s", 'a'+i, strings.Repeat("x", 9))
		if got, want := tr.MatchTenant(s, "t1"), map[bool]int{true: 0, false: 10}[i < 5]; got != want {
			t.Errorf("leaf %d holds %d, want %d", i, got, want)
		}
	}
	if st := f.Evict(); st.Chars != 0 || st.Nodes != 0 {
		t.Errorf("second Evict %+v", st)
	}
}

func TestEvictLowWater(t *testing.T) {
	f := newTestForest(Limits{MaxChars: 100})
	tr := f.Tree("")
	leaf := func(i int) string { return fmt.Sprintf("%c%s", 'a'+i, strings.Repeat("x", 9)) }
	for i := range 10 {
		tr.Insert(leaf(i), "t1")
	}
	if f.Chars() != 100 {
		t.Fatalf("chars %d before crossing the bound", f.Chars())
	}
	// Crossing the bound evicts the two oldest leaves, down to 90.
	tr.Insert(leaf(10), "t1")
	check(t, f)
	if f.Chars() != 90 {
		t.Errorf("chars %d after crossing, want 90", f.Chars())
	}
	for i, want := range map[int]int{0: 0, 1: 0, 2: 10, 10: 10} {
		if got := tr.MatchTenant(leaf(i), "t1"); got != want {
			t.Errorf("leaf %d holds %d, want %d", i, got, want)
		}
	}
}

func TestEvictTenantLeaves(t *testing.T) {
	t.Run("oldest first", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		tr.Insert("aaaa", "t1")
		tr.Insert("bbbb", "t1")
		tr.Insert("cccc", "t1")
		tr.Insert("aaaa", "t1")
		f.SetLimits(Limits{TenantMaxChars: map[string]int64{"t1": 9}})
		check(t, f)
		if tr.MatchTenant("bbbb", "t1") != 0 || tr.MatchTenant("aaaa", "t1") != 4 || tr.MatchTenant("cccc", "t1") != 4 {
			t.Errorf("wrong leaf evicted: a %d b %d c %d", tr.MatchTenant("aaaa", "t1"),
				tr.MatchTenant("bbbb", "t1"), tr.MatchTenant("cccc", "t1"))
		}
	})
	t.Run("parent becomes leaf", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		tr.Insert("abcdef", "t1")
		tr.Insert("abcxyz", "t1")
		st := f.Evict()
		f.SetLimits(Limits{TenantMaxChars: map[string]int64{"t1": 3}})
		check(t, f)
		if got := tr.MatchTenant("abcdef", "t1"); got != 3 {
			t.Errorf("t1 holds %d of abcdef, want the shared 3", got)
		}
		if tr.Chars() != 3 || st.Nodes != 0 {
			t.Errorf("chars %d", tr.Chars())
		}
		f.SetLimits(Limits{TenantMaxChars: map[string]int64{"t1": 2}})
		if tr.Chars() != 0 || f.Len() != 0 {
			t.Errorf("chars %d, trees %d after evicting the last leaf", tr.Chars(), f.Len())
		}
	})
	t.Run("shared node stays", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		tr.Insert("hello", "t1")
		tr.Insert("hello", "t2")
		f.storeLimits(Limits{TenantMaxChars: map[string]int64{"t1": 1}})
		st := f.Evict()
		check(t, f)
		if st.Chars != 0 || st.Nodes != 0 || tr.Chars() != 5 {
			t.Errorf("stats %+v chars %d: t1's bound freed a node t2 holds", st, tr.Chars())
		}
		if got := showMatch(match(tr, "hello")); got != "{Runes:5 t2:5}" {
			t.Errorf("match = %s", got)
		}
	})
	t.Run("only that tenant", func(t *testing.T) {
		f := newTestForest(Limits{TenantMaxChars: map[string]int64{"t1": 10}})
		tr := f.Tree("")
		tr.Insert("old t2 text", "t2")
		for i := range 20 {
			tr.Insert(fmt.Sprint("t1 text ", i), "t1")
			if got := f.TenantChars("t1"); got > 10 {
				t.Fatalf("t1 holds %d, bound 10", got)
			}
		}
		check(t, f)
		if got := tr.MatchTenant("old t2 text", "t2"); got != 11 {
			t.Errorf("t2 lost chars to t1's bound: holds %d", got)
		}
	})
}

func TestEvictAcrossTrees(t *testing.T) {
	f := newTestForest(Limits{})
	a, b := f.Tree("a"), f.Tree("b")
	a.Insert("a-old-xxxx", "t1")
	b.Insert("b-old-xxxx", "t1")
	a.Insert("a-new-xxxx", "t1")
	b.Insert("b-new-xxxx", "t2")
	if f.Chars() != 36 || a.Chars() != 18 || b.Chars() != 18 {
		t.Fatalf("chars %d a %d b %d", f.Chars(), a.Chars(), b.Chars())
	}
	// One bound over both trees, one LRU order: a-old then b-old go, down to 20.
	f.SetLimits(Limits{MaxChars: 22})
	check(t, f)
	if a.MatchTenant("a-old-xxxx", "t1") != 2 || b.MatchTenant("b-old-xxxx", "t1") != 2 {
		t.Errorf("old leaves not evicted first")
	}
	if a.MatchTenant("a-new-xxxx", "t1") != 10 || b.MatchTenant("b-new-xxxx", "t2") != 10 {
		t.Errorf("new leaves evicted")
	}
	if f.Chars() != 20 {
		t.Errorf("chars %d, want 20", f.Chars())
	}
	// Emptying a tree drops it; a stale handle forwards to the new tree of the same name.
	f.SetLimits(Limits{MaxChars: 11})
	check(t, f)
	if got := f.Names(); len(got) != 1 {
		t.Fatalf("Names = %v, want one tree left", got)
	}
	gone := a
	if f.Get("b") == nil {
		gone = b
	}
	if f.Get(gone.Name()) != nil {
		t.Fatalf("tree %q not dropped", gone.Name())
	}
	gone.Insert("again", "t3")
	if f.Get(gone.Name()) == nil || gone.MatchTenant("again", "t3") != 5 || gone.Chars() != 0 {
		t.Errorf("stale tree did not forward")
	}
	if m := match(gone, "again"); m.Tenants[0].Tenant != "t3" {
		t.Errorf("stale tree match = %s", showMatch(m))
	}
	check(t, f)
}

func TestEvictEdgeCases(t *testing.T) {
	t.Run("empty", func(t *testing.T) {
		f := newTestForest(Limits{MaxChars: 10})
		if st := f.Evict(); st.Chars != 0 || st.Nodes != 0 {
			t.Errorf("%+v", st)
		}
		f.Tree("x")
		f.Evict()
		if f.Len() != 0 {
			t.Errorf("empty tree kept")
		}
	})
	t.Run("tiny bound", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		tr.Insert("hello", "t1")
		tr.Insert("world", "t1")
		f.SetLimits(Limits{MaxChars: 1})
		check(t, f)
		if f.Chars() > 1 {
			t.Errorf("chars %d over a bound of 1", f.Chars())
		}
	})
	t.Run("text longer than the bound", func(t *testing.T) {
		f := newTestForest(Limits{MaxChars: 20})
		tr := f.Tree("")
		long := strings.Repeat("0123456789", 5)
		tr.Insert(long, "t1")
		check(t, f)
		n := tr.MatchTenant(long, "t1")
		if n == 0 || int64(n) != f.Chars() || f.Chars() > 22 {
			t.Errorf("stored %d chars, holds a prefix of %d", f.Chars(), n)
		}
		// A second one replaces the first.
		tr.Insert(strings.Repeat("abcdefghij", 5), "t2")
		check(t, f)
		if f.Chars() > 22 || tr.MatchTenant(strings.Repeat("abcdefghij", 5), "t2") == 0 {
			t.Errorf("chars %d", f.Chars())
		}
	})
	t.Run("many single-tenant entries", func(t *testing.T) {
		f := newTestForest(Limits{})
		tr := f.Tree("")
		for i := range 100 {
			tr.Insert(fmt.Sprintf("entry%03d", i), "t1")
		}
		f.SetLimits(Limits{TenantMaxChars: map[string]int64{"t1": 50}})
		check(t, f)
		if got := f.TenantChars("t1"); got > 50 {
			t.Errorf("t1 holds %d", got)
		}
	})
}

func TestHardCapAsync(t *testing.T) {
	// With passes in the background, the forest never goes past the bound plus 10%.
	f := NewForest(Limits{MaxChars: 1000})
	tr := f.Tree("")
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 3000 {
		tr.Insert(fmt.Sprintf("%05d %s", i, randomString(rng, 20)), "t1")
		if c := f.Chars(); c > 1100 {
			t.Fatalf("insert %d: %d chars, hard cap 1100", i, c)
		}
	}
	f.Evict()
	check(t, f)
	if c := f.Chars(); c > 1000 {
		t.Errorf("%d chars after Evict", c)
	}
}

func TestEvictRequeuesTouched(t *testing.T) {
	// A leaf used between the scan and its removal goes back into the heap with its new
	// stamp instead of being evicted as the oldest.
	for _, bound := range []string{"forest", "tenant"} {
		t.Run(bound, func(t *testing.T) {
			f := newTestForest(Limits{})
			tr := f.Tree("")
			tr.Insert("aaaa", "t1")
			tr.Insert("bbbb", "t1")
			tr.Insert("cccc", "t1")
			if bound == "forest" {
				f.storeLimits(Limits{MaxChars: 10})
			} else {
				f.storeLimits(Limits{TenantMaxChars: map[string]int64{"t1": 10}})
			}
			p := f.plan(0)
			p.scan(tr)
			f.storeLimits(Limits{}) // so that the insert below runs no pass of its own
			tr.Insert("aaaa", "t1")
			p.drain()
			check(t, f)
			if tr.MatchTenant("aaaa", "t1") != 4 || tr.MatchTenant("bbbb", "t1") != 0 {
				t.Errorf("aaaa %d bbbb %d: evicted by its stale stamp", tr.MatchTenant("aaaa", "t1"), tr.MatchTenant("bbbb", "t1"))
			}
		})
	}
}
