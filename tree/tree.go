package tree

import (
	"strings"
	"sync"
	"sync/atomic"
)

// Tree is the approximate radix tree of one model's prompts: every node remembers which
// tenants it was sent to and when. Get one from Forest.Tree. Safe for concurrent use: Match
// and MatchTenant take no lock and never wait; Insert, removals and eviction batches
// serialize on the tree's mutex.
//
// A Tree handed out before its forest dropped it (Reset, or eviction emptying it) stays
// usable: it forwards to the forest's current tree of the same name.
type Tree struct {
	f        *Forest
	name     string
	detached atomic.Bool // dropped from the forest; written under mu
	root     node        // text is empty, holds no tenants
	chars    atomic.Int64
	used     atomic.Uint64 // the clock tick of the last insert (or of the tree's creation)

	mu          sync.Mutex
	gen         uint64  // guarded by mu; bumped by clear, so eviction can drop stale nodes
	tenantChars []int64 // guarded by mu; chars charged per tenant id
}

// Name returns the tree's name.
func (t *Tree) Name() string { return t.name }

// Chars returns the chars stored in the tree.
func (t *Tree) Chars() int64 { return t.chars.Load() }

// TenantChars returns the chars of the tree charged to tenant: the total length of the nodes
// that hold it.
func (t *Tree) TenantChars(tenant string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok := t.f.lookup(tenant)
	if !ok || int(id) >= len(t.tenantChars) {
		return 0
	}
	return t.tenantChars[id]
}

// Insert records that text was sent to tenant: it adds the text's path, splitting edges where
// it diverges, charges tenant for every node of the path new to it, and stamps the path with
// a new tick of the forest's clock. Empty text stores nothing.
func (t *Tree) Insert(text, tenant string) {
	f := t.f
	f.idMu.RLock()
	id := f.intern(tenant)
	if text != "" {
		t.insert(text, id)
	}
	f.idMu.RUnlock()
	if f.overBound(id) {
		f.kick()
	}
}

func (t *Tree) insert(text string, id uint32) {
	f := t.f
	fit := false
	for {
		t.mu.Lock()
		if t.detached.Load() {
			t.mu.Unlock()
			t = f.Tree(t.name)
			continue
		}
		// The tick is taken under the mutex: inserts through a shared prefix then stamp it
		// in the order they change the tree, so a parent's stamp is never older than the
		// one a child got from an insert that held the mutex before.
		stamp := f.clock.Add(1)
		t.used.Store(stamp)
		need := t.insertLocked(text, id, stamp, fit)
		t.mu.Unlock()
		if need == 0 {
			return
		}
		// Over the hard cap: make room, then store what fits.
		f.evictFor(need)
		fit = true
	}
}

// insertLocked inserts under t.mu. When the new leaf does not fit under the hard cap, it
// returns the leaf's size without storing it, or with fit set stores the part that fits.
func (t *Tree) insertLocked(text string, id uint32, stamp uint64, fit bool) (need int64) {
	f := t.f
	if int(id) >= len(t.tenantChars) {
		t.tenantChars = append(t.tenantChars, make([]int64, int(id)+1-len(t.tenantChars))...)
	}
	n, rem := &t.root, text
	for rem != "" {
		c := n.child(firstKey(rem))
		if c == nil {
			r := int64(countUnits(rem))
			if !f.reserve(r) {
				if !fit {
					return r
				}
				// Eviction could not make room: keep the prefix that fits under the
				// low-water mark, so that the next pass does not take it at once.
				for {
					if r = min(r, f.room()); r <= 0 {
						return 0
					}
					if f.reserve(r) {
						break
					}
				}
				rem = rem[:unitPrefix(rem, int(r))]
			}
			leaf := newNode(strings.Clone(rem), int(r), n)
			t.touch(leaf, id, stamp)
			n.addChild(leaf)
			t.chars.Add(r)
			return 0
		}
		nb, nu := len(c.text), c.runes
		if !strings.HasPrefix(rem, c.text) || c.open && len(rem) > nb {
			nb, nu = common(c.text, rem)
		}
		if nb < len(c.text) {
			c = c.split(nb, nu)
		}
		t.touch(c, id, stamp)
		n, rem = c, rem[nb:]
	}
	return 0
}

