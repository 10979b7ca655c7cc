package tree

import (
	"strings"
	"sync/atomic"
)

// A node holds one edge of text. Its tenants are the upstreams the text was sent to, each with
// the stamp of its last insert through the node. Every insert stamps its whole path, so a
// tenant's stamps never grow from a node to its children, and a tenant held by a node is held
// by all its ancestors: the nodes a tenant holds form a subtree hanging from the root.
//
// Readers (Match, MatchTenant, the eviction scan) take no lock. Writers hold the tree's
// mutex and publish changes read-copy-update style: a node's text is immutable once the node
// is reachable, its child and tenant lists are replaced, never changed in place, and stamps
// are atomic. A split replaces the node by two new ones; readers already on the old node see
// it whole.
type node struct {
	text  string // owned copy, never a slice of a caller's string
	runes int    // units in text
	key   uint32 // first unit of text (firstKey)
	open  bool   // text ends in a truncated encoding (openTail)

	children atomic.Pointer[[]edge]   // sorted by key
	tenants  atomic.Pointer[[]holder] // unordered; a few entries

	// Guarded by the tree's mutex.
	parent *node
	dead   bool // no longer in the tree; eviction may hold stale pointers
}

// edge keeps a child's key next to the pointer, so a lookup touches one array.
type edge struct {
	key uint32
	n   *node
}

type holder struct {
	id    uint32
	stamp atomic.Uint64
}

func newNode(text string, runes int, parent *node) *node {
	return &node{
		text:   text,
		runes:  runes,
		key:    firstKey(text),
		open:   openTail(text),
		parent: parent,
	}
}

func (n *node) kids() []edge {
	if p := n.children.Load(); p != nil {
		return *p
	}
	return nil
}

func (n *node) holders() []holder {
	if p := n.tenants.Load(); p != nil {
		return *p
	}
	return nil
}

// child returns the child whose text starts with the unit k, or nil.
func (n *node) child(k uint32) *node {
	c := n.kids()
	if len(c) <= 8 {
		for i := range c {
			if c[i].key == k {
				return c[i].n
			}
		}
		return nil
	}
	lo, hi := 0, len(c)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if c[m].key < k {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(c) && c[lo].key == k {
		return c[lo].n
	}
	return nil
}

// A published list is a pointer to a slice header. A list of one, the common case for
// leaves and split nodes, lives with its header in one allocation.

func (n *node) setKids(c []edge) {
	switch len(c) {
	case 0:
		n.children.Store(nil)
	case 1:
		x := new(struct {
			s []edge
			a [1]edge
		})
		x.a[0] = c[0]
		x.s = x.a[:]
		n.children.Store(&x.s)
	default:
		hdr := c // only this branch moves a header to the heap
		n.children.Store(&hdr)
	}
}

func (n *node) addChild(c *node) {
	old := n.kids()
	i := 0
	for i < len(old) && old[i].key < c.key {
		i++
	}
	kids := make([]edge, 0, len(old)+1)
	kids = append(kids, old[:i]...)
	kids = append(kids, edge{c.key, c})
	n.setKids(append(kids, old[i:]...))
}

// replaceChild puts c where old was; both start with the same unit.
func (n *node) replaceChild(old, c *node) {
	kids := append([]edge(nil), n.kids()...)
	for i := range kids {
		if kids[i].n == old {
			kids[i].n = c
		}
	}
	n.setKids(kids)
}

func (n *node) removeChild(c *node) {
	old := n.kids()
	kids := make([]edge, 0, len(old))
	for _, e := range old {
		if e.n != c {
			kids = append(kids, e)
		}
	}
	n.setKids(kids)
}

// holder returns n's holder for id, or nil.
func (n *node) holder(id uint32) *holder {
	hs := n.holders()
	for i := range hs {
		if hs[i].id == id {
			return &hs[i]
		}
	}
	return nil
}

func (n *node) holds(id uint32) bool { return n.holder(id) != nil }

// newHolders returns a list of n holders to fill and publish with setHolders.
func newHolders(n int) *[]holder {
	if n == 1 {
		x := new(struct {
			s []holder
			a [1]holder
		})
		x.s = x.a[:]
		return &x.s
	}
	hs := make([]holder, n)
	return &hs
}

// copyHolders returns a copy of n's holders with extra empty slots at the end, leaving out
// drop (^uint32(0): none).
func (n *node) copyHolders(extra int, drop uint32) *[]holder {
	old := n.holders()
	k := len(old)
	if drop != ^uint32(0) && n.holds(drop) {
		k--
	}
	if k+extra == 0 {
		return nil
	}
	p := newHolders(k + extra)
	hs, j := *p, 0
	for i := range old {
		if old[i].id != drop {
			hs[j].id = old[i].id
			hs[j].stamp.Store(old[i].stamp.Load())
			j++
		}
	}
	return p
}

func (n *node) setHolders(p *[]holder) {
	if p == nil || len(*p) == 0 {
		n.tenants.Store(nil)
		return
	}
	n.tenants.Store(p)
}

func (n *node) addHolder(id uint32, stamp uint64) {
	p := n.copyHolders(1, ^uint32(0))
	h := &(*p)[len(*p)-1]
	h.id = id
	h.stamp.Store(stamp)
	n.setHolders(p)
}

func (n *node) removeHolder(id uint32) { n.setHolders(n.copyHolders(0, id)) }

// stamp is the node's last access by any tenant.
func (n *node) stamp() uint64 {
	var s uint64
	hs := n.holders()
	for i := range hs {
		s = max(s, hs[i].stamp.Load())
	}
	return s
}

// childHolds reports whether a child of n holds id, that is whether n is not a leaf for id.
func (n *node) childHolds(id uint32) bool {
	for _, e := range n.kids() {
		if e.n.holds(id) {
			return true
		}
	}
	return false
}

// split replaces n under its parent by an upper node holding the first nb bytes (nu units)
// of n's text and a lower node holding the rest and n's children, and returns the upper one.
// Both get their own copy of the text, so that evicting one later frees its bytes.
func (n *node) split(nb, nu int) *node {
	up := newNode(strings.Clone(n.text[:nb]), nu, n.parent)
	low := newNode(strings.Clone(n.text[nb:]), n.runes-nu, up)
	up.setHolders(n.copyHolders(0, ^uint32(0)))
	low.setHolders(n.copyHolders(0, ^uint32(0)))
	low.children.Store(n.children.Load())
	for _, e := range low.kids() {
		e.n.parent = low
	}
	up.setKids([]edge{{low.key, low}})
	n.parent.replaceChild(n, up)
	n.dead = true
	return up
}
