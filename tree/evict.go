package tree

import (
	"maps"
	"runtime"
	"time"
)

// Eviction works in passes, one at a time per forest. A pass scans the trees for candidates
// and takes them oldest first from one heap across all trees:
//
//   - while the forest is over MaxChars, leaf nodes, by the node's last access; removing one
//     frees its chars for every tenant on it;
//   - while a tenant is over its own bound, that tenant's leaves (nodes it holds and none of
//     their children does), by its stamp there; removing one frees the node only when no
//     other tenant holds it.
//
// A removal can make the parent a leaf, which joins the heap. Candidates are checked again
// before removal, and one touched since the scan goes back into the heap with its new stamp.
//
// Matches never wait for a pass: the scan reads the trees as matches do, without a lock, and
// removals take only the writers' mutex, evictBatch at a time. After every workSlice of work
// a pass yields the processor, unless an insert waits for it.
const (
	evictBatch = 32
	workSlice  = time.Millisecond
	maxRounds  = 3
)

// Evict removes least recently used leaves across all trees until every bound holds, down to
// 90% of each bound that was exceeded, then drops the trees left empty.
func (f *Forest) Evict() EvictStats {
	f.evictMu.Lock()
	defer f.evictMu.Unlock()
	return f.pass(0)
}

// evictFor makes room for an insert of need chars that would take the forest past its hard
// cap.
func (f *Forest) evictFor(need int64) {
	f.waiters.Add(1) // a running pass stops resting
	defer f.waiters.Add(-1)
	f.evictMu.Lock()
	defer f.evictMu.Unlock()
	f.pass(need)
}

type candidate struct {
	stamp uint64
	t     *Tree
	n     *node
	gen   uint64
	id    int64 // tenant id; -1: the whole node, for the forest bound
}

type plan struct {
	f      *Forest
	limits *Limits // the limits it was planned with
	urgent bool    // an insert waits: do not rest
	start  time.Time
	slice  time.Time // start of the current work slice
	table  []*tenant
	global int64   // target for the forest's chars; -1: none
	target []int64 // per tenant id: target chars; -1: none
	over   []uint32
	heap   []candidate
	stats  EvictStats
}

// pass runs one pass under evictMu.
func (f *Forest) pass(need int64) EvictStats {
	p := f.plan(need)
	for round := 0; round < maxRounds && p.needed(); round++ {
		for _, t := range f.treeList() {
			p.scan(t)
		}
		if len(p.heap) == 0 {
			break
		}
		p.drain()
		p.heap = p.heap[:0]
	}
	f.dropEmpty()
	f.collectTenants()
	f.endGrace(p.limits)
	p.stats.Duration = time.Since(p.start)
	return p.stats
}

// plan sets the targets of a pass: the bounds that are exceeded, and room for need chars
// under the hard cap.
func (f *Forest) plan(need int64) *plan {
	now := time.Now()
	l := f.limits.Load()
	p := &plan{f: f, limits: l, global: -1, table: *f.table.Load(), urgent: need > 0, start: now, slice: now}
	if b := l.MaxChars; b > 0 {
		c, capNow := f.chars.Load(), f.hardCapNow()
		if c > b || need > 0 && capNow > 0 && c+need > capNow {
			p.global = lowWater(b)
			if need > 0 && capNow > 0 {
				p.global = max(min(p.global, capNow-need), 0)
			}
		}
	}
	p.target = make([]int64, len(p.table))
	for id, t := range p.table {
		p.target[id] = -1
		if t == nil {
			continue
		}
		if lim := t.limit.Load(); lim > 0 && t.chars.Load() > lim {
			p.target[id] = lowWater(lim)
			p.over = append(p.over, uint32(id))
		}
	}
	return p
}

func (p *plan) globalNeeded() bool { return p.global >= 0 && p.f.chars.Load() > p.global }

func (p *plan) tenantNeeded(id uint32) bool {
	return int(id) < len(p.target) && p.target[id] >= 0 && p.table[id].chars.Load() > p.target[id]
}

func (p *plan) needed() bool {
	if p.globalNeeded() {
		return true
	}
	for _, id := range p.over {
		if p.tenantNeeded(id) {
			return true
		}
	}
	return false
}

// rest lets other goroutines run when the pass has worked a whole slice, unless an insert
// waits for it. It costs nothing on a machine with idle cores; on a saturated one the pass
// gets a slice per scheduling round instead of a core.
func (p *plan) rest() {
	if p.urgent || p.f.waiters.Load() > 0 {
		return
	}
	if time.Since(p.slice) >= workSlice {
		runtime.Gosched()
		p.slice = time.Now()
	}
}

