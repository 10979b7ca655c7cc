package llmsim

import (
	"container/list"
	"context"
	"sync"
)

// slots is a counting semaphore with a FIFO queue: the batch slots of a worker. A request that
// finds every slot busy waits behind the requests that came before it.
type slots struct {
	mu      sync.Mutex
	free    int
	running int
	queue   list.List // of chan struct{}, closed when the waiter is handed a slot
}

func newSlots(n int) *slots { return &slots{free: n} }

// acquire takes a slot, waiting in line for one. It returns ctx's error when ctx ends first.
func (s *slots) acquire(ctx context.Context) error {
	s.mu.Lock()
	if s.free > 0 && s.queue.Len() == 0 {
		s.free--
		s.running++
		s.mu.Unlock()
		return nil
	}
	ready := make(chan struct{})
	e := s.queue.PushBack(ready)
	s.mu.Unlock()

	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		select {
		case <-ready: // handed a slot while giving up: pass it on
			s.mu.Unlock()
			s.release()
		default:
			s.queue.Remove(e)
			s.mu.Unlock()
		}
		return ctx.Err()
	}
}

// release gives the slot to the first waiter, or frees it.
func (s *slots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.queue.Front(); e != nil {
		s.queue.Remove(e)
		close(e.Value.(chan struct{}))
		return
	}
	s.free++
	s.running--
}

// counts returns the requests running and waiting.
func (s *slots) counts() (running, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running, s.queue.Len()
}
