package cluster

import (
	"github.com/klauspost/compress/s2"

	"maps"
	"slices"
	"time"
)

// defaultPayload is NATS's default max_payload, assumed until the server said otherwise.
const defaultPayload = 1 << 20

// packer gathers records into messages that fit the server's max_payload, seals and publishes
// them. A record larger than a message is split into fragments, one message each. A packer
// belongs to one goroutine.
type packer struct {
	n       *Node
	kind    byte
	subject string
	to      uint64 // recipient of a catch-up reply
	limit   int
	cur     []byte
	curSeq  uint64
	lastSeq uint64 // seq of the message that holds (or will hold) the last record added
	origin  uint64 // origin record in force in cur (addFrom)
	out     []byte
	sent    int // messages published
}

func (n *Node) newPacker(kind byte, subject string) *packer {
	limit := defaultPayload
	if nc := n.nc.Load(); nc != nil {
		if mp := nc.MaxPayload(); mp > 0 {
			limit = int(min(mp, maxMessage))
		}
	}
	// Room for the record type and lengths of a fragment, which must fit a message too.
	limit -= overhead + 32
	return &packer{n: n, kind: kind, subject: subject, limit: max(limit, 256)}
}

func (p *packer) add(rec []byte) {
	if len(p.cur)+len(rec) > p.limit {
		p.flush()
	}
	if len(rec) > p.limit {
		p.fragment(rec)
		return
	}
	if len(p.cur) == 0 {
		p.curSeq = p.n.seq.Add(1)
		p.lastSeq = p.curSeq
	}
	p.cur = append(p.cur, rec...)
}

// addFrom adds a catch-up record first published in the message origin, behind an origin
// record: every message of a reply that holds records starts with one, and a record too large
// for a message is fragmented with its origin record in front, so the receiver always knows
// where a record came from.
func (p *packer) addFrom(origin uint64, rec []byte) {
	o := appendOrigin(nil, origin)
	if len(o)+len(rec) > p.limit {
		p.flush()
		p.fragment(append(o, rec...))
		return
	}
	if len(p.cur)+len(o)+len(rec) > p.limit {
		p.flush()
	}
	if len(p.cur) == 0 || p.origin != origin {
		p.add(o)
		p.origin = origin
	}
	p.add(rec)
}

// fragment publishes rec in pieces; the receiver reassembles them in order.
func (p *packer) fragment(rec []byte) {
	chunk := p.limit - 16
	total := uint64((len(rec) + chunk - 1) / chunk)
	f := fragment{total: total}
	for i := uint64(0); i < total; i++ {
		seq := p.n.seq.Add(1)
		if i == 0 {
			f.id = seq
		}
		f.index = i
		f.chunk = rec[int(i)*chunk : min(len(rec), int(i+1)*chunk)]
		p.send(seq, appendFragment(p.cur[:0], f))
		p.lastSeq = seq
	}
	p.cur = p.cur[:0]
	p.n.st.fragmented.Add(1)
}

func (p *packer) flush() {
	if len(p.cur) == 0 {
		return
	}
	p.send(p.curSeq, p.cur)
	p.cur = p.cur[:0]
	p.origin = 0
}

func (p *packer) send(seq uint64, plain []byte) {
	if out := p.n.out; out != nil {
		p.out = seal(p.out[:0], p.n.aead, header{kind: p.kind, sender: p.n.id, seq: seq, nanos: time.Now().UnixNano(), to: p.to}, plain)
		out(p.subject, p.out)
		p.sent++
		return
	}
	nc := p.n.nc.Load()
	if nc == nil {
		// Not even a first connection attempt yet: what the peers miss, they get from the
		// catch-up log when this node connects (its first request tells them to ask).
		p.n.st.droppedPublish.Add(1)
		p.n.lostEarly.Store(true)
		return
	}
	p.out = seal(p.out[:0], p.n.aead, header{kind: p.kind, sender: p.n.id, seq: seq, nanos: time.Now().UnixNano(), to: p.to}, plain)
	// Publish copies the message into nats.go's buffer (or its reconnect buffer while
	// disconnected); it fails only when that buffer is full or the connection is closed.
	if err := nc.Publish(p.subject, p.out); err != nil {
		p.n.st.droppedPublish.Add(1)
		p.n.debug("publish", "cluster: publish failed", "error", err)
		return
	}
	p.sent++
	p.n.st.sent.Add(1)
	p.n.st.sentBytes.Add(uint64(len(p.out)))
}

