package cluster

import (
	"github.com/klauspost/compress/s2"

	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"strconv"
	"time"
)

// windowBits is how far behind a peer's newest sequence number a message may arrive and still
// be accepted once: the catch-up replies and the live batches of one peer are published by two
// goroutines, so they may interleave. Within it, a record that arrives both live and in a
// catch-up reply is also applied once (see covered): 4096 of a peer's messages are 20 s of
// batches at the default flush_delay, far longer than a reply takes.
const windowBits = 4096

// peer is what this node knows of another replica. Guarded by Node.rmu.
type peer struct {
	id     uint64
	aead   cipher.AEAD
	maxSeq uint64
	window [windowBits / 64]uint64 // bit seq%windowBits: seq seen, for seqs within the window
	// covered, same bits: the decisions and bindings first published in message seq were
	// applied from a catch-up reply (its origin record named seq), so the live message, if it
	// comes, applies only its other records.
	covered [windowBits / 64]uint64
	// applied, same bits: live message seq was taken whole (not dropped by the flood limit,
	// no record of it lost: a fragment missing, a text that did not decode, a binding
	// refused). Only those let a catch-up reply skip its records as heard already; a message
	// merely seen does not.
	applied   [windowBits / 64]uint64
	firstSeen time.Time
	lastHeard time.Time
	lag       time.Duration // receive time minus send time of the last message: delay plus skew
	messages  uint64
	bytes     uint64
	records   uint64
	loads     map[string]int64
	loadsAt   time.Time
	prefill   map[string]int64 // queued prefill tokens (prefill.go)
	prefillAt time.Time
	served    map[string]int64 // tokens served per tenant (tokens.go)
	servedAt  time.Time
	// synced: this node holds the peer's history up to maxSeq, so a catch-up request asks only
	// for what follows. True once the peer answered a catch-up request of this node, or sent
	// its first one (it had just started, so all it publishes later arrives live) without
	// having lost anything before its first connection (then this node asks it). A live
	// message, or a peer's request after a reconnect, says nothing of what it published
	// before this node heard it.
	synced bool
	// resume, with resumeSet: the peer's maxSeq when this node lost its connection. Until
	// the peer answers a catch-up request, the request asks from there: what the peer sent
	// while this node was away is missing, even once newer live messages arrived after the
	// reconnect (they arrive before the request goes out).
	resume    uint64
	resumeSet bool
	tokens    float64
	tokensAt  time.Time
	frag      struct {
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
			p.covered = [windowBits / 64]uint64{}
			p.applied = [windowBits / 64]uint64{}
		} else {
			for s := p.maxSeq + 1; s <= seq; s++ {
				p.window[(s%windowBits)/64] &^= 1 << (s % 64)
				p.covered[(s%windowBits)/64] &^= 1 << (s % 64)
				p.applied[(s%windowBits)/64] &^= 1 << (s % 64)
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

// seen reports whether accept would refuse seq, without remembering it.
func (p *peer) seen(seq uint64) bool {
	switch {
	case seq == 0:
		return true
	case seq > p.maxSeq:
		return false
	case p.maxSeq-seq >= windowBits:
		return true
	}
	return p.window[(seq%windowBits)/64]&(1<<(seq%64)) != 0
}

// isCovered reports whether the decisions and bindings of the message seq, just accepted, were
// applied already from a catch-up reply.
func (p *peer) isCovered(seq uint64) bool {
	return p.maxSeq-seq < windowBits && p.covered[(seq%windowBits)/64]&(1<<(seq%64)) != 0
}

// markApplied records that live message seq, just accepted, was taken whole.
func (p *peer) markApplied(seq uint64) {
	if p.maxSeq-seq < windowBits {
		p.applied[(seq%windowBits)/64] |= 1 << (seq % 64)
	}
}

// takeOrigin reports whether the records a catch-up reply says were first published in the
// peer's message seq are new here, and remembers that they were applied. Within the window the
// answer is exact: they are skipped only when message seq was applied whole, live or from an
// earlier reply. Beyond the window (a reply more than windowBits messages late, or a gap that
// long after a reconnect) they are applied: a decision applied twice is inserted twice (the
// same tree), a binding twice is refused the second time (BindingNewer), while a record
// skipped wrongly is lost.
func (p *peer) takeOrigin(seq uint64) bool {
	if seq > p.maxSeq || p.maxSeq-seq >= windowBits {
		// An origin is older than the reply that names it; a peer that says otherwise gets
		// its records applied, as before origins existed.
		return true
	}
	w, bit := (seq%windowBits)/64, uint64(1)<<(seq%64)
	if (p.applied[w]|p.covered[w])&bit != 0 {
		return false
	}
	p.covered[w] |= bit
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
		return typ != recSyncReq && typ != recOrigin // origins belong to catch-up replies
	case kindSyncReq:
		return typ == recSyncReq
	case kindSyncData:
		return typ == recDecision || typ == recBinding || typ == recFragment || typ == recOrigin
	}
	return false
}

// Bounds on the work a message may cost before it authenticates.
const (
	// maxSyncMessage caps a sync request, whose seen list a sender cuts at maxSeen peers: a
	// larger one is turned away unopened.
	maxSyncMessage = overhead + 16 + 16*maxSeen
	// legacyRate bounds the bytes per second of version 1 and 2 messages opened, all senders
	// together: they have no header tag, so each costs its whole size before it can fail. A
	// rolling upgrade's old replicas fit in it (a decision is a few KB compressed); a forger
	// who uses the old format gets at most this much decrypted, and the rest is dropped.
	legacyRate = 8 << 20
)

// The reasons a message is turned away before it authenticates: values, so that turning one
// away allocates nothing.
var (
	errSyncTooLarge = errors.New("sync request larger than any peer sends")
	errStale        = errors.New("message time outside replay_window (or clocks apart)")
	errBeforeJoin   = errors.New("message sealed before this node joined the fleet: a replay, or the sender's clock is behind")
	errHeaderAuth   = errors.New("header fails to authenticate: wrong secret or name, or forged")
	errSeen         = errors.New("sequence number seen before")
	errOpen         = errors.New("message fails to open: wrong secret or name, or forged")
)

// joinSkew is how far before this node's first subscription a live message may say it was
// sealed and still be read: a message published before the subscription reached the server is
// never delivered to it, so an older one that arrives is a replay, unless the sender's clock is
// behind this one's. NTP keeps clocks within milliseconds; a second leaves room for a sender's
// message sealed before a round trip of the subscription, and bounds what a recording of the
// fleet can replay into a joiner to what was sealed in the second before it joined.
const joinSkew = time.Second

// receive handles one message from NATS; kind is what its subject says it must be.
//
// What a message may cost before it authenticates is bounded, so that a flood from someone
// without the secret, claiming live peers' ids with a current time, cannot starve them: the
// checks on the clear header come first (size for its kind, time, join time), then the header
// tag (one GCM tag over 35 bytes with the sender's key, kept in the peer table for known
// peers), then the sequence number (a replay is turned away before its payload is decrypted);
// only then is the payload opened, into a buffer the node keeps.
func (n *Node) receive(kind byte, msg []byte) {
	n.st.received.Add(1)
	n.st.receivedBytes.Add(uint64(len(msg)))
	h, err := parseHeader(msg)
	if err != nil || h.kind != kind {
		n.reject(&n.st.rejectedMalformed, "malformed", err)
		return
	}
	if kind == kindSyncReq && len(msg) > maxSyncMessage {
		n.reject(&n.st.rejectedMalformed, "malformed", errSyncTooLarge)
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
		n.reject(&n.st.rejectedStale, "stale", errStale)
		return
	}
	// A catch-up reply is addressed to this node's id, new with this run, so none can predate
	// it; any other message sealed before this node joined was never meant for it.
	if joined := n.joined.Load(); kind != kindSyncData && joined != 0 && h.nanos < joined-int64(min(joinSkew, n.cfg.ReplayWindow)) {
		n.reject(&n.st.rejectedReplay, "replay", errBeforeJoin)
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
	} else {
		if n.scratch.mac == nil {
			n.scratch.mac = hmac.New(sha256.New, n.keys.seal)
		}
		aead, err = aeadWith(n.scratch.mac, &n.scratch.key, h.sender)
	}
	if err != nil {
		n.reject(&n.st.rejectedAuth, "auth", err)
		return
	}
	if h.version >= headerTagVersion {
		if !headerOK(&n.scratch, aead, h, msg) {
			n.reject(&n.st.rejectedAuth, "auth", errHeaderAuth)
			return
		}
	} else if !n.legacy.take(now, len(msg)) {
		n.st.droppedFlood.Add(1)
		n.debug("legacy", "cluster: version 1 or 2 messages over their budget; message dropped", "bytes_per_second", legacyRate)
		return
	}
	if p != nil && p.seen(h.seq) {
		// A captured header in front of another payload, or a plain replay: turned away
		// before the payload is decrypted.
		n.reject(&n.st.rejectedReplay, "replay", errSeen)
		return
	}
	if need := len(msg) - payloadOffset(h.version) - tagLen; cap(n.plain) < need {
		n.plain = make([]byte, 0, need)
	}
	plain, err := open(n.plain[:0], aead, h, msg)
	if cap(n.plain) > 2<<20 {
		// A server with a huge max_payload made it large: do not keep that.
		n.plain = nil
	}
	if err != nil {
		n.reject(&n.st.rejectedAuth, "auth", errOpen)
		return
	}
	if p == nil {
		if p = n.addPeer(h.sender, aead, now); p == nil {
			n.st.droppedPeers.Add(1)
			n.debug("peers", "cluster: too many peers; message dropped", "max_peers", n.cfg.MaxPeers)
			return
		}
	}
	if !p.accept(h.seq) {
		n.reject(&n.st.rejectedReplay, "replay", errSeen)
		return
	}
	if !p.allow(now, n.cfg.PeerRate) {
		n.st.droppedFlood.Add(1)
		n.debug("flood", "cluster: peer over peer_rate; message dropped", "peer", hexID(p.id))
		return
	}
	if kind == kindSyncData {
		p.synced, p.resumeSet = true, false
		defer n.replied() // once its records are applied
	}
	p.lastHeard, p.lag = now, now.Sub(sent)
	p.messages++
	p.bytes += uint64(len(msg))
	// A live message whose decisions and bindings a catch-up reply brought already applies
	// only the rest (forget, reset, load); a reply's records are skipped from an origin on
	// that names a message heard live.
	sp := span{skip: kind == kindData && p.isCovered(h.seq)}
	err = decodeRecords(plain, h.version, n.cfg.MaxText, func(r *record) { n.apply(p, kind, h, r, now, &sp, true) })
	n.bury(&sp, h, now)
	if err != nil {
		// Authenticated but malformed: a peer with the secret and a bug, or another version.
		n.reject(&n.st.rejectedMalformed, "malformed", err)
		return
	}
	if kind == kindData && !sp.failed {
		p.markApplied(h.seq)
	}
}

// bucket is a token bucket of bytes.
type bucket struct {
	tokens float64
	at     time.Time
}

// take reports whether size bytes fit the budget of legacyRate per second (a burst of twice
// as many), and takes them.
func (b *bucket) take(now time.Time, size int) bool {
	if b.at.IsZero() {
		b.tokens = 2 * legacyRate
	} else {
		b.tokens = min(b.tokens+now.Sub(b.at).Seconds()*legacyRate, 2*legacyRate)
	}
	b.at = now
	if b.tokens < float64(size) {
		return false
	}
	b.tokens -= float64(size)
	return true
}

func (n *Node) reject(counter interface{ Add(uint64) uint64 }, reason string, err error) {
	counter.Add(1)
	if n.logDue(reason) {
		n.log.Debug("cluster: message rejected", "reason", reason, "error", err)
	}
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
		n.dropPeer(oldest)
	}
	p := &peer{id: id, aead: aead, firstSeen: now, lastHeard: now, tokens: float64(2 * n.cfg.PeerRate), tokensAt: now}
	if seq, ok := n.gone[id]; ok {
		// Its history up to seq is held here still: what the catch-up lacks is what follows.
		p.synced, p.resume, p.resumeSet = true, seq, true
		delete(n.gone, id)
	}
	n.peers[id] = p
	return p
}

// span is the state of one record list while it is applied: whether its decisions and
// bindings were applied already (a message heard both live and in a catch-up reply).
type span struct {
	skip   bool
	failed bool // a record of the message was lost (a fragment missing, a bad text, a refused binding)
	// forgets and reset: what the message forgot, buried once it is applied whole (bury).
	forgets []string
	reset   bool
}

// apply hands one authenticated record to the Handler. top is false inside a reassembled
// fragment, which may not hold fragments itself.
func (n *Node) apply(p *peer, kind byte, h header, r *record, now time.Time, sp *span, top bool) {
	if !allowed(kind, r.typ) || (!top && r.typ == recFragment) {
		n.reject(&n.st.rejectedMalformed, "malformed", errors.New("record not allowed in this message kind"))
		return
	}
	if r.typ == recOrigin {
		sp.skip = !p.takeOrigin(r.origin)
		return
	}
	p.records++
	if kind == kindSyncData {
		n.st.syncReceivedRecords.Add(1)
	}
	if sp.skip && (r.typ == recDecision || r.typ == recBinding) {
		n.st.duplicates.Add(1)
		return
	}
	switch r.typ {
	case recDecision:
		text, ok := n.decodeText(r)
		if !ok {
			sp.failed = true
			return
		}
		n.st.decisionsReceived.Add(1)
		n.h.Decision(r.model, r.upstream, text)
	case recBinding:
		var at time.Time
		switch {
		case r.at != 0:
			at = time.Unix(0, r.at)
		case kind == kindData:
			// A version 1 peer's live binding went out within flush_delay of being made.
			at = sentAt(h)
		}
		// The binding's time is bounded by this node's clock: a peer cannot make its binding
		// win for longer than the replay window by dating it ahead.
		if r.at != 0 && r.at-now.UnixNano() > int64(n.cfg.ReplayWindow) {
			sp.failed = true
			n.reject(&n.st.rejectedStale, "stale", errors.New("binding dated ahead of this node's clock by more than replay_window"))
			return
		}
		// A binding made before an admin forgot its session, or reset the fleet, may still
		// come: in a catch-up reply a third peer built before it heard the forget, or from a
		// peer whose message was slower. It must not bring back what the admin removed.
		made := int64(0)
		if !at.IsZero() {
			made = at.UnixNano()
		}
		if n.tombs.buries(r.sessionKey, made, now) {
			n.st.bindingsRefused.Add(1)
			return
		}
		if n.h.Binding(r.model, r.sessionKey, r.upstream, at) {
			n.st.bindingsReceived.Add(1)
		} else {
			n.st.bindingsRefused.Add(1)
		}
	case recForget:
		sp.forgets = append(sp.forgets, r.sessionKey)
		n.own.forget(r.sessionKey)
		n.h.Forget(r.sessionKey)
	case recReset:
		sp.reset = true
		n.own.reset()
		n.h.Reset()
	case recLoad:
		loads := make(map[string]int64, len(r.loads))
		for _, l := range r.loads {
			loads[l.upstream] = l.n
		}
		p.loads, p.loadsAt = loads, now
		n.rebuildLoads(now)
	case recPrefill:
		tokens := make(map[string]int64, len(r.loads))
		for _, l := range r.loads {
			tokens[l.upstream] = l.n
		}
		p.prefill, p.prefillAt = tokens, now
		n.rebuildLoads(now)
	case recTokens:
		tokens := make(map[string]int64, len(r.loads))
		for _, l := range r.loads {
			tokens[l.upstream] = l.n
		}
		p.served, p.servedAt = tokens, now
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
		n.reassemble(p, kind, h, &r.frag, now, sp)
	case recReading:
		n.applyReading(r.reading, time.Unix(0, h.nanos), now)
	case recLearned:
		n.applyLearned(r.learned, time.Unix(0, h.nanos), now)
	}
}

// bury remembers what a message forgot or reset, once its records were applied: a binding that
// follows the forget in the same message was made after it (the sender's flusher drops those
// made before). The forget was made at most flush_delay before its message was sealed, and a
// binding made by another replica in between is not older than it, so the tombstone is dated
// then.
func (n *Node) bury(sp *span, h header, now time.Time) {
	at := h.nanos - int64(n.cfg.FlushDelay)
	for _, k := range sp.forgets {
		n.tombs.forget(k, at, now)
	}
	if sp.reset {
		n.tombs.reset(at)
	}
}

func sentAt(h header) time.Time { return time.Unix(0, h.nanos) }

// reassemble collects a peer's fragments, which arrive in order on one connection, and applies
// the record they make once complete. Memory is bounded by the largest record a peer may send.
// The record applies as part of the message that completes it, so it starts from that
// message's span.
func (n *Node) reassemble(p *peer, kind byte, h header, f *fragment, now time.Time, sp *span) {
	a := &p.frag
	drop := func() {
		n.fragBytes -= len(a.buf)
		a.buf, a.next = nil, 0
		sp.failed = true
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
	n.fragBytes -= len(a.buf)
	a.buf, a.next = nil, 0
	inner := span{skip: sp.skip}
	if err := decodeRecords(buf, h.version, n.cfg.MaxText, func(r *record) { n.apply(p, kind, h, r, now, &inner, false) }); err != nil {
		n.reject(&n.st.rejectedMalformed, "malformed", err)
		inner.failed = true
	}
	sp.failed = sp.failed || inner.failed
	sp.forgets = append(sp.forgets, inner.forgets...)
	sp.reset = sp.reset || inner.reset
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

// rebuildLoads publishes the sum of live peers' counts for PeerLoad, and of their queued
// prefill for PeerPrefill. Called under rmu.
func (n *Node) rebuildLoads(now time.Time) {
	sum := make(map[string]int64)
	prefill := make(map[string]int64)
	var tokens map[string]int64
	for _, p := range n.peers {
		if p.served != nil && now.Sub(p.servedAt) <= n.cfg.LoadTTL {
			if tokens == nil {
				tokens = make(map[string]int64)
			}
			for t, c := range p.served {
				tokens[t] += c
			}
		}
		if p.loads != nil && now.Sub(p.loadsAt) <= n.cfg.LoadTTL {
			for u, c := range p.loads {
				sum[u] += c
			}
		}
		if p.prefill != nil && now.Sub(p.prefillAt) <= n.cfg.LoadTTL {
			for u, c := range p.prefill {
				prefill[u] += c
			}
		}
	}
	n.peerLoad.Store(&sum)
	n.peerPrefill.Store(&prefill)
	n.peerTokens.Store(&tokens)
}

// lostConnection remembers, for every peer, what this node had heard when its connection
// went, so that the catch-up request after the reconnect asks for what followed.
func (n *Node) lostConnection() {
	n.rmu.Lock()
	defer n.rmu.Unlock()
	for _, p := range n.peers {
		if !p.resumeSet {
			p.resume, p.resumeSet = p.maxSeq, true
		}
	}
}

// expire drops silent peers' loads and, once their messages could no longer pass the replay
// window, the peers themselves.
func (n *Node) expire(now time.Time) {
	n.rmu.Lock()
	defer n.rmu.Unlock()
	forget := 2*n.cfg.ReplayWindow + n.cfg.LoadTTL
	for _, p := range n.peers {
		if now.Sub(p.lastHeard) > forget {
			n.dropPeer(p)
		}
	}
	n.rebuildLoads(now)
}

// dropPeer forgets a peer, keeping only how far this node holds its history, so that if it
// comes back (a replica frozen or cut off for minutes) the catch-up asks it for what followed,
// not for its whole log again. Called under rmu.
func (n *Node) dropPeer(p *peer) {
	n.fragBytes -= len(p.frag.buf)
	delete(n.peers, p.id)
	if !p.synced {
		return
	}
	if len(n.gone) >= n.cfg.MaxPeers {
		// Bounded like the table: past it, a returning peer is asked for all its log.
		clear(n.gone)
	}
	if p.resumeSet {
		n.gone[p.id] = p.resume
	} else {
		n.gone[p.id] = p.maxSeq
	}
}

// maxRecord is the largest encoded record: a decision of maxText bytes that did not compress,
// with its names.
func maxRecord(maxText int) int { return maxText + maxText/8 + 64<<10 }

func hexID(id uint64) string { return strconv.FormatUint(id, 16) }
