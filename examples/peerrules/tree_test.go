package peerrules

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
)

func TestSGLTreePrefixMatch(t *testing.T) {
	tree := NewTree()
	tree.Insert("hello world", "t1")
	tree.Insert("help", "t2")
	tree.Insert("你好嗎", "t1")
	tree.Insert("你好喔", "t2")

	for _, tc := range []struct {
		text    string
		matched int
		tenant  string
	}{
		{"hello world", 11, "t1"},
		{"hello there", 6, "t1"}, // ends inside the node "lo world"
		{"help me", 4, "t2"},
		{"hex", 2, "t1"}, // inside "hel", held by t1 then t2: the first to join
		{"你好喔", 3, "t2"},
		{"你好", 2, "t1"},
		{"zzz", 0, "t1"}, // the root: every tenant, the first inserted first
		{"", 0, "t1"},
	} {
		m := tree.PrefixMatch(tc.text)
		if m.Matched != tc.matched || m.Tenant != tc.tenant || m.Input != len([]rune(tc.text)) {
			t.Errorf("prefixMatch(%q) = %+v, want matched %d of %d, tenant %s",
				tc.text, m, tc.matched, len([]rune(tc.text)), tc.tenant)
		}
	}
	if m := NewTree().PrefixMatch("cold"); m.Tenant != EmptyTenant || m.Matched != 0 {
		t.Errorf("cold tree: %+v", m)
	}
}

// computedSizes counts, per tenant, the chars of every node it holds.
func computedSizes(tree *Tree) map[string]int {
	tree.mu.Lock()
	defer tree.mu.Unlock()
	out := make(map[string]int)
	var walk func(n *treeNode)
	walk = func(n *treeNode) {
		for _, s := range n.tenants {
			out[s.tenant] += n.chars
		}
		for _, c := range n.children {
			walk(c)
		}
	}
	walk(tree.root)
	return out
}

func TestSGLTreeCharCount(t *testing.T) {
	tree := NewTree()
	for _, w := range []struct{ text, tenant string }{
		{"apple", "t1"}, {"apricot", "t1"}, {"banana", "t1"}, {"amplify", "t2"},
		{"application", "t2"}, {"apartment", "t1"}, {"appetite", "t2"}, {"ball", "t1"},
		{"box", "t2"}, {"zebra", "t1"}, {"zebra", "t2"}, {"zero", "t1"}, {"zero", "t2"},
	} {
		tree.Insert(w.text, w.tenant)
		if got, want := tree.Sizes(), computedSizes(tree); !maps.Equal(got, want) {
			t.Fatalf("after %v: maintained %v, computed %v", w, got, want)
		}
	}
	tree.EvictTenantBySize(10)
	got, want := tree.Sizes(), computedSizes(tree)
	if !maps.Equal(got, want) {
		t.Fatalf("after eviction: maintained %v, computed %v", got, want)
	}
	for tenant, n := range got {
		if n > 10 {
			t.Errorf("tenant %s holds %d chars after evicting to 10", tenant, n)
		}
	}
}

