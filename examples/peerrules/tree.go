package peerrules

import (
	"container/heap"
	"sync"
	"unicode/utf8"
)

// Tree is a re-implementation of SGLang's approximate radix tree (sgl-model-gateway
// src/policies/tree.rs): a char-level radix tree shared by several tenants (upstreams), each
// node recording, per tenant, when that tenant last touched it. It follows tree.rs in what it
// stores and evicts, not in how fast it does it: one mutex guards the whole tree.
//
// Behaviours kept from tree.rs on purpose, since they shape how the policy routes:
//   - Insert gives a tenant joining an existing inner node the timestamp 0 and stamps only the
//     node where the text ends, so inner nodes age first once they become a tenant's leaf;
//   - PrefixMatch refreshes the matched node's timestamp for the returned tenant only on every
//     eighth call (tree.rs samples the global epoch counter the same way);
//   - the size is counted per tenant (each node's chars once per tenant holding it) and
//     EvictTenantBySize bounds every tenant separately, so a tree may hold N × max chars.
type Tree struct {
	mu        sync.Mutex
	root      *treeNode
	epoch     uint64         // LRU clock: tree.rs uses a counter, not wall time
	nodes     uint64         // nodes made, to number them
	charCount map[string]int // chars held per tenant
}

type treeNode struct {
	id       uint64 // creation order: breaks eviction ties the same way on every run
	text     string // "" only at the root
	chars    int    // runes in text
	parent   *treeNode
	children map[rune]*treeNode
	// tenants in the order they joined the node. tree.rs keeps them in a DashMap and returns
	// the node's cached last_tenant, set by the tenant that created the node and otherwise the
	// first the map iterates; taking the earliest tenant still present is the deterministic
	// version of that.
	tenants []tenantStamp
}

type tenantStamp struct {
	tenant string
	last   uint64
}

// EmptyTenant is what tree.rs returns when the matched node has no tenant.
const EmptyTenant = "empty"

func NewTree() *Tree {
	return &Tree{
		root:      &treeNode{children: make(map[rune]*treeNode)},
		charCount: make(map[string]int),
	}
}

func (t *Tree) tick() uint64 {
	e := t.epoch
	t.epoch++
	return e
}

func (n *treeNode) stamp(tenant string) *tenantStamp {
	for i := range n.tenants {
		if n.tenants[i].tenant == tenant {
			return &n.tenants[i]
		}
	}
	return nil
}

func (n *treeNode) has(tenant string) bool { return n.stamp(tenant) != nil }

func (n *treeNode) drop(tenant string) {
	for i := range n.tenants {
		if n.tenants[i].tenant == tenant {
			n.tenants = append(n.tenants[:i], n.tenants[i+1:]...)
			return
		}
	}
}

// leafFor reports whether tenant holds n but none of n's children.
func (n *treeNode) leafFor(tenant string) bool {
	if !n.has(tenant) {
		return false
	}
	for _, c := range n.children {
		if c.has(tenant) {
			return false
		}
	}
	return true
}

