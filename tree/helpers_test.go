package tree

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// newTestForest returns a forest whose insert-triggered passes run in the inserting
// goroutine, so tests see their effect at once.
func newTestForest(l Limits) *Forest {
	f := NewForest(l)
	f.inline = true
	return f
}

func match(tr *Tree, text string) *Match {
	var m Match
	tr.Match(text, &m)
	return &m
}

// top returns the first tenant of a match and its runes, or ("", 0).
func top(tr *Tree, text string) (string, int) {
	m := match(tr, text)
	if len(m.Tenants) == 0 {
		return "", 0
	}
	return m.Tenants[0].Tenant, m.Tenants[0].Runes
}

// check verifies the structure of every tree and recomputes every count from scratch.
func check(t testing.TB, f *Forest) {
	t.Helper()
	if err := verify(f); err != nil {
		t.Fatal(err)
	}
}

func verify(f *Forest) error {
	f.idMu.Lock()
	defer f.idMu.Unlock()
	table := *f.table.Load()
	forestTenant := make([]int64, len(table))
	var forestChars int64
	for _, tr := range f.treeList() {
		tr.mu.Lock()
		chars, perTenant, err := verifyTree(tr, table)
		tr.mu.Unlock()
		if err != nil {
			return fmt.Errorf("tree %q: %w", tr.name, err)
		}
		forestChars += chars
		for id, c := range perTenant {
			forestTenant[id] += c
		}
	}
	if got := f.Chars(); got != forestChars {
		return fmt.Errorf("forest chars %d, recomputed %d", got, forestChars)
	}
	for id, tn := range table {
		if tn == nil {
			if forestTenant[id] != 0 {
				return fmt.Errorf("freed id %d holds %d chars", id, forestTenant[id])
			}
			continue
		}
		if got := tn.chars.Load(); got != forestTenant[id] {
			return fmt.Errorf("tenant %q chars %d, recomputed %d", tn.name, got, forestTenant[id])
		}
		if got := f.TenantChars(tn.name); got != forestTenant[id] {
			return fmt.Errorf("TenantChars(%q) = %d, recomputed %d", tn.name, got, forestTenant[id])
		}
	}
	return nil
}

