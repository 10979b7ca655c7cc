package tree

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestForest(t *testing.T) {
	f := newTestForest(Limits{})
	if f.Get("m") != nil || f.Len() != 0 {
		t.Fatal("new forest not empty")
	}
	a := f.Tree("qwen")
	if f.Tree("qwen") != a || f.Get("qwen") != a {
		t.Fatal("Tree does not return the same tree")
	}
	b := f.Tree("llama")
	c := f.Tree("")
	if got := f.Names(); !slices.Equal(got, []string{"", "llama", "qwen"}) || f.Len() != 3 {
		t.Errorf("Names = %q, Len %d", got, f.Len())
	}
	a.Insert("shared system prompt", "u1")
	b.Insert("shared system prompt", "u1")
	b.Insert("shared system prompt", "u2")
	c.Insert("other", "u2")
	check(t, f)
	// Each tree stores its own copy: the same text in two trees counts twice.
	if f.Chars() != 20+20+5 {
		t.Errorf("forest chars %d, want 45", f.Chars())
	}
	if f.TenantChars("u1") != 40 || f.TenantChars("u2") != 25 || f.TenantChars("u3") != 0 {
		t.Errorf("tenant chars u1 %d u2 %d", f.TenantChars("u1"), f.TenantChars("u2"))
	}
	if got := f.Tenants(); !slices.Equal(got, []string{"u1", "u2"}) {
		t.Errorf("Tenants = %v", got)
	}
	// Trees are separate: a prompt in one model's tree does not match in another's.
	if m := match(c, "shared system prompt"); len(m.Tenants) != 0 {
		t.Errorf("match across trees: %s", showMatch(m))
	}

	f.RemoveTenant("u1")
	check(t, f)
	if f.TenantChars("u1") != 0 || a.Chars() != 0 || b.Chars() != 20 {
		t.Errorf("after RemoveTenant: u1 %d, a %d, b %d", f.TenantChars("u1"), a.Chars(), b.Chars())
	}

	f.Reset()
	check(t, f)
	if f.Len() != 0 || f.Chars() != 0 || len(f.Tenants()) != 0 {
		t.Errorf("after Reset: %d trees, %d chars, tenants %v", f.Len(), f.Chars(), f.Tenants())
	}
	// Handles from before the reset forward to the new tree of their name.
	if m := match(b, "shared system prompt"); len(m.Tenants) != 0 || m.Runes != 20 {
		t.Errorf("match after Reset = %s", showMatch(m))
	}
	b.Insert("after", "u3")
	if f.Get("llama") == nil || f.Get("llama") == b || f.Get("llama").MatchTenant("after", "u3") != 5 {
		t.Error("stale handle did not forward its insert")
	}
	if b.MatchTenant("after", "u3") != 5 {
		t.Error("stale handle did not forward MatchTenant")
	}
	check(t, f)
}

func TestTenantIDReuse(t *testing.T) {
	defer func(q time.Duration) { idQuarantine = q }(idQuarantine)
	f := newTestForest(Limits{})
	tr0 := f.Tree("")
	tr0.Insert("x", "early")
	f.RemoveTenant("early")
	tr0.Insert("y", "next")
	if got := len(*f.table.Load()); got != 2 {
		t.Fatalf("id reused within its quarantine: %d slots", got)
	}
	f.Reset()
	idQuarantine = 0
	tr := f.Tree("")
	for i := range 20 {
		tr.Insert(fmt.Sprint("text ", i), fmt.Sprint("u", i))
	}
	for i := range 10 {
		f.RemoveTenant(fmt.Sprint("u", i))
	}
	check(t, f)
	if got := len(*f.table.Load()); got != 20 {
		t.Fatalf("table has %d slots, want the 20 of before", got)
	}
	for i := range 10 {
		tr.Insert(fmt.Sprint("new ", i), fmt.Sprint("v", i))
	}
	check(t, f)
	if got := len(*f.table.Load()); got != 20 {
		t.Errorf("ids not reused: table has %d slots", got)
	}
	for i := range 20 {
		want := 0
		if i >= 10 {
			want = len(fmt.Sprint("text ", i))
		}
		if got := tr.MatchTenant(fmt.Sprint("text ", i), fmt.Sprint("u", i)); got != want {
			t.Errorf("u%d holds %d, want %d", i, got, want)
		}
	}
	for i := range 10 {
		if m := match(tr, fmt.Sprint("new ", i)); m.Tenants[0].Tenant != fmt.Sprint("v", i) {
			t.Errorf("new %d matched %s", i, showMatch(m))
		}
	}
}

