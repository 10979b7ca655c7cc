package llmsim

import "sync"

// BlockCache is an LRU set of KV cache blocks, identified by their chained hashes, that works
// like vLLM's automatic prefix cache. It is safe for concurrent use.
//
// A request hits the leading blocks of its prompt found in the cache (Lookup) and then inserts
// or touches all of them (Insert). Insert touches a prompt's blocks from the last to the first,
// so that under pressure the tail of a prefix chain is evicted before its head, as vLLM's free
// block queue does: a chain missing its head is worth nothing.
type BlockCache struct {
	mu       sync.Mutex
	capacity int // in blocks; <= 0 means unlimited
	index    map[uint64]int32
	nodes    []lruNode // nodes[0] is the sentinel of a circular list, most recent first
	free     []int32
	evicted  uint64
}

type lruNode struct {
	key        uint64
	prev, next int32
}

// NewBlockCache returns an empty cache holding at most capacity blocks; capacity <= 0 makes it
// unlimited (the infinite-cache reference).
func NewBlockCache(capacity int) *BlockCache {
	c := &BlockCache{capacity: capacity}
	c.init()
	return c
}

func (c *BlockCache) init() {
	hint := c.capacity
	if hint <= 0 || hint > 1<<16 {
		hint = 1 << 10
	}
	c.index = make(map[uint64]int32, hint)
	c.nodes = make([]lruNode, 1, hint+1)
	c.free = c.free[:0]
}

// Capacity returns the capacity in blocks (<= 0: unlimited).
func (c *BlockCache) Capacity() int { return c.capacity }

// Len returns the number of blocks held.
func (c *BlockCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.index)
}

// Evictions returns the number of blocks evicted since the cache was created or reset.
func (c *BlockCache) Evictions() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.evicted
}

// Reset empties the cache.
func (c *BlockCache) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.evicted = 0
	c.init()
}

// Lookup returns the prompt's cached tokens: its leading blocks found in the cache, times the
// block size. Like vLLM, it never reports the whole prompt as cached: the last token is always
// computed, so a fully cached prompt hits one block less when its length is a multiple of the
// block size. Lookup does not change the LRU order.
func (c *BlockCache) Lookup(p Prompt) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lookup(p)
}

// Insert inserts or touches every full block of the prompt, evicting least recently used
// blocks when the cache is full.
func (c *BlockCache) Insert(p Prompt) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.insert(p)
}

// Access is Lookup followed by Insert, atomically: what one request does to a cache when
// requests are replayed one after the other.
func (c *BlockCache) Access(p Prompt) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	hit := c.lookup(p)
	c.insert(p)
	return hit
}

func (c *BlockCache) lookup(p Prompt) int {
	maxBlocks := 0
	if p.Tokens > 0 && p.BlockTokens > 0 {
		maxBlocks = (p.Tokens - 1) / p.BlockTokens
	}
	n := 0
	for _, h := range p.Hashes[:min(maxBlocks, len(p.Hashes))] {
		if _, ok := c.index[h]; !ok {
			break
		}
		n++
	}
	return n * p.BlockTokens
}

func (c *BlockCache) insert(p Prompt) {
	// First take the blocks already held out of eviction's reach, as vLLM does when it admits
	// a request: the prompt's new blocks must not evict its own cached ones.
	for i := len(p.Hashes) - 1; i >= 0; i-- {
		if j, ok := c.index[p.Hashes[i]]; ok {
			c.unlink(j)
			c.pushFront(j)
		}
	}
	for i := len(p.Hashes) - 1; i >= 0; i-- {
		c.touch(p.Hashes[i])
	}
}

func (c *BlockCache) touch(key uint64) {
	if i, ok := c.index[key]; ok {
		c.unlink(i)
		c.pushFront(i)
		return
	}
	if c.capacity > 0 && len(c.index) >= c.capacity {
		last := c.nodes[0].prev
		c.unlink(last)
		delete(c.index, c.nodes[last].key)
		c.free = append(c.free, last)
		c.evicted++
	}
	var i int32
	if n := len(c.free); n > 0 {
		i = c.free[n-1]
		c.free = c.free[:n-1]
	} else {
		i = int32(len(c.nodes))
		c.nodes = append(c.nodes, lruNode{})
	}
	c.nodes[i].key = key
	c.index[key] = i
	c.pushFront(i)
}

func (c *BlockCache) unlink(i int32) {
	n := &c.nodes[i]
	c.nodes[n.prev].next = n.next
	c.nodes[n.next].prev = n.prev
}

func (c *BlockCache) pushFront(i int32) {
	first := c.nodes[0].next
	c.nodes[i].prev = 0
	c.nodes[i].next = first
	c.nodes[first].prev = i
	c.nodes[0].next = i
}