func verifyTree(tr *Tree, table []*tenant) (int64, []int64, error) {
	per := make([]int64, len(table))
	var chars int64
	if tr.root.holders() != nil {
		return 0, nil, fmt.Errorf("root holds tenants")
	}
	var walk func(n *node, path string) error
	walk = func(n *node, path string) error {
		kids := n.kids()
		if kids != nil && len(kids) == 0 {
			return fmt.Errorf("%q: empty child list stored", path)
		}
		for i, e := range kids {
			c := e.n
			p := path + c.text
			hs := c.holders()
			switch {
			case c.dead:
				return fmt.Errorf("%q: dead node reachable", p)
			case c.parent != n:
				return fmt.Errorf("%q: wrong parent", p)
			case c.text == "":
				return fmt.Errorf("child of %q: empty text", path)
			case e.key != c.key:
				return fmt.Errorf("%q: edge key %x, node key %x", p, e.key, c.key)
			case c.key != firstKey(c.text):
				return fmt.Errorf("%q: key %x, want %x", p, c.key, firstKey(c.text))
			case c.runes != utf8.RuneCountInString(c.text):
				return fmt.Errorf("%q: runes %d, want %d", p, c.runes, utf8.RuneCountInString(c.text))
			case c.open != openTail(c.text):
				return fmt.Errorf("%q: open %v", p, c.open)
			case i > 0 && kids[i-1].key >= c.key:
				return fmt.Errorf("%q: children not sorted by key", p)
			case len(hs) == 0:
				return fmt.Errorf("%q: no tenant", p)
			}
			// The node must start on a unit boundary of its path.
			if u := units(p); strings.Join(u[len(u)-c.runes:], "") != c.text {
				return fmt.Errorf("%q: node text %q does not start on a unit boundary", p, c.text)
			}
			for j := range hs {
				h := &hs[j]
				if int(h.id) >= len(table) || table[h.id] == nil {
					return fmt.Errorf("%q: holds freed id %d", p, h.id)
				}
				if c.holder(h.id) != h {
					return fmt.Errorf("%q: tenant %d held twice", p, h.id)
				}
				if n != &tr.root {
					ph := n.holder(h.id)
					if ph == nil {
						return fmt.Errorf("%q: tenant %q not held by the parent", p, table[h.id].name)
					}
					if ph.stamp.Load() < h.stamp.Load() {
						return fmt.Errorf("%q: tenant %q stamped later than on the parent", p, table[h.id].name)
					}
				}
				per[h.id] += int64(c.runes)
			}
			chars += int64(c.runes)
			if err := walk(c, p); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(&tr.root, ""); err != nil {
		return 0, nil, err
	}
	if got := tr.Chars(); got != chars {
		return 0, nil, fmt.Errorf("chars %d, recomputed %d", got, chars)
	}
	for id := range per {
		var got int64
		if id < len(tr.tenantChars) {
			got = tr.tenantChars[id]
		}
		if got != per[id] {
			return 0, nil, fmt.Errorf("tenant id %d chars %d, recomputed %d", id, got, per[id])
		}
	}
	for id := len(per); id < len(tr.tenantChars); id++ {
		if tr.tenantChars[id] != 0 {
			return 0, nil, fmt.Errorf("tenant id %d beyond the table holds chars", id)
		}
	}
	return chars, per, nil
}

// units splits s into its units, the way the tree counts runes.
func units(s string) []string {
	var u []string
	for s != "" {
		_, n := utf8.DecodeRuneInString(s)
		u = append(u, s[:n])
		s = s[n:]
	}
	return u
}

func commonUnits(a, b string) int {
	ua, ub := units(a), units(b)
	n := 0
	for n < len(ua) && n < len(ub) && ua[n] == ub[n] {
		n++
	}
	return n
}

// refModel is the naive reference: every insert kept as (text, tenant, stamp) per tree.
type refModel struct {
	clock int
	trees map[string][]refEntry
}

type refEntry struct {
	text, tenant string
	stamp        int
}

func newRef() *refModel { return &refModel{trees: map[string][]refEntry{}} }

func (r *refModel) insert(tree, text, tenant string) {
	if text == "" {
		return
	}
	r.clock++
	r.trees[tree] = append(r.trees[tree], refEntry{text, tenant, r.clock})
}

func (r *refModel) removeTenant(tree, tenant string) {
	r.trees[tree] = slices.DeleteFunc(r.trees[tree], func(e refEntry) bool { return e.tenant == tenant })
}

// match returns what Tree.Match must return: per tenant the longest common prefix with any
// of its texts, ordered by length, then by the last insert reaching that length.
func (r *refModel) match(tree, text string) Match {
	type best struct {
		runes, stamp int
	}
	bests := map[string]best{}
	for _, e := range r.trees[tree] {
		n := commonUnits(e.text, text)
		if n == 0 {
			continue
		}
		b := bests[e.tenant]
		if n > b.runes || n == b.runes && e.stamp > b.stamp {
			bests[e.tenant] = best{n, e.stamp}
		}
	}
	m := Match{Runes: utf8.RuneCountInString(text)}
	for tn := range bests {
		m.Tenants = append(m.Tenants, TenantMatch{Tenant: tn, Runes: bests[tn].runes})
	}
	slices.SortFunc(m.Tenants, func(a, b TenantMatch) int {
		if a.Runes != b.Runes {
			return b.Runes - a.Runes
		}
		return bests[b.Tenant].stamp - bests[a.Tenant].stamp
	})
	return m
}

func (r *refModel) matchTenant(tree, text, tenant string) int {
	n := 0
	for _, e := range r.trees[tree] {
		if e.tenant == tenant {
			n = max(n, commonUnits(e.text, text))
		}
	}
	return n
}

// chars returns the distinct non-empty unit prefixes of the texts of tenant in tree, or of
// every tenant when tenant is "".
func (r *refModel) chars(tree, tenant string) int64 {
	seen := map[string]bool{}
	for _, e := range r.trees[tree] {
		if tenant != "" && e.tenant != tenant {
			continue
		}
		p := ""
		for _, u := range units(e.text) {
			p += u
			seen[p] = true
		}
	}
	return int64(len(seen))
}

func sameMatch(got *Match, want Match) bool {
	if got.Runes != want.Runes || len(got.Tenants) != len(want.Tenants) {
		return false
	}
	for i := range want.Tenants {
		if got.Tenants[i] != want.Tenants[i] {
			return false
		}
	}
	return true
}

func showMatch(m *Match) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "{Runes:%d", m.Runes)
	for _, tm := range m.Tenants {
		fmt.Fprintf(&sb, " %s:%d", tm.Tenant, tm.Runes)
	}
	sb.WriteString("}")
	return sb.String()
}