// shared returns how many leading runes a and b have in common, and their length in bytes.
// The common bytes are found by halving with string comparisons (memequal, many bytes at a
// time), then cut back to the start of the rune they end in.
func shared(a, b string) (runes, bytes int) {
	lo, hi := 0, min(len(a), len(b)) // a[:lo] == b[:lo]; the common prefix is at most hi
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if a[lo:mid] == b[lo:mid] {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	for lo > 0 && ((lo < len(a) && !utf8.RuneStart(a[lo])) || (lo < len(b) && !utf8.RuneStart(b[lo]))) {
		lo--
	}
	return utf8.RuneCountInString(a[:lo]), lo
}

func firstRune(s string) rune {
	r, _ := utf8.DecodeRuneInString(s)
	return r
}

// Insert records that tenant holds text.
func (t *Tree) Insert(text, tenant string) {
	t.mu.Lock()
	defer t.mu.Unlock()

	// The root holds every tenant ever inserted, with timestamp 0: it is never evicted.
	if !t.root.has(tenant) {
		t.root.tenants = append(t.root.tenants, tenantStamp{tenant: tenant})
	}
	if _, ok := t.charCount[tenant]; !ok {
		t.charCount[tenant] = 0
	}

	prev := t.root
	for rest := text; rest != ""; {
		c := firstRune(rest)
		child := prev.children[c]
		if child == nil {
			t.nodes++
			leaf := &treeNode{
				id:       t.nodes,
				text:     rest,
				chars:    utf8.RuneCountInString(rest),
				parent:   prev,
				children: make(map[rune]*treeNode),
				tenants:  []tenantStamp{{tenant: tenant, last: t.tick()}},
			}
			prev.children[c] = leaf
			t.charCount[tenant] += leaf.chars
			return
		}
		n, nb := shared(rest, child.text)
		if n < child.chars {
			// Split child at n: the new node takes the shared head and child's tenants.
			t.nodes++
			head := &treeNode{
				id:       t.nodes,
				text:     child.text[:nb],
				chars:    n,
				parent:   prev,
				children: make(map[rune]*treeNode),
				tenants:  append([]tenantStamp(nil), child.tenants...),
			}
			child.text = child.text[nb:]
			child.chars -= n
			child.parent = head
			head.children[firstRune(child.text)] = child
			prev.children[c] = head
			child = head
		}
		if !child.has(tenant) {
			child.tenants = append(child.tenants, tenantStamp{tenant: tenant})
			t.charCount[tenant] += child.chars
		}
		prev = child
		rest = rest[nb:]
	}
	prev.stamp(tenant).last = t.tick()
}

// Match is the result of PrefixMatch, as tree.rs's PrefixMatchResult.
type Match struct {
	Tenant  string // one tenant of the deepest matched node (see treeNode.tenants)
	Matched int    // chars of text matched
	Input   int    // chars of text
}

// PrefixMatch walks text down the tree as far as it matches. A match that ends inside a node
// still counts the chars matched there and takes its tenant from that node.
func (t *Tree) PrefixMatch(text string) Match {
	t.mu.Lock()
	defer t.mu.Unlock()

	matched := 0
	curr := t.root
	for rest := text; rest != ""; {
		child := curr.children[firstRune(rest)]
		if child == nil {
			break
		}
		n, nb := shared(rest, child.text)
		matched += n
		curr = child
		if n < child.chars {
			break
		}
		rest = rest[nb:]
	}

	tenant := EmptyTenant
	if len(curr.tenants) > 0 {
		tenant = curr.tenants[0].tenant
	}
	if e := t.tick(); e&7 == 0 {
		if s := curr.stamp(tenant); s != nil {
			s.last = e
		}
	}
	return Match{Tenant: tenant, Matched: matched, Input: utf8.RuneCountInString(text)}
}

// EvictTenantBySize removes, for every tenant holding more than max chars, its least recently
// used leaves until it holds max chars or fewer.
func (t *Tree) EvictTenantBySize(max int) {
	t.mu.Lock()
	defer t.mu.Unlock()

	var pq evictionHeap
	stack := []*treeNode{t.root}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, c := range n.children {
			stack = append(stack, c)
		}
		for _, s := range n.tenants {
			if n.leafFor(s.tenant) {
				pq = append(pq, eviction{last: s.last, tenant: s.tenant, node: n})
			}
		}
	}
	heap.Init(&pq)

	for pq.Len() > 0 {
		e := heap.Pop(&pq).(eviction)
		if used, ok := t.charCount[e.tenant]; ok && used <= max {
			continue
		}
		n := e.node
		if !n.leafFor(e.tenant) {
			continue
		}
		t.charCount[e.tenant] = max0(t.charCount[e.tenant] - n.chars)
		n.drop(e.tenant)
		if len(n.children) == 0 && len(n.tenants) == 0 && n.parent != nil {
			delete(n.parent.children, firstRune(n.text))
		}
		if p := n.parent; p != nil && p.leafFor(e.tenant) {
			heap.Push(&pq, eviction{last: p.stamp(e.tenant).last, tenant: e.tenant, node: p})
		}
	}
}

// RemoveTenant forgets tenant everywhere (SGLang does it when a worker is gone).
func (t *Tree) RemoveTenant(tenant string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var walk func(n *treeNode)
	walk = func(n *treeNode) {
		for _, c := range n.children {
			walk(c)
		}
		n.drop(tenant)
		if len(n.children) == 0 && len(n.tenants) == 0 && n.parent != nil {
			delete(n.parent.children, firstRune(n.text))
		}
	}
	walk(t.root)
	delete(t.charCount, tenant)
}

// Sizes returns the chars held per tenant, as maintained.
func (t *Tree) Sizes() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int, len(t.charCount))
	for k, v := range t.charCount {
		out[k] = v
	}
	return out
}

func max0(v int) int {
	if v < 0 {
		return 0
	}
	return v
}

// eviction is an entry of the eviction queue: a tenant's leaf and when the tenant last
// touched it. Entries with the same timestamp pop in no particular order in tree.rs; here by
// tenant, then by the node's age, so that a simulation gives the same result on every run.
type eviction struct {
	last   uint64
	tenant string
	node   *treeNode
}

type evictionHeap []eviction

func (h evictionHeap) Len() int { return len(h) }
func (h evictionHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.last != b.last {
		return a.last < b.last
	}
	if a.tenant != b.tenant {
		return a.tenant < b.tenant
	}
	return a.node.id < b.node.id
}
func (h evictionHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *evictionHeap) Push(x any)   { *h = append(*h, x.(eviction)) }
func (h *evictionHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