// flusher is the one goroutine that turns queued items into messages: a batch goes out
// FlushDelay after its first item at the latest, the load every LoadInterval and soon after
// LoadChanged.
func (n *Node) flusher() {
	defer n.wg.Done()
	tick := time.NewTicker(n.cfg.LoadInterval)
	defer tick.Stop()
	batch := time.NewTimer(time.Hour)
	batch.Stop()
	var (
		p        *packer
		pending  []logEntry // records of the current batch for the catch-up log
		zbuf     []byte
		tbuf     []byte
		lastLoad map[string]int64
		lastPref map[string]int64
		lastTok  map[string]int64
		loadAt   time.Time
		loadDue  bool
		syncDue  bool
	)
	start := func() {
		if p == nil {
			p = n.newPacker(kindData, n.prefix+"data")
			batch.Reset(n.cfg.FlushDelay)
		}
	}
	prefillSrc, _ := n.h.(PrefillSource)
	tokensSrc, _ := n.h.(TokensSource)
	addLoad := func(force bool) {
		if tokensSrc != nil {
			var rec []byte
			if rec, lastTok = tokensRecord(tokensSrc.TokensServed(), lastTok, force); rec != nil {
				// A message of its own (tokens.go), not logged for catch-up: it is resent
				// every LoadInterval and ages out with the peer.
				rp := n.newPacker(kindData, n.prefix+"data")
				rp.add(rec)
				rp.flush()
			}
		}
		if prefillSrc != nil {
			var rec []byte
			if rec, lastPref = prefillRecord(prefillSrc.PrefillTokens(), lastPref, force); rec != nil {
				// A message of its own (prefill.go), not logged for catch-up: it ages in seconds.
				rp := n.newPacker(kindData, n.prefix+"data")
				rp.add(rec)
				rp.flush()
			}
		}
		var cur map[string]int64
		if n.loads != nil {
			cur = n.loads()
		}
		if !force && maps.Equal(cur, lastLoad) {
			return
		}
		lastLoad = maps.Clone(cur)
		loadAt = time.Now()
		loads := make([]peerCount, 0, len(cur))
		for u, c := range cur {
			if c > 0 && len(loads) < maxUpstreams && len(u) <= maxField {
				loads = append(loads, peerCount{u, min(c, maxLoad)})
			}
		}
		start()
		p.add(appendLoad(nil, loads))
	}
	flush := func() {
		if p == nil {
			return
		}
		if loadDue {
			addLoad(false)
			loadDue = false
		}
		p.flush()
		for i := range pending {
			pending[i].seq = p.lastSeq
		}
		n.own.add(pending)
		pending = pending[:0]
		p = nil
		batch.Stop()
	}
	handle := func(it item) {
		if it.kind == recReading || it.kind == recLearned {
			// A message of its own (reading.go, learned.go), not logged for catch-up: it
			// ages in seconds.
			rp := n.newPacker(kindData, n.prefix+"data")
			rp.add([]byte(it.a))
			rp.flush()
			if it.kind == recReading {
				n.st.readingsSent.Add(1)
			} else {
				n.st.learnedSent.Add(1)
			}
			return
		}
		start()
		var rec []byte
		switch it.kind {
		case recDecision:
			n.queuedBytes.Add(-int64(min(len(it.c), n.cfg.MaxText)))
			rec, zbuf, tbuf = n.encodeDecision(it.a, it.b, it.c, zbuf, tbuf)
			pending = append(pending, logEntry{rec: rec})
		case recBinding:
			rec = appendBinding(nil, it.a, it.b, it.c, it.at)
			pending = append(pending, logEntry{rec: rec, model: it.a, sessionKey: it.b})
		case recForget:
			rec = appendForget(nil, it.b)
			n.own.forget(it.b)
			// Bindings of this batch are not in the log yet.
			pending = slices.DeleteFunc(pending, func(e logEntry) bool { return e.sessionKey == it.b })
		case recReset:
			rec = appendReset(nil)
			pending = pending[:0]
			n.own.reset()
		}
		p.add(rec)
		// A fragmented record went out at once; the entries before it are in messages
		// already sent or in the current one, so p.lastSeq covers them all.
		for i := range pending {
			if pending[i].seq == 0 {
				pending[i].seq = p.lastSeq
				// The message that carries it (the last fragment's, for a fragmented
				// record), which a catch-up reply names so that a peer applies it once.
				pending[i].origin = p.lastSeq
			}
		}
	}
	// drain takes what is queued now, without waiting.
	drain := func() {
		for range len(n.queue) {
			handle(<-n.queue)
		}
	}
	for {
		// While a batch is open the flusher does not wait on the queue: a Publish* then
		// only writes into the channel's buffer, where waking a parked receiver would cost
		// the request path about ten times as much.
		queue := n.queue
		if p != nil {
			queue = nil
		}
		select {
		case <-n.done:
			return
		case it := <-queue:
			handle(it)
		case <-batch.C:
			drain()
			flush()
		case <-n.loadKick:
			// Counts move on every request start and end: publish them with the next batch,
			// or within FlushDelay, never more often.
			loadDue = true
			start()
		case <-tick.C:
			if time.Since(loadAt) >= n.cfg.LoadInterval/2 {
				addLoad(true)
			}
			drain()
			flush()
			n.expire(time.Now())
			if syncDue {
				// The connection came up before connect() stored it.
				syncDue = !n.sendSyncRequest()
			}
		case <-n.syncKick:
			syncDue = !n.sendSyncRequest()
		}
	}
}

