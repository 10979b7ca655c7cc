package cluster

import (
	"sync"
	"time"
)

// maxTombstones bounds the forgotten sessions remembered at once; past it the oldest go.
const maxTombstones = 1 << 14

// tombstones remember, for a while, which sessions an admin forgot and when the fleet was last
// reset, so that a binding made before them and brought late (by a catch-up reply a third peer
// built before it heard the forget, or by a slower peer) is not applied. A binding made before
// a forget is sealed in a message before its sender heard the forget, and such a message is
// refused once older than replay_window; keep is twice that.
type tombstones struct {
	mu      sync.Mutex
	keep    time.Duration
	at      map[string]int64 // session key → when it was forgotten (unix nanos)
	order   []tomb           // in the order added, oldest at head
	head    int
	resetAt int64
}

type tomb struct {
	key   string
	at    int64
	added time.Time
}

func (t *tombstones) init(keep time.Duration) {
	t.keep = keep
	t.at = make(map[string]int64)
}

// forget records that key was forgotten at time at (unix nanos, the forgetting replica's clock).
func (t *tombstones) forget(key string, at int64, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(now)
	if len(t.order)-t.head >= maxTombstones {
		t.drop()
	}
	t.at[key] = max(t.at[key], at)
	t.order = append(t.order, tomb{key, at, now})
}

// reset records a reset of the fleet at time at.
func (t *tombstones) reset(at int64) {
	t.mu.Lock()
	t.resetAt = max(t.resetAt, at)
	t.mu.Unlock()
}

// buries reports whether a binding of key made at time at (unix nanos; 0: unknown) was made
// before its session was forgotten or the fleet reset, as far as this node remembers.
func (t *tombstones) buries(key string, at int64, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(now)
	if t.resetAt != 0 && now.UnixNano()-t.resetAt > int64(t.keep) {
		t.resetAt = 0
	}
	f, forgotten := t.at[key]
	if at == 0 {
		// A binding of unknown time (a version 1 peer's catch-up) may be as old as any.
		return forgotten || t.resetAt != 0
	}
	return (forgotten && at <= f) || at <= t.resetAt
}

// expire drops the tombstones older than keep. Called under mu.
func (t *tombstones) expire(now time.Time) {
	for t.head < len(t.order) && now.Sub(t.order[t.head].added) > t.keep {
		t.drop()
	}
}

// drop removes the oldest tombstone. Called under mu.
func (t *tombstones) drop() {
	o := t.order[t.head]
	if t.at[o.key] == o.at {
		delete(t.at, o.key)
	}
	t.order[t.head] = tomb{}
	t.head++
	if t.head > len(t.order)/2 {
		t.order = append(t.order[:0], t.order[t.head:]...)
		t.head = 0
	}
}
