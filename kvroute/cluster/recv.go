package cluster

import (
	"github.com/klauspost/compress/s2"

	"crypto/cipher"
	"errors"
	"strconv"
	"time"
)

// windowBits is how far behind a peer's newest sequence number a message may arrive and still
// be accepted once: the catch-up replies and the live batches of one peer are published by two
// goroutines, so they may interleave.
const windowBits = 1024

// peer is what this node knows of another replica. Guarded by Node.rmu.
type peer struct {
	id        uint64
	aead      cipher.AEAD
	maxSeq    uint64
	window    [windowBits / 64]uint64 // bit seq%windowBits: seq seen, for seqs within the window
	firstSeen time.Time
	lastHeard time.Time
	lag       time.Duration // receive time minus send time of the last message: delay plus skew
	messages  uint64
	bytes     uint64
	records   uint64
	loads     map[string]int64
	loadsAt   time.Time
	// synced: this node holds the peer's history up to maxSeq, so a catch-up request asks only
	// for what follows. True once the peer answered a catch-up request of this node, or sent
	// its first one (it had just started, so all it publishes later arrives live) without
	// having lost anything before its first connection (then this node asks it). A live
	// message, or a peer's request after a reconnect, says nothing of what it published
	// before this node heard it.
	synced   bool
	tokens   float64
	tokensAt time.Time
	frag     struct {
		id, next, total uint64
		buf             []byte
	}
}

// accept reports whether seq is new, and remembers it.
func (p *peer) accept(seq uint64) bool {
	if seq == 0 {
		return false
	}
	if seq > p.maxSeq {
		if seq-p.maxSeq >= windowBits {
			p.window = [windowBits / 64]uint64{}
		} else {
			for s := p.maxSeq + 1; s < seq; s++ {
				p.window[(s%windowBits)/64] &^= 1 << (s % 64)
			}
		}
		p.maxSeq = seq
		p.window[(seq%windowBits)/64] |= 1 << (seq % 64)
		return true
	}
	if p.maxSeq-seq >= windowBits {
		return false
	}
	w, bit := &p.window[(seq%windowBits)/64], uint64(1)<<(seq%64)
	if *w&bit != 0 {
		return false
	}
	*w |= bit
	return true
}

// allow takes one message from the peer's token bucket.
func (p *peer) allow(now time.Time, rate int) bool {
	p.tokens += now.Sub(p.tokensAt).Seconds() * float64(rate)
	p.tokensAt = now
	if burst := float64(2 * rate); p.tokens > burst {
		p.tokens = burst
	}
	if p.tokens < 1 {
		return false
	}
	p.tokens--
	return true
}

// allowed says which records each kind of message may carry: a catch-up reply must not reset a
// fleet, a sync request carries nothing else.
func allowed(kind, typ byte) bool {
	switch kind {
	case kindData:
		return typ != recSyncReq
	case kindSyncReq:
		return typ == recSyncReq
	case kindSyncData:
		return typ == recDecision || typ == recBinding || typ == recFragment
	}
	return false
}

