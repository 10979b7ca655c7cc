package engine

// blockCache is the prefix cache's index: the blocks that hold a computed prompt block, by
// chained hash, each with the number of running requests using it. Unreferenced blocks stay
// cached, in a least-recently-released list, until their room is needed.
type blockCache struct {
	index      map[uint64]int32
	nodes      []cacheNode // nodes[0] is the sentinel of the circular free list, oldest first
	unused     []int32     // node slots to reuse
	referenced int         // blocks with ref > 0
	evictions  uint64
}

type cacheNode struct {
	hash       uint64
	ref        int32
	prev, next int32 // in the free list while ref == 0
}

func (c *blockCache) init() {
	c.index = make(map[uint64]int32)
	c.nodes = []cacheNode{{}}
	c.unused = nil
	c.referenced = 0
	c.evictions = 0
}

func (c *blockCache) size() int      { return len(c.index) }
func (c *blockCache) evictable() int { return len(c.index) - c.referenced }

func (c *blockCache) has(h uint64) bool {
	_, ok := c.index[h]
	return ok
}

// acquire takes a reference to the cached block h (which must be cached).
func (c *blockCache) acquire(h uint64) {
	i := c.index[h]
	n := &c.nodes[i]
	if n.ref == 0 {
		c.unlink(i)
		c.referenced++
	}
	n.ref++
}

// add caches block h with one reference, or takes a reference to it when it is cached.
func (c *blockCache) add(h uint64) {
	if _, ok := c.index[h]; ok {
		c.acquire(h)
		return
	}
	var i int32
	if k := len(c.unused); k > 0 {
		i = c.unused[k-1]
		c.unused = c.unused[:k-1]
	} else {
		c.nodes = append(c.nodes, cacheNode{})
		i = int32(len(c.nodes) - 1)
	}
	c.nodes[i] = cacheNode{hash: h, ref: 1}
	c.index[h] = i
	c.referenced++
}

// release drops a reference to block h; at zero the block becomes the most recent evictable.
func (c *blockCache) release(h uint64) {
	i, ok := c.index[h]
	if !ok {
		return
	}
	n := &c.nodes[i]
	if n.ref--; n.ref > 0 {
		return
	}
	c.referenced--
	// Append at the tail (newest) of the free list.
	s := &c.nodes[0]
	last := s.prev
	n.prev, n.next = last, 0
	c.nodes[last].next = i
	c.nodes[0].prev = i
}

// evictOne drops the least recently released unreferenced block.
func (c *blockCache) evictOne() {
	i := c.nodes[0].next
	if i == 0 {
		return
	}
	c.unlink(i)
	delete(c.index, c.nodes[i].hash)
	c.unused = append(c.unused, i)
	c.evictions++
}

func (c *blockCache) unlink(i int32) {
	n := &c.nodes[i]
	c.nodes[n.prev].next = n.next
	c.nodes[n.next].prev = n.prev
	n.prev, n.next = 0, 0
}
