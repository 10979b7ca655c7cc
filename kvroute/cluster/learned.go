package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
	"unicode/utf8"
)

// Learned figures: the replica that owns an engine (Owns) reads its totals and learns from them
// (its prefill and decode speed, its restarts); the others adopt its readings, which carry no
// totals, so they learn nothing themselves. The owner shares what it learned, as it shares
// readings.

// recLearned is a learned-figures record. Like a reading it goes out in a message of its own,
// so that a replica of an older version, which rejects an unknown record and the rest of its
// message, loses only this record (counted as malformed), never a decision or a reading.
const recLearned = 11

// Bounds on a learned record's speeds (tokens per second): kvroute's own.
const (
	minLearnedSpeed = 1.0
	maxLearnedSpeed = 1e7
)

// EngineLearned is what the replica that reads an engine learned from its totals.
type EngineLearned struct {
	// Upstream is the engine's dial address, as replicas key upstreams.
	Upstream string
	// At is when the figures were learned (the reading's time). On receipt it is in the
	// receiver's clock, as a reading's.
	At time.Time
	// PrefillTokensPerSecond and DecodeTokensPerSecond are the learned speeds; 0: not learned.
	PrefillTokensPerSecond, DecodeTokensPerSecond float64
	// RestartedAt is when the owner saw the engine's latest restart (zero: none seen). On
	// receipt it is in the receiver's clock.
	RestartedAt time.Time
}

// errBadLearned marks a learned record whose values are out of bounds.
var errBadLearned = errors.New("bad learned figures")

// check reports what is wrong with l's values, or nil.
func (l *EngineLearned) check() error {
	speed := func(v float64) bool { return v == 0 || (v >= minLearnedSpeed && v <= maxLearnedSpeed) }
	switch {
	case l.Upstream == "" || len(l.Upstream) > maxField || !utf8.ValidString(l.Upstream):
		return fmt.Errorf("upstream: %w", errBadLearned)
	case l.At.IsZero():
		return fmt.Errorf("no time: %w", errBadLearned)
	case !speed(l.PrefillTokensPerSecond) || !speed(l.DecodeTokensPerSecond):
		return fmt.Errorf("speeds %v and %v: %w", l.PrefillTokensPerSecond, l.DecodeTokensPerSecond, errBadLearned)
	case !l.RestartedAt.IsZero() && l.RestartedAt.After(l.At.Add(time.Second)):
		return fmt.Errorf("restart after the figures: %w", errBadLearned)
	}
	return nil
}

// appendLearned encodes l: upstream, unix nanos of At and RestartedAt (0: none), then the
// speeds as float64 bits.
func appendLearned(b []byte, l EngineLearned) []byte {
	b = append(b, recLearned)
	b = appendString(b, l.Upstream)
	b = binary.BigEndian.AppendUint64(b, uint64(unixNanos(l.At)))
	b = binary.BigEndian.AppendUint64(b, uint64(unixNanos(l.RestartedAt)))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(l.PrefillTokensPerSecond))
	return binary.BigEndian.AppendUint64(b, math.Float64bits(l.DecodeTokensPerSecond))
}

func unixNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// decodeLearned reads the body of a learned record (after its type byte). Out-of-bounds values
// are not a malformed message: the record is dropped and counted alone (applyLearned).
func decodeLearned(r *reader, rec *record) {
	l := &rec.learned
	l.Upstream = r.str()
	at, restarted := int64(r.u64()), int64(r.u64())
	l.PrefillTokensPerSecond = math.Float64frombits(r.u64())
	l.DecodeTokensPerSecond = math.Float64frombits(r.u64())
	if r.err != nil {
		return
	}
	if at > 0 {
		l.At = time.Unix(0, at)
	}
	if restarted > 0 {
		l.RestartedAt = time.Unix(0, restarted)
	}
}

// LearnedHandler is implemented by a Handler that takes the figures peers learned from the
// engines they read. It is called like the Handler's methods: one at a time, never after Close
// returned. A Handler without it ignores them.
type LearnedHandler interface {
	Learned(l EngineLearned)
}

// applyLearned hands a peer's learned figures to the Handler, their times moved to this node's
// clock. sent is the message's time in the sender's clock.
func (n *Node) applyLearned(l EngineLearned, sent, now time.Time) {
	err := l.check()
	age := sent.Sub(l.At)
	if err == nil && (age < -time.Second || age > n.cfg.ReplayWindow) {
		err = fmt.Errorf("figures %v older than their message: %w", age, errBadLearned)
	}
	if err != nil {
		n.st.learnedRejected.Add(1)
		n.debug("learned", "cluster: learned figures rejected", "error", err)
		return
	}
	n.st.learnedReceived.Add(1)
	h, ok := n.h.(LearnedHandler)
	if !ok {
		return
	}
	l.At = now.Add(-max(age, 0))
	if !l.RestartedAt.IsZero() {
		l.RestartedAt = now.Add(-max(sent.Sub(l.RestartedAt), 0))
	}
	h.Learned(l)
}

// PublishLearned queues learned figures for the peers; it never blocks. Figures whose values
// are out of bounds are dropped and counted in LearnedRejected.
func (n *Node) PublishLearned(l EngineLearned) {
	if err := l.check(); err != nil {
		n.st.learnedRejected.Add(1)
		return
	}
	n.enqueue(item{kind: recLearned, a: string(appendLearned(nil, l))}, 0)
}