// receive handles one message from NATS; kind is what its subject says it must be.
func (n *Node) receive(kind byte, msg []byte) {
	n.st.received.Add(1)
	n.st.receivedBytes.Add(uint64(len(msg)))
	h, err := parseHeader(msg)
	if err != nil || h.kind != kind {
		n.reject(&n.st.rejectedMalformed, "malformed", err)
		return
	}
	if kind == kindSyncData {
		h.to = n.id
	}
	if h.sender == n.id {
		n.st.ownIgnored.Add(1)
		return
	}
	now := time.Now()
	sent := time.Unix(0, h.nanos)
	if d := now.Sub(sent); d > n.cfg.ReplayWindow || d < -n.cfg.ReplayWindow {
		n.reject(&n.st.rejectedStale, "stale", errors.New("message time outside replay_window (or clocks apart)"))
		return
	}

	n.rmu.Lock()
	defer n.rmu.Unlock()
	if n.closed {
		return
	}
	p := n.peers[h.sender]
	aead := n.aead
	if p != nil {
		aead = p.aead
	} else if aead, err = n.keys.aeadFor(h.sender); err != nil {
		n.reject(&n.st.rejectedAuth, "auth", err)
		return
	}
	plain, err := open(n.plain[:0], aead, h, msg)
	if err != nil {
		n.reject(&n.st.rejectedAuth, "auth", errors.New("message fails to open: wrong secret or name, or forged"))
		return
	}
	if cap(plain) <= 2<<20 {
		// Keep the buffer for the next message, unless a server with a huge max_payload
		// made it large.
		n.plain = plain[:0]
	}
	if p == nil {
		if p = n.addPeer(h.sender, aead, now); p == nil {
			n.st.droppedPeers.Add(1)
			n.debug("peers", "cluster: too many peers; message dropped", "max_peers", n.cfg.MaxPeers)
			return
		}
	}
	if !p.accept(h.seq) {
		n.reject(&n.st.rejectedReplay, "replay", errors.New("sequence number seen before"))
		return
	}
	if !p.allow(now, n.cfg.PeerRate) {
		n.st.droppedFlood.Add(1)
		n.debug("flood", "cluster: peer over peer_rate; message dropped", "peer", hexID(p.id))
		return
	}
	if kind == kindSyncData {
		p.synced = true
	}
	p.lastHeard, p.lag = now, now.Sub(sent)
	p.messages++
	p.bytes += uint64(len(msg))
	if err := decodeRecords(plain, n.cfg.MaxText, func(r *record) { n.apply(p, kind, h, r, now, true) }); err != nil {
		// Authenticated but malformed: a peer with the secret and a bug, or another version.
		n.reject(&n.st.rejectedMalformed, "malformed", err)
	}
}

func (n *Node) reject(counter interface{ Add(uint64) uint64 }, reason string, err error) {
	counter.Add(1)
	n.debug(reason, "cluster: message rejected", "reason", reason, "error", err)
}

// addPeer tracks a new peer, making room by forgetting the longest silent one when that one
// has stopped counting in load already.
func (n *Node) addPeer(id uint64, aead cipher.AEAD, now time.Time) *peer {
	if len(n.peers) >= n.cfg.MaxPeers {
		var oldest *peer
		for _, q := range n.peers {
			if oldest == nil || q.lastHeard.Before(oldest.lastHeard) {
				oldest = q
			}
		}
		if now.Sub(oldest.lastHeard) <= n.cfg.LoadTTL {
			return nil
		}
		n.fragBytes -= len(oldest.frag.buf)
		delete(n.peers, oldest.id)
	}
	p := &peer{id: id, aead: aead, firstSeen: now, lastHeard: now, tokens: float64(2 * n.cfg.PeerRate), tokensAt: now}
	n.peers[id] = p
	return p
}

// apply hands one authenticated record to the Handler. top is false inside a reassembled
// fragment, which may not hold fragments itself.
func (n *Node) apply(p *peer, kind byte, h header, r *record, now time.Time, top bool) {
	if !allowed(kind, r.typ) || (!top && r.typ == recFragment) {
		n.reject(&n.st.rejectedMalformed, "malformed", errors.New("record not allowed in this message kind"))
		return
	}
	p.records++
	if kind == kindSyncData {
		n.st.syncReceivedRecords.Add(1)
	}
	switch r.typ {
	case recDecision:
		text, ok := n.decodeText(r)
		if !ok {
			return
		}
		n.st.decisionsReceived.Add(1)
		n.h.Decision(r.model, r.upstream, text)
	case recBinding:
		n.st.bindingsReceived.Add(1)
		n.h.Binding(r.model, r.sessionKey, r.upstream)
	case recForget:
		n.own.forget(r.sessionKey)
		n.h.Forget(r.sessionKey)
	case recReset:
		n.own.reset()
		n.h.Reset()
	case recLoad:
		loads := make(map[string]int64, len(r.loads))
		for _, l := range r.loads {
			loads[l.upstream] = l.n
		}
		p.loads, p.loadsAt = loads, now
		n.rebuildLoads(now)
	case recSyncReq:
		switch {
		case r.lost:
			// It decided before its first connection was up and could not publish that: its
			// log has it, and its answer to this node's request will mark it synced.
			select {
			case n.syncKick <- struct{}{}:
			default:
			}
		case r.first:
			p.synced = true
		}
		since := uint64(0)
		for _, s := range r.seen {
			if s.peer == n.id {
				since = s.seq
			}
		}
		select {
		case n.syncJobs <- syncJob{to: h.sender, since: since}:
		default:
			n.st.droppedSync.Add(1)
		}
	case recFragment:
		n.reassemble(p, kind, h, &r.frag, now)
	case recReading:
		n.applyReading(r.reading, time.Unix(0, h.nanos), now)
	}
}

