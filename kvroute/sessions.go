package kvroute

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
)

const sessionShards = 32

// sessionStore binds session ids to upstream dial addresses, one binding per (model, session
// id): the same id used for two models keeps a binding for each. Bindings expire after the TTL
// without use, and the store holds at most max bindings in all: past that, the least recently
// used binding of the shard being written goes (of another shard when that one is empty). A
// client inventing ids cannot grow it beyond the cap.
type sessionStore struct {
	seed   maphash.Seed
	shards [sessionShards]sessionShard
	max    atomic.Int64 // bindings in all
	ttl    atomic.Int64 // nanoseconds
	live   atomic.Int64
	next   atomic.Uint32 // where evictElsewhere starts, so that no shard is always first
}

type sessionShard struct {
	mu   sync.Mutex
	m    map[sessionKey]*binding
	head binding // sentinel of a circular LRU list: head.next is the most recent
}

// sessionKey names one binding.
type sessionKey struct{ model, sid string }

type binding struct {
	key      sessionKey
	upstream string
	expires  int64 // unix nanoseconds
	// made is when the binding was made (unix nanoseconds), here or on the peer that made it:
	// of a session's bindings heard in any order, the cluster keeps the latest
	// (cluster.BindingNewer).
	made       int64
	prev, next *binding
}

func newSessionStore(max int, ttl time.Duration) *sessionStore {
	s := &sessionStore{seed: maphash.MakeSeed()}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.m = make(map[sessionKey]*binding)
		sh.head.next, sh.head.prev = &sh.head, &sh.head
	}
	s.configure(max, ttl)
	return s
}

// configure sets the cap and the TTL (both already checked and defaulted); a smaller cap
// trims the store at once, least recently used first in each shard.
func (s *sessionStore) configure(max int, ttl time.Duration) {
	s.max.Store(int64(max))
	s.ttl.Store(int64(ttl))
	for s.live.Load() > int64(max) {
		if !s.evictElsewhere(nil) {
			return
		}
	}
}

// shard hashes the session id alone, so that forgetting an id for every model can stop at
// one shard.
func (s *sessionStore) shard(sid string) *sessionShard {
	return &s.shards[maphash.String(s.seed, sid)%sessionShards]
}

// get returns the upstream sid is bound to for model, refreshing the binding's recency and
// expiry.
func (s *sessionStore) get(model, sid string, now time.Time) (string, bool) {
	sh := s.shard(sid)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b, ok := sh.m[sessionKey{model, sid}]
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

// bind binds sid to upstream for model, made now, and returns the time it keeps as the
// binding's: now, or just after the binding it replaces when that one is dated later (a peer's
// clock ahead of this one), so that peers take this binding as the newer.
func (s *sessionStore) bind(model, sid, upstream string, now time.Time) time.Time {
	sh := s.shard(sid)
	sh.mu.Lock()
	key := sessionKey{model, sid}
	made := now.UnixNano()
	if b, ok := sh.m[key]; ok {
		made = max(made, b.made+1)
	}
	s.put(sh, key, upstream, made, now)
	return time.Unix(0, made)
}

// bindPeer applies a peer's binding of sid to upstream for model, made at: only when it is
// newer than the binding held (cluster.BindingNewer), so that bindings heard out of order
// (live and in catch-up replies from several peers) end on the latest one. It reports whether
// it applied it.
func (s *sessionStore) bindPeer(model, sid, upstream string, at, now time.Time) bool {
	sh := s.shard(sid)
	sh.mu.Lock()
	key := sessionKey{model, sid}
	if b, ok := sh.m[key]; ok && b.expires > now.UnixNano() &&
		!cluster.BindingNewer(at, upstream, timeOf(b.made), b.upstream) {
		sh.mu.Unlock()
		return false
	}
	made := int64(0)
	if !at.IsZero() {
		made = at.UnixNano()
	}
	s.put(sh, key, upstream, made, now)
	return true
}

func timeOf(nanos int64) time.Time {
	if nanos == 0 {
		return time.Time{}
	}
	return time.Unix(0, nanos)
}

// put stores the binding; sh is locked, and put unlocks it.
func (s *sessionStore) put(sh *sessionShard, key sessionKey, upstream string, made int64, now time.Time) {
	exp := now.UnixNano() + s.ttl.Load()
	if b, ok := sh.m[key]; ok {
		b.upstream, b.expires, b.made = upstream, exp, made
		sh.moveFront(b)
		sh.mu.Unlock()
		return
	}
	b := &binding{key: key, upstream: upstream, expires: exp, made: made}
	sh.m[key] = b
	sh.pushFront(b)
	over := s.live.Add(1) > s.max.Load()
	if over && len(sh.m) > 1 {
		sh.remove(sh.head.prev)
		s.live.Add(-1)
		over = false
	}
	sh.mu.Unlock()
	if over {
		s.evictElsewhere(sh)
	}
}

// evictElsewhere removes the least recently used binding of another shard that has one (the
// shard just written to held only the new binding), starting from a different shard each time;
// it reports whether it removed one.
func (s *sessionStore) evictElsewhere(skip *sessionShard) bool {
	start := s.next.Add(1)
	for i := range uint32(sessionShards) {
		sh := &s.shards[(start+i)%sessionShards]
		if sh == skip {
			continue
		}
		sh.mu.Lock()
		if len(sh.m) > 0 {
			sh.remove(sh.head.prev)
			sh.mu.Unlock()
			s.live.Add(-1)
			return true
		}
		sh.mu.Unlock()
	}
	return false
}

// forgetBinding removes sid's binding for model.
func (s *sessionStore) forgetBinding(model, sid string) {
	sh := s.shard(sid)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if b, ok := sh.m[sessionKey{model, sid}]; ok {
		sh.remove(b)
		s.live.Add(-1)
	}
}

// forget removes sid's bindings for every model and returns how many there were.
func (s *sessionStore) forget(sid string) int {
	sh := s.shard(sid)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n := 0
	for b := sh.head.next; b != &sh.head; {
		next := b.next
		if b.key.sid == sid {
			sh.remove(b)
			n++
		}
		b = next
	}
	s.live.Add(int64(-n))
	return n
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