// scan collects t's candidates. It reads the tree without a lock, as Match does; nodes may
// change meanwhile, and drain checks every candidate again.
func (p *plan) scan(t *Tree) {
	if t.detached.Load() {
		return
	}
	t.mu.Lock()
	gen := t.gen
	t.mu.Unlock()
	stack := []*node{&t.root}
	for i := 0; len(stack) > 0; i++ {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		kids := n.kids()
		for _, e := range kids {
			stack = append(stack, e.n)
		}
		if n != &t.root {
			p.consider(t, n, kids, gen)
		}
		if i%256 == 255 {
			p.rest()
		}
	}
}

// consider pushes the candidates n is; kids are n's children.
func (p *plan) consider(t *Tree, n *node, kids []edge, gen uint64) {
	if p.global >= 0 && len(kids) == 0 {
		p.push(candidate{stamp: n.stamp(), t: t, n: n, gen: gen, id: -1})
	}
	if len(p.over) == 0 {
		return
	}
	hs := n.holders()
	for i := range hs {
		id := hs[i].id
		if int(id) < len(p.target) && p.target[id] >= 0 && !n.childHolds(id) {
			p.push(candidate{stamp: hs[i].stamp.Load(), t: t, n: n, gen: gen, id: int64(id)})
		}
	}
}

// drain removes candidates oldest first until the bounds hold, in batches under the write
// lock of one tree at a time.
func (p *plan) drain() {
	var locked *Tree
	batch := 0
	for len(p.heap) > 0 && p.needed() {
		e := p.pop()
		if e.t != locked {
			if locked != nil {
				locked.mu.Unlock()
			}
			locked = e.t
			locked.mu.Lock()
			batch = 0
		}
		p.apply(e)
		if batch++; batch >= evictBatch {
			locked.mu.Unlock()
			locked = nil
			p.rest()
		}
	}
	if locked != nil {
		locked.mu.Unlock()
	}
}

// apply checks e and removes it, under e.t.mu.
func (p *plan) apply(e candidate) {
	t, n := e.t, e.n
	if t.gen != e.gen || t.detached.Load() || n.dead {
		return
	}
	parent := n.parent
	if e.id < 0 {
		if !p.globalNeeded() || n.kids() != nil {
			return
		}
		if s := n.stamp(); s != e.stamp {
			e.stamp = s
			p.push(e)
			return
		}
		hs := n.holders()
		for i := range hs {
			t.charge(hs[i].id, -int64(n.runes))
		}
		n.setHolders(nil)
		p.remove(t, n)
	} else {
		id := uint32(e.id)
		if !p.tenantNeeded(id) {
			return
		}
		h := n.holder(id)
		if h == nil || n.childHolds(id) {
			return
		}
		if s := h.stamp.Load(); s != e.stamp {
			e.stamp = s
			p.push(e)
			return
		}
		n.removeHolder(id)
		t.charge(id, -int64(n.runes))
		if n.holders() == nil && n.kids() == nil {
			p.remove(t, n)
		}
	}
	if parent != &t.root {
		p.consider(t, parent, parent.kids(), e.gen)
	}
}

func (p *plan) remove(t *Tree, n *node) {
	t.detach(n)
	p.stats.Nodes++
	p.stats.Chars += int64(n.runes)
}

// dropEmpty drops the trees that hold nothing.
func (f *Forest) dropEmpty() {
	for _, t := range f.treeList() {
		if t.chars.Load() != 0 {
			continue
		}
		f.mu.Lock()
		t.mu.Lock()
		if trees := *f.trees.Load(); trees[t.name] == t && t.root.kids() == nil {
			trees = maps.Clone(trees)
			delete(trees, t.name)
			f.trees.Store(&trees)
			t.detached.Store(true)
		}
		t.mu.Unlock()
		f.mu.Unlock()
	}
}

// collectTenants frees the ids of tenants that hold nothing, unless an insert is running.
func (f *Forest) collectTenants() {
	var idle bool
	for _, t := range *f.table.Load() {
		if t != nil && t.chars.Load() == 0 {
			idle = true
			break
		}
	}
	if !idle || !f.idMu.TryLock() {
		return
	}
	defer f.idMu.Unlock()
	var ids []uint32
	for id, t := range *f.table.Load() {
		if t != nil && t.chars.Load() == 0 {
			ids = append(ids, uint32(id))
		}
	}
	f.release(ids)
}

// The heap is a binary min-heap on stamp, written out to avoid container/heap's boxing.

func (p *plan) push(c candidate) {
	h := append(p.heap, c)
	i := len(h) - 1
	for i > 0 {
		up := (i - 1) / 2
		if h[up].stamp <= h[i].stamp {
			break
		}
		h[up], h[i] = h[i], h[up]
		i = up
	}
	p.heap = h
}

func (p *plan) pop() candidate {
	h := p.heap
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h[last] = candidate{}
	h = h[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		m := l
		if r := l + 1; r < len(h) && h[r].stamp < h[l].stamp {
			m = r
		}
		if h[i].stamp <= h[m].stamp {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	p.heap = h
	return top
}