// reassemble collects a peer's fragments, which arrive in order on one connection, and applies
// the record they make once complete. Memory is bounded by the largest record a peer may send.
func (n *Node) reassemble(p *peer, kind byte, h header, f *fragment, now time.Time) {
	a := &p.frag
	drop := func() {
		n.fragBytes -= len(a.buf)
		a.buf, a.next = nil, 0
	}
	if f.index == 0 {
		if a.buf != nil {
			n.st.fragmentsLost.Add(1)
			drop()
		}
		a.id, a.next, a.total = f.id, 0, f.total
	}
	if f.id != a.id || f.index != a.next || f.total != a.total {
		n.st.fragmentsLost.Add(1)
		drop()
		return
	}
	if len(a.buf)+len(f.chunk) > maxRecord(n.cfg.MaxText) {
		n.reject(&n.st.rejectedMalformed, "malformed", errors.New("fragmented record too large"))
		drop()
		return
	}
	// All peers together may hold two of the largest records half-assembled; a third is
	// dropped rather than let many peers multiply the bound.
	if n.fragBytes+len(f.chunk) > 2*maxRecord(n.cfg.MaxText) {
		n.st.fragmentsLost.Add(1)
		drop()
		return
	}
	a.buf = append(a.buf, f.chunk...)
	n.fragBytes += len(f.chunk)
	a.next++
	if a.next < a.total {
		return
	}
	buf := a.buf
	drop()
	if err := decodeRecords(buf, n.cfg.MaxText, func(r *record) { n.apply(p, kind, h, r, now, false) }); err != nil {
		n.reject(&n.st.rejectedMalformed, "malformed", err)
	}
}

// decodeText returns a decision's text, decompressed within the bound its record declares.
func (n *Node) decodeText(r *record) (string, bool) {
	if r.textEnc == textRaw {
		return string(r.text), true
	}
	// The declared length is checked before a byte is decoded: a peer cannot make this
	// allocate more than the record says (and the record's length is bounded by MaxText).
	var out []byte
	size, err := s2.DecodedLen(r.text)
	if err == nil && size == r.textLen {
		buf := n.textBuf
		if cap(buf) < size {
			buf = make([]byte, size)
		}
		out, err = s2.Decode(buf[:size], r.text)
	}
	if err != nil || len(out) != r.textLen {
		n.reject(&n.st.rejectedMalformed, "malformed", errors.New("decision text does not decompress to its declared length"))
		return "", false
	}
	if cap(out) <= 1<<20 {
		n.textBuf = out[:0]
	}
	return string(out), true
}

// rebuildLoads publishes the sum of live peers' counts for PeerLoad. Called under rmu.
func (n *Node) rebuildLoads(now time.Time) {
	sum := make(map[string]int64)
	for _, p := range n.peers {
		if p.loads != nil && now.Sub(p.loadsAt) <= n.cfg.LoadTTL {
			for u, c := range p.loads {
				sum[u] += c
			}
		}
	}
	n.peerLoad.Store(&sum)
}

// expire drops silent peers' loads and, once their messages could no longer pass the replay
// window, the peers themselves.
func (n *Node) expire(now time.Time) {
	n.rmu.Lock()
	defer n.rmu.Unlock()
	forget := 2*n.cfg.ReplayWindow + n.cfg.LoadTTL
	for id, p := range n.peers {
		if now.Sub(p.lastHeard) > forget {
			n.fragBytes -= len(p.frag.buf)
			delete(n.peers, id)
		}
	}
	n.rebuildLoads(now)
}

// maxRecord is the largest encoded record: a decision of maxText bytes that did not compress,
// with its names.
func maxRecord(maxText int) int { return maxText + maxText/8 + 64<<10 }

func hexID(id uint64) string { return strconv.FormatUint(id, 16) }