// encodeDecision returns a decision record, its text compressed on its own when that helps.
// zbuf and tbuf are scratch buffers, returned for reuse.
func (n *Node) encodeDecision(model, upstream, text string, zbuf, tbuf []byte) (rec, zb, tb []byte) {
	text = truncateText(text, n.cfg.MaxText)
	tbuf = append(tbuf[:0], text...)
	if need := s2.MaxEncodedLen(len(tbuf)); cap(zbuf) < need {
		zbuf = make([]byte, need)
	}
	zbuf = s2.Encode(zbuf[:cap(zbuf)], tbuf)
	n.st.textBytes.Add(uint64(len(text)))
	if len(zbuf) < len(text) {
		n.st.wireTextBytes.Add(uint64(len(zbuf)))
		rec = appendDecision(nil, model, upstream, textS2, len(text), zbuf)
	} else {
		n.st.wireTextBytes.Add(uint64(len(text)))
		rec = appendDecision(nil, model, upstream, textRaw, len(text), tbuf)
	}
	// A Mooncake prompt is ~60k chars; keep scratch space for those, not for a rare 4 MiB one.
	if cap(tbuf) > 1<<20 {
		tbuf, zbuf = nil, nil
	}
	return rec, zbuf, tbuf
}

// sendSyncRequest asks every peer to replay what it published after the last message this
// node has from it.
func (n *Node) sendSyncRequest() bool {
	if nc := n.nc.Load(); nc == nil || !nc.IsConnected() {
		return false
	}
	p := n.newPacker(kindSyncReq, n.prefix+"sync")
	p.add(appendSyncRequest(nil, !n.asked, !n.asked && n.lostEarly.Load(), n.seen()))
	n.asked = true
	p.flush()
	n.st.syncRequests.Add(1)
	return true
}

// syncServer replays this node's catch-up log to peers that ask, one at a time, so that a
// crowd of joiners costs one goroutine and bounded memory.
func (n *Node) syncServer() {
	defer n.wg.Done()
	for {
		select {
		case <-n.done:
			return
		case job := <-n.syncJobs:
			if !n.serveSync(job) {
				return
			}
		}
	}
}

// servedSync is the last reply sent to a requester: the sequence it covered and when.
type servedSync struct {
	seq uint64
	at  time.Time
}

// serveSync answers one catch-up request; it returns false when the node is closing.
func (n *Node) serveSync(job syncJob) bool {
	// A requester that asks twice before its first reply could arrive (connect and reconnect
	// callbacks close together) gets only what it was not sent yet. Later, it gets all it asks
	// for: its connection may have dropped with the reply, and what it hears twice it applies
	// once.
	since := job.since
	now := time.Now()
	if last, ok := n.served[job.to]; ok && now.Sub(last.at) < time.Second {
		since = max(since, last.seq)
	}
	if len(n.served) >= n.cfg.MaxPeers {
		clear(n.served)
	}
	n.served[job.to] = servedSync{seq: n.seq.Load(), at: now}
	recs := n.own.since(since)
	p := n.newPacker(kindSyncData, n.prefix+"to."+hexID(job.to))
	p.to = job.to
	if len(recs) == 0 {
		// An empty reply still tells the requester it is in sync with this node.
		p.send(n.seq.Add(1), nil)
		return true
	}
	for _, r := range recs {
		select {
		case <-n.done:
			return false
		default:
		}
		p.addFrom(r.origin, r.rec)
	}
	p.flush()
	n.st.syncServed.Add(1)
	n.st.syncServedRecords.Add(uint64(len(recs)))
	return true
}

// maxSeen bounds a sync request's list of peers, so that its size is bounded for the receiver
// before it authenticates (maxSyncMessage).
const maxSeen = 4096

// seen lists the peers whose history this node holds, with the last sequence number it has.
func (n *Node) seen() []seenSeq {
	n.rmu.Lock()
	defer n.rmu.Unlock()
	seen := make([]seenSeq, 0, min(len(n.peers), maxSeen))
	for id, p := range n.peers {
		if len(seen) == maxSeen {
			// A peer left out is asked for all its log: more to send, nothing lost.
			break
		}
		switch {
		case p.synced && p.resumeSet:
			seen = append(seen, seenSeq{id, p.resume})
		case p.synced:
			seen = append(seen, seenSeq{id, p.maxSeq})
		}
	}
	for id, seq := range n.gone {
		if len(seen) == maxSeen {
			break
		}
		seen = append(seen, seenSeq{id, seq})
	}
	return seen
}
