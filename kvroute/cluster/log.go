package cluster

import "sync"

// maxLogEntries bounds the entries of the catch-up log whatever their size, dead ones included.
const maxLogEntries = 1 << 20

// logEntry is one record this node published, kept to replay to a peer that catches up.
type logEntry struct {
	seq        uint64 // of the message that carried it, so a peer asks only for what it missed
	origin     uint64 // of the message that carried it exactly (seq may be a later one's)
	rec        []byte // nil once dead (replaced binding, forgotten session)
	model      string // bindings only
	sessionKey string // bindings only
}

// ownLog is a bounded log of this node's own decisions and bindings, oldest dropped first. Each
// node keeps only its own: a joiner asks all peers, and together they hold the fleet's recent
// history without any node holding it twice.
type ownLog struct {
	mu       sync.Mutex
	entries  []*logEntry
	head     int
	bytes    int
	max      int
	bindings map[bindingKey]*logEntry // latest binding of each session and model
}

type bindingKey struct{ model, sessionKey string }

func (l *ownLog) init(max int) {
	l.max = max
	l.bindings = make(map[bindingKey]*logEntry)
}

func (l *ownLog) add(es []logEntry) {
	if len(es) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range es {
		e := es[i]
		if e.sessionKey != "" {
			k := bindingKey{e.model, e.sessionKey}
			if old := l.bindings[k]; old != nil {
				l.kill(old)
			}
			l.bindings[k] = &e
		}
		l.entries = append(l.entries, &e)
		l.bytes += len(e.rec)
	}
	for l.head < len(l.entries) && (l.bytes > l.max || len(l.entries)-l.head > maxLogEntries) {
		e := l.entries[l.head]
		l.kill(e)
		l.entries[l.head] = nil
		l.head++
	}
	// Compact when the dropped prefix is half the slice, so the slice stays within twice the
	// live entries.
	if l.head > len(l.entries)/2 {
		l.entries = append(l.entries[:0], l.entries[l.head:]...)
		clear(l.entries[len(l.entries):cap(l.entries)])
		l.head = 0
	}
}

func (l *ownLog) kill(e *logEntry) {
	if e.rec == nil {
		return
	}
	l.bytes -= len(e.rec)
	e.rec = nil
	if e.sessionKey != "" {
		if k := (bindingKey{e.model, e.sessionKey}); l.bindings[k] == e {
			delete(l.bindings, k)
		}
	}
}

// forget drops the bindings of a session, for every model: a joiner must not learn a binding
// an admin removed.
func (l *ownLog) forget(sessionKey string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, e := range l.bindings {
		if k.sessionKey == sessionKey {
			l.kill(e)
		}
	}
}

func (l *ownLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.entries)
	l.entries, l.head, l.bytes = l.entries[:0], 0, 0
	clear(l.bindings)
}

// logged is a record of the log with the message it was first published in.
type logged struct {
	origin uint64
	rec    []byte
}

// since returns the live records published after seq, oldest first. The records are never
// changed once stored, so the caller may read them without the lock.
func (l *ownLog) since(seq uint64) []logged {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logged
	for _, e := range l.entries[l.head:] {
		if e.rec != nil && e.seq > seq {
			out = append(out, logged{e.origin, e.rec})
		}
	}
	return out
}

// size returns the live bytes and entries of the log.
func (l *ownLog) size() (bytes, entries int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bytes, len(l.entries) - l.head
}
