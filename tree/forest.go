package tree

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Limits bound what a Forest stores. Zero means unbounded.
type Limits struct {
	MaxChars       int64            // chars stored across all trees, each node's chars counted once
	TenantMaxChars map[string]int64 // per-tenant bound (kvroute derives it from an upstream's kv_capacity); absent = unbounded
}

// EvictStats describes one eviction pass.
type EvictStats struct {
	Chars    int64 // chars freed from the forest total
	Nodes    int   // nodes removed
	Duration time.Duration
}

// Forest is a set of named trees (one per model) sharing one char budget, one recency clock and
// one tenant table. Safe for concurrent use.
//
// Crossing MaxChars on insert starts an eviction pass in a new goroutine, down to 90% of
// MaxChars; an insert that would take the forest past MaxChars+10% evicts first and waits,
// and stores only what fits when eviction cannot make room. Crossing a tenant's bound starts a
// pass as well, which evicts that tenant's least recently used leaves down to 90% of its
// bound.
type Forest struct {
	mu    sync.Mutex                       // serializes changes to trees
	trees atomic.Pointer[map[string]*Tree] // copy on write: lookups take no lock

	// idMu is held shared by inserts from interning a tenant until the insert is done, and
	// exclusively to recycle ids, so that no insert can store an id that was just freed.
	idMu   sync.RWMutex
	names  sync.Mutex                        // serializes interning; guards free
	byName atomic.Pointer[map[string]uint32] // copy on write
	free   []freeID                          // oldest first
	// table maps ids to tenants; copy on write, so readers need no lock. A freed id's slot
	// is nil.
	table atomic.Pointer[[]*tenant]

	clock  atomic.Uint64 // recency stamps; one tick per insert
	chars  atomic.Int64  // stored chars, all trees
	limits atomic.Pointer[Limits]
	// grace is the hard cap inserts keep after StoreLimits lowered MaxChars, until a pass
	// planned with the new limits ends: the replaced limits' cap; -1: unbounded; 0: none.
	grace atomic.Int64

	evictMu  sync.Mutex   // one pass at a time
	evicting atomic.Bool  // a background pass is scheduled or running
	waiters  atomic.Int32 // inserts waiting for room under the hard cap
	// inline runs the passes that inserts trigger in the inserting goroutine (tests).
	inline bool
}

// idQuarantine is how long a freed tenant id waits before reuse. Matches read the tenant
// table without a lock; one that began before the id was freed must not find it renamed.
var idQuarantine = time.Minute

type freeID struct {
	id uint32
	at time.Time
}

type tenant struct {
	name  string
	chars atomic.Int64 // charged chars, all trees
	limit atomic.Int64 // 0: unbounded
}

// NewForest returns an empty forest bounded by l.
func NewForest(l Limits) *Forest {
	f := &Forest{}
	f.trees.Store(&map[string]*Tree{})
	f.byName.Store(&map[string]uint32{})
	f.table.Store(new([]*tenant))
	f.storeLimits(l)
	return f
}

// Inline makes the eviction passes that inserts start run at once, in the inserting
// goroutine, instead of in the background: a caller that needs the same trees on every run
// (the fleet simulator, in virtual time) calls it before the forest's first use.
func (f *Forest) Inline() { f.inline = true }

func (f *Forest) storeLimits(l Limits) { f.storeLimitsKeeping(l, false) }

// storeLimitsKeeping is storeLimits; with keepCap, a lowered MaxChars keeps the replaced cap
// as grace (StoreLimits).
func (f *Forest) storeLimitsKeeping(l Limits, keepCap bool) {
	l.MaxChars = max(l.MaxChars, 0)
	l.TenantMaxChars = maps.Clone(l.TenantMaxChars)
	f.names.Lock() // a tenant interned meanwhile sees either these limits or the loop
	if old := f.limits.Load(); keepCap && old != nil && l.MaxChars > 0 && (old.MaxChars == 0 || l.MaxChars < old.MaxChars) {
		g := int64(-1)
		if old.MaxChars > 0 {
			g = hardCap(old.MaxChars)
		}
		if cur := f.grace.Load(); cur < 0 || cur > g && g > 0 {
			g = cur
		}
		f.grace.Store(g)
	}
	f.limits.Store(&l)
	for _, t := range *f.table.Load() {
		if t != nil {
			t.limit.Store(max(l.TenantMaxChars[t.name], 0))
		}
	}
	f.names.Unlock()
}

// SetLimits sets new limits and evicts at once if the forest is over them.
func (f *Forest) SetLimits(l Limits) {
	f.storeLimits(l)
	f.Evict()
}

