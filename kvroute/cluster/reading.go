package cluster

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Engine readings: with telemetry on, N replicas would each read every engine's metrics once
// per interval. Instead one replica, the engine's owner, reads it and publishes the figures;
// the others apply them and skip their own read while the reading is fresh. The package knows
// nothing of telemetry: a reading is the few figures the router uses.

// recReading is an engine reading record. It goes out in a message of its own, so that a
// replica of an older version, which rejects an unknown record and the rest of its message,
// loses only the reading (counted as malformed), never a decision.
const recReading = 9

// Bounds on a reading's fields.
const (
	maxEngineName = 32
	// MaxReadingCapacity bounds a reading's KV capacity in tokens.
	MaxReadingCapacity = 1 << 40
)

// ReadingFields says which figures of an EngineReading the engine reported.
type ReadingFields uint8

// The figures of an EngineReading.
const (
	ReadingRunning ReadingFields = 1 << iota
	ReadingWaiting
	ReadingKVCapacity
	readingFailed = 1 << 7 // on the wire: the read failed
	readingKnown  = ReadingRunning | ReadingWaiting | ReadingKVCapacity
)

// EngineReading is what one replica read of an engine's own figures.
type EngineReading struct {
	// Upstream is the engine's dial address, as replicas key upstreams.
	Upstream string
	// Engine names the engine ("vllm", "sglang", ...), for the admin API; at most 32 bytes.
	Engine string
	// At is when the engine answered. On receipt it is in the receiver's clock: the reading's
	// age at the sender, plus nothing for the transit (milliseconds), so clock skew between
	// replicas does not age readings.
	At time.Time
	// Running and Waiting are the engine's requests; KVCapacityTokens the size of its KV
	// cache. A figure means something only when Known has its bit.
	Running, Waiting, KVCapacityTokens int64
	Known                              ReadingFields
	// Failed: the owner's read failed (the figures are empty): the receivers read the engine
	// themselves rather than wait for the reading to age.
	Failed bool
}

// ReadingHandler is implemented by a Handler that takes peers' engine readings. It is called
// like the Handler's methods: one at a time, never after Close returned. A Handler without it
// ignores readings.
type ReadingHandler interface {
	Reading(r EngineReading)
}

// errBadReading marks a reading whose values are out of bounds.
var errBadReading = errors.New("bad engine reading")

// check reports what is wrong with r's values, or nil.
func (r *EngineReading) check() error {
	switch {
	case r.Upstream == "" || len(r.Upstream) > maxField || !utf8.ValidString(r.Upstream):
		return fmt.Errorf("upstream: %w", errBadReading)
	case len(r.Engine) > maxEngineName || !utf8.ValidString(r.Engine):
		return fmt.Errorf("engine name: %w", errBadReading)
	case r.Known&^readingKnown != 0:
		return fmt.Errorf("fields %#x: %w", r.Known, errBadReading)
	case r.At.IsZero():
		return fmt.Errorf("no time: %w", errBadReading)
	case r.Failed:
		return nil
	case r.Known.has(ReadingRunning) && (r.Running < 0 || r.Running > maxLoad),
		r.Known.has(ReadingWaiting) && (r.Waiting < 0 || r.Waiting > maxLoad):
		return fmt.Errorf("running %d waiting %d: %w", r.Running, r.Waiting, errBadReading)
	case r.Known.has(ReadingKVCapacity) && (r.KVCapacityTokens <= 0 || r.KVCapacityTokens > MaxReadingCapacity):
		return fmt.Errorf("kv capacity %d: %w", r.KVCapacityTokens, errBadReading)
	}
	return nil
}

func (f ReadingFields) has(b ReadingFields) bool { return f&b == b }

// appendReading encodes r: upstream, engine, flags, unix nanos, then the known figures.
func appendReading(b []byte, r EngineReading) []byte {
	flags := byte(r.Known) &^ readingFailed // unchecked: PublishReading checks
	if r.Failed {
		flags |= readingFailed
	}
	b = append(b, recReading)
	b = appendString(b, r.Upstream)
	b = appendString(b, r.Engine)
	b = append(b, flags)
	nanos := int64(0) // no time: rejected on receipt
	if !r.At.IsZero() {
		nanos = r.At.UnixNano()
	}
	b = binary.BigEndian.AppendUint64(b, uint64(nanos))
	b = binary.AppendVarint(b, r.Running)
	b = binary.AppendVarint(b, r.Waiting)
	return binary.AppendVarint(b, r.KVCapacityTokens)
}

// decodeReading reads the body of a reading record (after its type byte). Out-of-bounds values
// are not a malformed message: rec.bad says so and the record is dropped and counted alone.
func decodeReading(r *reader, rec *record) {
	er := &rec.reading
	er.Upstream = r.str()
	er.Engine = string(r.bytes(maxEngineName))
	flags := r.byte()
	nanos := int64(r.u64())
	er.Running, er.Waiting, er.KVCapacityTokens = r.varint(), r.varint(), r.varint()
	if r.err != nil {
		return
	}
	er.Known, er.Failed = ReadingFields(flags)&^readingFailed, flags&readingFailed != 0
	if nanos > 0 {
		er.At = time.Unix(0, nanos)
	}
}

// applyReading hands a peer's reading to the Handler, its time moved to this node's clock.
// sent is the message's time in the sender's clock.
func (n *Node) applyReading(er EngineReading, sent, now time.Time) {
	err := er.check()
	age := sent.Sub(er.At)
	if err == nil && (age < -time.Second || age > n.cfg.ReplayWindow) {
		err = fmt.Errorf("reading %v older than its message: %w", age, errBadReading)
	}
	if err != nil {
		n.st.readingsRejected.Add(1)
		n.debug("reading", "cluster: engine reading rejected", "error", err)
		return
	}
	n.st.readingsReceived.Add(1)
	rh, ok := n.h.(ReadingHandler)
	if !ok {
		return
	}
	er.At = now.Add(-max(age, 0))
	rh.Reading(er)
}

// PublishReading queues an engine reading for the peers; it never blocks. A reading whose
// values are out of bounds is dropped and counted in ReadingsRejected.
func (n *Node) PublishReading(r EngineReading) {
	if err := r.check(); err != nil {
		n.st.readingsRejected.Add(1)
		return
	}
	n.enqueue(item{kind: recReading, a: string(appendReading(nil, r))}, 0)
}

// Owns reports whether this node is the one that reads the engine at key (its dial address):
// the winner of rendezvous hashing of (key, node id) over the live peers (heard within
// load_ttl) and itself. Every node that knows the same peers picks the same owner; when the
// owner goes silent, the others pick another once its load_ttl has passed. Do not call it from
// a Handler method.
func (n *Node) Owns(key string) bool {
	now := time.Now()
	n.rmu.Lock()
	ids := make([]uint64, 0, len(n.peers)+1)
	for id, p := range n.peers {
		if now.Sub(p.lastHeard) <= n.cfg.LoadTTL {
			ids = append(ids, id)
		}
	}
	n.rmu.Unlock()
	return owner(key, append(ids, n.id)) == n.id
}

// owner is the rendezvous-hashing winner for key among ids (0 when ids is empty).
func owner(key string, ids []uint64) uint64 {
	var best, bestScore uint64
	for _, id := range ids {
		if s := ownerScore(key, id); best == 0 || s > bestScore || (s == bestScore && id > best) {
			best, bestScore = id, s
		}
	}
	return best
}

func ownerScore(key string, id uint64) uint64 {
	h := sha256.New()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], id)
	h.Write(b[:])
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0]))
}