// Eviction bounds every tenant on its own, least recently used leaves first, and leaves a node
// shared with another tenant in place for that tenant.
func TestSGLTreeEvictPerTenant(t *testing.T) {
	tree := NewTree()
	tree.Insert("aaaa", "t1")
	tree.Insert("bbbb", "t1")
	tree.Insert("cccc", "t1")
	tree.Insert("dddddddd", "t2")
	tree.Insert("cccc", "t2")

	tree.EvictTenantBySize(8)

	// t1 held 12 chars and loses aaaa; t2 held 12 and loses dddddddd, its older leaf.
	if got, want := tree.Sizes(), map[string]int{"t1": 8, "t2": 4}; !maps.Equal(got, want) {
		t.Fatalf("sizes = %v, want %v", got, want)
	}
	for _, tc := range []struct {
		text    string
		matched int
		tenant  string
	}{
		{"aaaa", 0, ""},     // t1's oldest leaf is gone
		{"bbbb", 4, "t1"},   // kept
		{"cccc", 4, "t1"},   // kept for both
		{"dddddddd", 0, ""}, // t2's oldest leaf is gone
	} {
		m := tree.PrefixMatch(tc.text)
		if m.Matched != tc.matched || (tc.tenant != "" && m.Tenant != tc.tenant) {
			t.Errorf("after eviction, prefixMatch(%q) = %+v, want %d chars of %s", tc.text, m, tc.matched, tc.tenant)
		}
	}
	tree.mu.Lock()
	shared := tree.root.children['c']
	tree.mu.Unlock()
	if shared == nil || !shared.has("t1") || !shared.has("t2") {
		t.Errorf("the node shared by t1 and t2 lost a tenant")
	}

	// The cap is per tenant: two tenants at the cap hold twice the cap together.
	tree = NewTree()
	for i := range 30 {
		tree.Insert(fmt.Sprintf("t1-%02d", i), "t1")
		tree.Insert(fmt.Sprintf("t2-%02d", i), "t2")
	}
	tree.EvictTenantBySize(20)
	sizes := tree.Sizes()
	if sizes["t1"] > 20 || sizes["t2"] > 20 || sizes["t1"]+sizes["t2"] <= 20 {
		t.Errorf("sizes after per-tenant eviction to 20: %v", sizes)
	}
	if !maps.Equal(sizes, computedSizes(tree)) {
		t.Errorf("maintained %v, computed %v", sizes, computedSizes(tree))
	}
	// The newest entries survive.
	if m := tree.PrefixMatch("t1-29"); m.Matched != 5 || m.Tenant != "t1" {
		t.Errorf("newest entry evicted: %+v", m)
	}
}

func TestSGLTreeRemoveTenant(t *testing.T) {
	tree := NewTree()
	tree.Insert("shared prefix one", "t1")
	tree.Insert("shared prefix two", "t2")
	tree.Insert("only t1", "t1")
	tree.RemoveTenant("t1")
	if got, want := tree.Sizes(), map[string]int{"t2": 17}; !maps.Equal(got, want) {
		t.Errorf("sizes = %v, want %v", got, want)
	}
	if m := tree.PrefixMatch("shared prefix one"); m.Tenant != "t2" || m.Matched != 14 {
		t.Errorf("after removing t1: %+v", m)
	}
	if m := tree.PrefixMatch("only t1"); m.Matched != 0 {
		t.Errorf("t1's own branch kept: %+v", m)
	}
}

func TestSGLTreeConcurrent(t *testing.T) {
	tree := NewTree()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 500 {
				text := fmt.Sprintf("system prompt %d / user %d", rng.IntN(8), rng.IntN(50))
				tree.Insert(text, fmt.Sprintf("t%d", g))
				tree.PrefixMatch(text)
				if i%100 == 0 {
					tree.EvictTenantBySize(200)
				}
			}
		})
	}
	wg.Wait()
	if got, want := tree.Sizes(), computedSizes(tree); !maps.Equal(got, want) {
		t.Errorf("maintained %v, computed %v", got, want)
	}
}

func TestShared(t *testing.T) {
	for _, tc := range []struct {
		a, b         string
		runes, bytes int
	}{
		{"", "", 0, 0}, {"abc", "", 0, 0}, {"abc", "abd", 2, 2}, {"abc", "abc", 3, 3},
		{"abcdefghijklmnopqrstuvwxyz", "abcdefghijklmnopqrstuvwxyZ", 25, 25},
		{"你好嗎", "你好喔", 2, 6}, {"你好", "你好嗎", 2, 6}, {"é", "è", 0, 0}, {"aé", "aè", 1, 1},
	} {
		r, b := shared(tc.a, tc.b)
		if r != tc.runes || b != tc.bytes {
			t.Errorf("shared(%q, %q) = %d, %d; want %d, %d", tc.a, tc.b, r, b, tc.runes, tc.bytes)
		}
	}
}