// StoreLimits sets new limits without evicting: the caller runs Evict (in the background) to
// bring the forest within them. Until a pass planned with them ends, a lowered MaxChars does
// not lower the hard cap inserts wait at: an insert over it starts a pass in the background as
// usual, so shrinking a full forest makes no insert wait for the pass that shrinks it.
func (f *Forest) StoreLimits(l Limits) {
	f.storeLimitsKeeping(l, true)
}

// hardCapNow is the chars an insert may take the forest to without waiting for a pass; 0:
// unbounded.
func (f *Forest) hardCapNow() int64 {
	c := hardCap(f.limits.Load().MaxChars)
	switch g := f.grace.Load(); {
	case c == 0:
		return 0
	case g < 0:
		return 0
	case g > c:
		return g
	}
	return c
}

// endGrace drops the grace cap once a pass planned with the limits in force (l) has ended.
func (f *Forest) endGrace(l *Limits) {
	if f.grace.Load() == 0 {
		return
	}
	f.names.Lock()
	if f.limits.Load() == l {
		f.grace.Store(0)
	}
	f.names.Unlock()
}

// Tree returns the tree called name, creating it if needed.
func (f *Forest) Tree(name string) *Tree {
	if t := f.Get(name); t != nil {
		return t
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t := (*f.trees.Load())[name]
	if t == nil {
		t = &Tree{f: f, name: name}
		t.used.Store(f.clock.Load()) // as recent as the latest insert: not the next to go
		trees := maps.Clone(*f.trees.Load())
		trees[name] = t
		f.trees.Store(&trees)
	}
	return t
}

// MakeRoom drops the least recently used trees (by their last insert) until fewer than keep
// remain, so that one more tree keeps the forest within keep, and returns how many it dropped.
// Tree names are model names, which come from clients: without it, junk names would hold their
// trees for good. Dropped trees free their chars; handles to them forward to a new tree of the
// same name, as after Reset.
func (f *Forest) MakeRoom(keep int) int {
	f.idMu.RLock() // as Reset: no id is recycled while charges are taken back
	defer f.idMu.RUnlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := *f.trees.Load()
	over := len(cur) - max(keep, 1) + 1
	if over <= 0 {
		return 0
	}
	ts := slices.Collect(maps.Values(cur))
	slices.SortFunc(ts, func(a, b *Tree) int { return cmp.Compare(a.used.Load(), b.used.Load()) })
	trees := maps.Clone(cur)
	for _, t := range ts[:over] {
		t.mu.Lock()
		t.clear()
		t.detached.Store(true)
		t.mu.Unlock()
		delete(trees, t.name)
	}
	f.trees.Store(&trees)
	return over
}

// Get returns the tree called name, or nil.
func (f *Forest) Get(name string) *Tree {
	return (*f.trees.Load())[name]
}

// Names returns the names of the trees, sorted.
func (f *Forest) Names() []string {
	return slices.Sorted(maps.Keys(*f.trees.Load()))
}

// Len returns the number of trees.
func (f *Forest) Len() int {
	return len(*f.trees.Load())
}

func (f *Forest) treeList() []*Tree {
	trees := *f.trees.Load()
	ts := make([]*Tree, 0, len(trees))
	for _, name := range slices.Sorted(maps.Keys(trees)) {
		ts = append(ts, trees[name])
	}
	return ts
}

// Chars returns the chars stored in all trees, each node's chars counted once.
func (f *Forest) Chars() int64 { return f.chars.Load() }

// TenantChars returns the chars charged to tenant in all trees.
func (f *Forest) TenantChars(tenant string) int64 {
	id, ok := f.lookup(tenant)
	if !ok {
		return 0
	}
	if t := (*f.table.Load())[id]; t != nil {
		return t.chars.Load()
	}
	return 0
}

// Tenants returns the tenants holding chars, sorted.
func (f *Forest) Tenants() []string {
	var out []string
	for _, t := range *f.table.Load() {
		if t != nil && t.chars.Load() > 0 {
			out = append(out, t.name)
		}
	}
	slices.Sort(out)
	return out
}

// RemoveTenant removes tenant from every tree.
func (f *Forest) RemoveTenant(tenant string) {
	f.idMu.Lock()
	defer f.idMu.Unlock()
	id, ok := f.lookup(tenant)
	if !ok {
		return
	}
	for _, t := range f.treeList() {
		t.mu.Lock()
		t.removeTenant(id)
		t.mu.Unlock()
	}
	f.release([]uint32{id})
}

// Reset drops every tree and forgets every tenant. Trees handed out before keep working: they
// forward to the forest's tree of the same name.
func (f *Forest) Reset() {
	f.idMu.Lock()
	defer f.idMu.Unlock()
	f.mu.Lock()
	for _, t := range *f.trees.Load() {
		t.mu.Lock()
		t.clear()
		t.detached.Store(true)
		t.mu.Unlock()
	}
	f.trees.Store(&map[string]*Tree{})
	f.mu.Unlock()
	var ids []uint32
	for id, t := range *f.table.Load() {
		if t != nil {
			ids = append(ids, uint32(id))
		}
	}
	f.release(ids)
}

// intern returns tenant's id, allocating one if needed. The caller holds idMu shared.
func (f *Forest) intern(name string) uint32 {
	if id, ok := f.lookup(name); ok {
		return id
	}
	f.names.Lock()
	defer f.names.Unlock()
	if id, ok := (*f.byName.Load())[name]; ok {
		return id
	}
	t := &tenant{name: name}
	t.limit.Store(max(f.limits.Load().TenantMaxChars[name], 0))
	table := slices.Clone(*f.table.Load())
	var id uint32
	if len(f.free) > 0 && time.Since(f.free[0].at) >= idQuarantine {
		id = f.free[0].id
		f.free = f.free[1:]
		table[id] = t
	} else {
		id = uint32(len(table))
		table = append(table, t)
	}
	byName := maps.Clone(*f.byName.Load())
	byName[name] = id
	f.table.Store(&table)
	f.byName.Store(&byName)
	return id
}

func (f *Forest) lookup(name string) (uint32, bool) {
	id, ok := (*f.byName.Load())[name]
	return id, ok
}

// release frees ids that no node holds any more. The caller holds idMu exclusively.
func (f *Forest) release(ids []uint32) {
	if len(ids) == 0 {
		return
	}
	f.names.Lock()
	defer f.names.Unlock()
	table := slices.Clone(*f.table.Load())
	byName := maps.Clone(*f.byName.Load())
	for _, id := range ids {
		t := table[id]
		if t == nil {
			continue
		}
		delete(byName, t.name)
		table[id] = nil
		f.free = append(f.free, freeID{id, time.Now()})
	}
	f.byName.Store(&byName)
	f.table.Store(&table)
}

// overBound reports whether a pass is needed after an insert for tenant id: the forest is
// over MaxChars or the tenant over its own bound.
func (f *Forest) overBound(id uint32) bool {
	if b := f.limits.Load().MaxChars; b > 0 && f.chars.Load() > b {
		return true
	}
	if table := *f.table.Load(); int(id) < len(table) && table[id] != nil {
		t := table[id]
		return t.limit.Load() > 0 && t.chars.Load() > t.limit.Load()
	}
	return false
}

// overAny reports whether the forest is over MaxChars or any tenant over its own bound.
func (f *Forest) overAny() bool {
	if b := f.limits.Load().MaxChars; b > 0 && f.chars.Load() > b {
		return true
	}
	for _, t := range *f.table.Load() {
		if t != nil && t.limit.Load() > 0 && t.chars.Load() > t.limit.Load() {
			return true
		}
	}
	return false
}

// kick starts a background pass unless one is scheduled or running.
func (f *Forest) kick() {
	if f.inline {
		f.Evict()
		return
	}
	if !f.evicting.CompareAndSwap(false, true) {
		return
	}
	go func() {
		// An insert that crosses a bound while this pass ends finds evicting still set and
		// starts none: look again once the flag is down (a bounded number of times, in case
		// a pass cannot get under a bound).
		for range 3 {
			f.Evict()
			f.evicting.Store(false)
			if !f.overAny() || !f.evicting.CompareAndSwap(false, true) {
				return
			}
		}
		f.evicting.Store(false)
	}()
}

// reserve adds n chars to the forest total if that keeps it within MaxChars+10%, and reports
// whether it did.
func (f *Forest) reserve(n int64) bool {
	limit := f.hardCapNow()
	for {
		c := f.chars.Load()
		if limit > 0 && c+n > limit {
			return false
		}
		if f.chars.CompareAndSwap(c, c+n) {
			return true
		}
	}
}

// room returns how many chars fit under the low-water mark of MaxChars.
func (f *Forest) room() int64 {
	return max(lowWater(f.limits.Load().MaxChars)-f.chars.Load(), 0)
}

func hardCap(bound int64) int64 { return bound + bound/10 }

func lowWater(bound int64) int64 { return bound - bound/10 }
