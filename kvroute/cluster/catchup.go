package cluster

import (
	"sync"
	"time"
)

// replyQuiet is how long after the last catch-up reply message the first catch-up counts as
// over. A peer publishes its whole reply at once and every peer answers the same request, so
// the messages of all replies arrive close together; one that comes later is still applied,
// only after the first decisions.
const replyQuiet = 25 * time.Millisecond

// catchUp tracks this node's first catch-up: the one a replica that starts next to running
// peers needs before its first decisions (CaughtUp).
type catchUp struct {
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	timer *time.Timer
}

func (c *catchUp) init() { c.done = make(chan struct{}) }

func (c *catchUp) over() { c.once.Do(func() { close(c.done) }) }

// CaughtUp returns a channel that is closed once the node's first catch-up is over: peers
// answered its first catch-up request, their replies were applied and no more came for
// replyQuiet; or its first connection attempt failed (no NATS server answered, so there is no
// peer to wait for). With NATS up and no peer at all it stays open: callers bound their wait.
func (n *Node) CaughtUp() <-chan struct{} { return n.caught.done }

// replied notes that a catch-up reply message was accepted and applied: the catch-up is over
// once replies stop coming for replyQuiet.
func (n *Node) replied() {
	c := &n.caught
	select {
	case <-c.done:
		return
	default:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer == nil {
		c.timer = time.AfterFunc(replyQuiet, c.over)
		return
	}
	c.timer.Reset(replyQuiet)
}