func TestSetLimits(t *testing.T) {
	// A tenant's bound applies whether it is set before or after the tenant appears.
	f := newTestForest(Limits{TenantMaxChars: map[string]int64{"late": 10}})
	tr := f.Tree("")
	for i := range 10 {
		tr.Insert(fmt.Sprintf("%c-late", 'a'+i), "late")
		tr.Insert(fmt.Sprintf("%c-early", 'a'+i), "early")
	}
	if f.TenantChars("late") > 10 || f.TenantChars("early") != 70 {
		t.Fatalf("late %d early %d", f.TenantChars("late"), f.TenantChars("early"))
	}
	l := Limits{TenantMaxChars: map[string]int64{"early": 20}}
	f.SetLimits(l)
	l.TenantMaxChars["early"] = 1 // the forest keeps its own copy
	check(t, f)
	if got := f.TenantChars("early"); got > 20 || got < 14 {
		t.Errorf("early holds %d, want 14..20", got)
	}
	// Lifting a bound stops its eviction.
	f.SetLimits(Limits{})
	for i := range 10 {
		tr.Insert(fmt.Sprintf("%c-late", 'a'+i), "late")
	}
	if got := f.TenantChars("late"); got != 60 {
		t.Errorf("late holds %d without a bound, want 60", got)
	}
	if strings.Join(f.Tenants(), ",") != "early,late" {
		t.Errorf("Tenants = %v", f.Tenants())
	}
}

func TestForestMakeRoomDropsLeastRecentlyUsed(t *testing.T) {
	f := newTestForest(Limits{})
	real := f.Tree("llama")
	real.Insert("system prompt of a real model", "u1")
	for i := range 10 {
		f.Tree(fmt.Sprint("junk", i)).Insert(fmt.Sprint("junk text ", i), "u2")
		if i == 6 {
			real.Insert("system prompt of a real model, turn 2", "u1") // used since junk0..6
		}
	}
	before := f.Chars()
	junk0 := f.Get("junk0")
	if n := f.MakeRoom(5); n != 7 || f.Len() != 4 {
		t.Fatalf("MakeRoom(5) dropped %d, left %d trees: %q", n, f.Len(), f.Names())
	}
	check(t, f)
	// Least recently used first: junk0..6 (each used once, before the real model's last
	// insert) go; the real model stays, and so do the three junk trees used after it.
	if got, want := f.Names(), []string{"junk7", "junk8", "junk9", "llama"}; !slices.Equal(got, want) {
		t.Errorf("kept %q, want %q", got, want)
	}
	// What the dropped trees held is freed, tenants' shares included.
	if freed := before - f.Chars(); freed != 7*int64(len("junk text 0")) {
		t.Errorf("freed %d chars", freed)
	}
	if got := f.TenantChars("u2"); got != 3*int64(len("junk text 0")) {
		t.Errorf("u2 holds %d chars after the drop", got)
	}
	if _, n := top(real, "system prompt of a real model, turn 2"); n != 37 {
		t.Errorf("real model's tree lost its text: %d runes", n)
	}
	// A handle to a dropped tree forwards to a new tree of its name.
	junk0.Insert("again", "u3")
	if g := f.Get("junk0"); g == nil || g == junk0 || g.Chars() != 5 {
		t.Errorf("insert through a dropped tree's handle: %v", g)
	}
	check(t, f)
	if n := f.MakeRoom(10); n != 0 || f.Len() != 5 {
		t.Errorf("MakeRoom under the bound dropped %d", n)
	}
}

func TestForestMakeRoomConcurrent(t *testing.T) {
	// Dropping trees while other goroutines insert into them and match them keeps the forest
	// consistent and within the bound plus the number of goroutines creating trees.
	f := NewForest(Limits{MaxChars: 5000})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var m Match
			for i := range 400 {
				name := fmt.Sprint("m", (g*131+i)%40)
				f.MakeRoom(8)
				tr := f.Tree(name)
				tr.Insert(fmt.Sprintf("prompt %d %d", g, i), fmt.Sprint("u", i%3))
				tr.Match("prompt 1", &m)
			}
		}()
	}
	wg.Wait()
	check(t, f)
	if n := f.Len(); n > 8+4 {
		t.Errorf("%d trees, bound 8 (+4 racing)", n)
	}
}

// StoreLimits lowering MaxChars on a full forest makes no insert wait for the pass that
// shrinks it, even while a pass holds the eviction lock; the pass brings it within the new
// bound, and the hard cap is the new one's after it.
func TestStoreLimitsInsertsDoNotWait(t *testing.T) {
	f := NewForest(Limits{}) // passes in the background, as in kvroute
	tr := f.Tree("m")
	for i := range 100 {
		tr.Insert(fmt.Sprintf("%03d %s", i, strings.Repeat("x", 96)), "u")
	}
	if f.Chars() < 9000 {
		t.Fatalf("forest holds %d chars, want about 10000", f.Chars())
	}
	f.evictMu.Lock() // a pass runs, or is about to: an insert that needs room waits for it
	f.StoreLimits(Limits{MaxChars: 1000})
	done := make(chan struct{})
	go func() {
		tr.Insert("a new prompt after the reload", "u")
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		f.evictMu.Unlock()
		<-done
		t.Fatal("an insert after StoreLimits lowered MaxChars waited for the eviction pass")
	}
	f.evictMu.Unlock()
	f.Evict()
	check(t, f)
	if c := f.Chars(); c > 1000 {
		t.Errorf("after the pass the forest holds %d chars, over MaxChars 1000", c)
	}
	if g := f.grace.Load(); g != 0 {
		t.Errorf("the grace cap %d outlived the pass planned with the new limits", g)
	}
	if c := f.hardCapNow(); c != 1100 {
		t.Errorf("hard cap %d after the pass, want 1100", c)
	}
}
