package kvroute

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

const (
	defaultMaxSessions = 100000
	defaultSessionTTL  = 30 * time.Minute
	sessionShards      = 32
)

// sessionStore binds session ids to upstream dial addresses. Bindings expire after the TTL
// without use, and the store holds at most max bindings: past that, the least recently used
// binding of the shard goes. A client inventing ids cannot grow it beyond the cap.
type sessionStore struct {
	seed   maphash.Seed
	shards [sessionShards]sessionShard
	max    atomic.Int64 // bindings in all
	ttl    atomic.Int64 // nanoseconds
	live   atomic.Int64
}

type sessionShard struct {
	mu   sync.Mutex
	m    map[string]*binding
	head binding // sentinel of a circular LRU list: head.next is the most recent
}

type binding struct {
	key, upstream string
	expires       int64 // unix nanoseconds
	prev, next    *binding
}

func newSessionStore(max int, ttl time.Duration) *sessionStore {
	s := &sessionStore{seed: maphash.MakeSeed()}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.m = make(map[string]*binding)
		sh.head.next, sh.head.prev = &sh.head, &sh.head
	}
	s.configure(max, ttl)
	return s
}

// configure sets the cap and the TTL; a smaller cap takes effect on the next bind of each shard.
func (s *sessionStore) configure(max int, ttl time.Duration) {
	if max <= 0 {
		max = defaultMaxSessions
	}
	if ttl <= 0 {
		ttl = defaultSessionTTL
	}
	s.max.Store(int64(max))
	s.ttl.Store(int64(ttl))
}

func (s *sessionStore) shard(key string) *sessionShard {
	return &s.shards[maphash.String(s.seed, key)%sessionShards]
}

func (s *sessionStore) perShard() int {
	n := int(s.max.Load()) / sessionShards
	if n < 1 {
		n = 1
	}
	return n
}

// get returns the upstream key is bound to, refreshing the binding's recency and expiry.
func (s *sessionStore) get(key string, now time.Time) (string, bool) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b, ok := sh.m[key]
	if !ok {
		return "", false
	}
	if b.expires <= now.UnixNano() {
		sh.remove(b)
		s.live.Add(-1)
		return "", false
	}
	b.expires = now.UnixNano() + s.ttl.Load()
	sh.moveFront(b)
	return b.upstream, true
}

// bind binds key to upstream.
func (s *sessionStore) bind(key, upstream string, now time.Time) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	exp := now.UnixNano() + s.ttl.Load()
	if b, ok := sh.m[key]; ok {
		b.upstream, b.expires = upstream, exp
		sh.moveFront(b)
		return
	}
	for len(sh.m) >= s.perShard() {
		sh.remove(sh.head.prev)
		s.live.Add(-1)
	}
	b := &binding{key: key, upstream: upstream, expires: exp}
	sh.m[key] = b
	sh.pushFront(b)
	s.live.Add(1)
}

// forget removes key's binding and reports whether there was one.
func (s *sessionStore) forget(key string) bool {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b, ok := sh.m[key]
	if ok {
		sh.remove(b)
		s.live.Add(-1)
	}
	return ok
}

// dropUpstream removes every binding to upstream and returns how many went.
func (s *sessionStore) dropUpstream(upstream string) int {
	return s.removeIf(func(b *binding) bool { return b.upstream == upstream })
}

// expire removes the bindings expired at now.
func (s *sessionStore) expire(now time.Time) int {
	t := now.UnixNano()
	return s.removeIf(func(b *binding) bool { return b.expires <= t })
}

func (s *sessionStore) reset() {
	s.removeIf(func(*binding) bool { return true })
}

func (s *sessionStore) removeIf(drop func(*binding) bool) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for b := sh.head.next; b != &sh.head; {
			next := b.next
			if drop(b) {
				sh.remove(b)
				n++
			}
			b = next
		}
		sh.mu.Unlock()
	}
	s.live.Add(int64(-n))
	return n
}

// len returns the number of live bindings (expired ones count until they are collected).
func (s *sessionStore) len() int { return int(s.live.Load()) }

// perUpstream counts the bindings of each upstream.
func (s *sessionStore) perUpstream() map[string]int {
	out := make(map[string]int)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, b := range sh.m {
			out[b.upstream]++
		}
		sh.mu.Unlock()
	}
	return out
}

func (sh *sessionShard) pushFront(b *binding) {
	b.prev, b.next = &sh.head, sh.head.next
	sh.head.next.prev = b
	sh.head.next = b
}

func (sh *sessionShard) moveFront(b *binding) {
	b.prev.next, b.next.prev = b.next, b.prev
	sh.pushFront(b)
}

func (sh *sessionShard) remove(b *binding) {
	b.prev.next, b.next.prev = b.next, b.prev
	b.prev, b.next = nil, nil
	delete(sh.m, b.key)
}
