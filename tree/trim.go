package tree

import "strings"

// Trim removes tenant from the branches that leave text's path at a depth of keep runes or
// more, and returns the chars it stopped charging tenant. text's own path stays: Trim is for
// an upstream that reported, for a prompt it was just sent, fewer cached tokens than the tree
// claimed. The engine computed that prompt again, so it holds the prompt's path now; what it
// lost are the other prompts that shared the part of the path it no longer had (an engine's
// prefix cache chains each block to its prefix, so a lost block takes what extends it).
//
// At most budget nodes are visited below the path, deepest first, so that one call never
// rewrites a whole tree; a node keeps tenant while a child of it does, so the nodes tenant
// holds still hang from the root. Nodes no tenant holds any more are removed.
func (t *Tree) Trim(text, tenant string, keep, budget int) int64 {
	if budget <= 0 {
		return 0
	}
	f := t.f
	f.idMu.RLock()
	defer f.idMu.RUnlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok := f.lookup(tenant)
	if !ok || int(id) >= len(t.tenantChars) || t.tenantChars[id] == 0 {
		return 0
	}
	var removed int64
	n, rem, depth := &t.root, text, 0
	for budget > 0 {
		var next *node
		if rem != "" {
			// A child the text only partly follows counts as on the path: its shared part is
			// what the engine just computed.
			if c := n.child(firstKey(rem)); c != nil && c.holds(id) {
				next = c
			}
		}
		if depth >= keep {
			for _, e := range n.kids() {
				if e.n != next && e.n.holds(id) {
					removed += t.trimBranch(e.n, id, &budget)
				}
			}
		}
		if next == nil || !strings.HasPrefix(rem, next.text) || next.open && len(rem) > len(next.text) {
			break
		}
		depth += next.runes
		rem = rem[len(next.text):]
		n = next
	}
	return removed
}

// trimBranch removes id from the nodes of the branch under b (b included) that it visits within
// budget, children before parents, under t.mu.
func (t *Tree) trimBranch(b *node, id uint32, budget *int) int64 {
	var order []*node
	stack := []*node{b}
	for len(stack) > 0 && len(order) < *budget {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		order = append(order, n)
		for _, e := range n.kids() {
			if e.n.holds(id) {
				stack = append(stack, e.n)
			}
		}
	}
	*budget -= len(order)
	var removed int64
	for i := len(order) - 1; i >= 0; i-- {
		n := order[i]
		if n.dead || n.childHolds(id) {
			continue // a descendant past the budget still holds id
		}
		n.removeHolder(id)
		t.charge(id, -int64(n.runes))
		removed += int64(n.runes)
		if n.holders() == nil && n.kids() == nil {
			t.detach(n)
		}
	}
	return removed
}