// touch stamps n for id, charging id for n when n is new to it.
func (t *Tree) touch(n *node, id uint32, stamp uint64) {
	if h := n.holder(id); h != nil {
		h.stamp.Store(stamp)
		return
	}
	n.addHolder(id, stamp)
	t.charge(id, int64(n.runes))
}

func (t *Tree) charge(id uint32, delta int64) {
	t.tenantChars[id] += delta
	(*t.f.table.Load())[id].chars.Add(delta)
}

// Match finds the path of text in the tree, in one walk, and fills m with the length of text
// and every tenant on the path with the leading runes of text it holds (see Match). It takes
// no lock, changes nothing in the tree, and reuses m's memory.
func (t *Tree) Match(text string, m *Match) {
	m.reset()
	for t.detached.Load() {
		if t = t.f.Get(t.name); t == nil {
			m.Runes = countUnits(text)
			return
		}
	}
	table := *t.f.table.Load()
	m.grow(len(table))
	n, rem, matched := &t.root, text, 0
	for rem != "" {
		c := n.child(firstKey(rem))
		if c == nil {
			break
		}
		nb, nu := len(c.text), c.runes
		if !strings.HasPrefix(rem, c.text) || c.open && len(rem) > nb {
			nb, nu = common(c.text, rem)
		}
		matched += nu
		rem = rem[nb:]
		hs := c.holders()
		for i := range hs {
			m.record(hs[i].id, hs[i].stamp.Load(), matched)
		}
		if nb < len(c.text) {
			break
		}
		n = c
	}
	m.finish(table)
	m.Runes = matched + countUnits(rem)
}

// MatchTenant returns how many leading runes of text tenant holds in the tree. It takes no
// lock.
func (t *Tree) MatchTenant(text, tenant string) int {
	for t.detached.Load() {
		if t = t.f.Get(t.name); t == nil {
			return 0
		}
	}
	id, ok := t.f.lookup(tenant)
	if !ok {
		return 0
	}
	n, rem, matched := &t.root, text, 0
	for rem != "" {
		c := n.child(firstKey(rem))
		if c == nil || !c.holds(id) {
			break
		}
		nb, nu := len(c.text), c.runes
		if !strings.HasPrefix(rem, c.text) || c.open && len(rem) > nb {
			nb, nu = common(c.text, rem)
		}
		matched += nu
		if nb < len(c.text) {
			break
		}
		n, rem = c, rem[nb:]
	}
	return matched
}

// RemoveTenant removes tenant from the tree, and the nodes no tenant holds any more.
func (t *Tree) RemoveTenant(tenant string) {
	f := t.f
	f.idMu.RLock()
	defer f.idMu.RUnlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if id, ok := f.lookup(tenant); ok {
		t.removeTenant(id)
	}
}

// removeTenant works under t.mu. A tenant's nodes form a subtree hanging from the root, so
// it visits only those, and removes them children first.
func (t *Tree) removeTenant(id uint32) {
	if int(id) >= len(t.tenantChars) || t.tenantChars[id] == 0 {
		return
	}
	var order []*node
	stack := []*node{&t.root}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, e := range n.kids() {
			if e.n.holds(id) {
				order = append(order, e.n)
				stack = append(stack, e.n)
			}
		}
	}
	for i := len(order) - 1; i >= 0; i-- {
		n := order[i]
		n.removeHolder(id)
		t.charge(id, -int64(n.runes))
		if n.holders() == nil && n.kids() == nil {
			t.detach(n)
		}
	}
}

// detach removes the leaf n from the tree under t.mu; the caller has uncharged its tenants.
func (t *Tree) detach(n *node) {
	n.parent.removeChild(n)
	n.dead = true
	r := int64(n.runes)
	t.chars.Add(-r)
	t.f.chars.Add(-r)
}

// clear empties the tree under t.mu.
func (t *Tree) clear() {
	for id, c := range t.tenantChars {
		if c != 0 {
			t.charge(uint32(id), -c)
		}
	}
	t.f.chars.Add(-t.chars.Swap(0))
	t.root.children.Store(nil)
	t.gen++
}
