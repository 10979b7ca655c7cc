package cluster

import (
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

// Handler applies what peers publish to the local state, exactly as a local decision would.
// The Node calls its methods from one goroutine at a time, never from a Publish* caller and never
// after Close returned. They may call Publish*, PeerLoad and SessionKey, not Stats or Close
// (those wait for the Handler to return). A slow Handler makes NATS buffer, then drop (counted
// in DroppedSlow), never blocks a request.
type Handler interface {
	// Decision: a peer routed a request of model with this routing text to upstream.
	Decision(model, upstream, text string)
	// Binding: a peer bound the session whose SessionKey is sessionKey to upstream for model,
	// at time at by its clock (zero when unknown: a catch-up reply from a peer that predates
	// binding times). Bindings of one session arrive in any order (live, and in catch-up
	// replies from several peers): the Handler applies one only when BindingNewer says it
	// replaces the one it holds, so that every replica ends on the same binding, and reports
	// whether it applied it.
	Binding(model, sessionKey, upstream string, at time.Time) bool
	// Forget: an admin forgot the session whose SessionKey is sessionKey (all models).
	Forget(sessionKey string)
	// Reset: an admin dropped all trees and bindings.
	Reset()
}

// LoadSource returns this replica's own in-flight requests per upstream (dial address). The Node
// calls it from its background goroutine every Config.LoadInterval and after LoadChanged; the
// returned map is only read.
type LoadSource func() map[string]int64

// Node is one replica's membership in a fleet. Its methods are safe for concurrent use.
type Node struct {
	cfg    Config
	h      Handler
	loads  LoadSource
	log    *slog.Logger
	keys   keys
	id     uint64
	idHex  string
	aead   cipher.AEAD
	seq    atomic.Uint64
	prefix string // kvroute.<name>.

	queue       chan item
	queuedBytes atomic.Int64
	loadKick    chan struct{}
	syncKick    chan struct{}
	syncJobs    chan syncJob
	served      map[uint64]servedSync // requester → last reply sent to it; syncServer only
	asked       bool                  // a catch-up request went out; flusher only
	lostEarly   atomic.Bool           // a message was dropped before the first connection attempt

	nc atomic.Pointer[nats.Conn]
	// out, set by tests before the node runs, takes every sealed message instead of NATS
	// (the message's buffer is reused after it returns).
	out func(subject string, msg []byte)

	rmu   sync.Mutex // receive side: peers, gone, plain, scratch, legacy, closed
	peers map[uint64]*peer
	// gone: peers dropped after a long silence whose history this node held, with the last
	// sequence number it holds (dropPeer).
	gone    map[uint64]uint64
	plain   []byte
	textBuf []byte
	scratch scratch
	legacy  bucket // version 1 and 2 messages opened (legacyRate)
	closed  bool
	// joined is when this node's first subscriptions were in place (unix nanos; 0 before):
	// live messages sealed before it (joinSkew allowed) are replays. joinedFinal: the first
	// connection was up and flushed, so joined no longer moves.
	joined      atomic.Int64
	joinedFinal atomic.Bool
	// fragBytes is what all peers' partial fragmented records hold together.
	fragBytes int
	peerLoad  atomic.Pointer[map[string]int64]
	// peerPrefill: the live peers' queued prefill tokens per upstream (prefill.go).
	peerPrefill atomic.Pointer[map[string]int64]
	// peerTokens: the live peers' tokens served per tenant (tokens.go).
	peerTokens atomic.Pointer[map[string]int64]

	own ownLog
	// tombs: sessions an admin forgot, and the last reset, so that a late binding made before
	// them is not applied (tombs.go).
	tombs tombstones

	caught catchUp // the first catch-up (catchup.go)

	sessPool sync.Pool

	done      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once

	st      counters
	lastLog sync.Map // reason → *atomic.Int64 (unix nanos), to rate-limit debug lines
}

// item is one thing to publish; the fields' meaning depends on kind.
type item struct {
	kind    byte // recDecision, recBinding, recForget, recReset, recReading, recLearned (a: the record)
	a, b, c string
	at      int64 // binding: when it was made, unix nanoseconds
}

type syncJob struct {
	to    uint64
	since uint64
}

// Open validates cfg and starts the node: it connects in the background, and keeps trying
// forever, so it never waits on the network. h receives what peers publish; loads (may be nil)
// gives the local in-flight counts; logger may be nil.
func Open(cfg Config, h Handler, loads LoadSource, logger *slog.Logger) (*Node, error) {
	n, opts, err := newNode(cfg, h, loads, logger)
	if err != nil {
		return nil, err
	}
	n.wg.Add(3)
	go n.connect(opts)
	go n.flusher()
	go n.syncServer()
	return n, nil
}

// newNode builds a node that is not connected and runs nothing yet.
func newNode(cfg Config, h Handler, loads LoadSource, logger *slog.Logger) (*Node, []nats.Option, error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	if h == nil {
		return nil, nil, errors.New("cluster: nil Handler")
	}
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	opts, err := natsOptions(cfg)
	if err != nil {
		return nil, nil, err
	}
	k, err := deriveKeys(cfg.Secret, cfg.Name)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: %w", err)
	}
	var idb [8]byte
	if _, err := io.ReadFull(rand.Reader, idb[:]); err != nil {
		return nil, nil, fmt.Errorf("cluster: node id: %w", err)
	}
	id := binary.BigEndian.Uint64(idb[:]) | 1 // never 0
	aead, err := k.aeadFor(id)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: %w", err)
	}
	n := &Node{
		cfg:      cfg,
		h:        h,
		loads:    loads,
		log:      logger.With("cluster", cfg.Name),
		keys:     k,
		id:       id,
		idHex:    strconv.FormatUint(id, 16),
		aead:     aead,
		prefix:   "kvroute." + cfg.Name + ".",
		queue:    make(chan item, cfg.QueueLen),
		loadKick: make(chan struct{}, 1),
		syncKick: make(chan struct{}, 1),
		syncJobs: make(chan syncJob, 16),
		served:   make(map[uint64]servedSync),
		peers:    make(map[uint64]*peer),
		gone:     make(map[uint64]uint64),
		done:     make(chan struct{}),
	}
	n.own.init(cfg.LogBytes)
	n.tombs.init(2 * cfg.ReplayWindow)
	n.caught.init()
	n.sessPool.New = func() any {
		return &sessionDigest{mac: hmac.New(sha256.New, n.keys.session), sum: make([]byte, 0, sha256.Size)}
	}
	opts = append(opts,
		nats.ConnectHandler(func(*nats.Conn) { n.connected("connected") }),
		nats.ReconnectHandler(func(*nats.Conn) { n.connected("reconnected") }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			n.st.disconnects.Add(1)
			n.lostConnection()
			n.log.Warn("cluster: NATS connection lost; routing on local knowledge until it is back", "error", err)
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				n.st.droppedSlow.Add(1)
			}
			n.debug("nats", "cluster: NATS error", "error", err)
		}),
	)
	return n, opts, nil
}

func natsOptions(cfg Config) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name("kvroute " + cfg.Name),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.Timeout(2 * time.Second),
		nats.PingInterval(5 * time.Second),
		nats.MaxPingsOutstanding(3),
		// The server does not send a replica its own messages; the sender id check stays as a
		// second line.
		nats.NoEcho(),
		nats.NoCallbacksAfterClientClose(),
		// By default nats.go gives up after the same auth error twice; credentials fixed or
		// rotated on the server side must not need a Caddy restart.
		nats.IgnoreAuthErrorAbort(),
	}
	if cfg.Creds != "" {
		// nats.go reads the file on every (re)connect; a missing file would only show up as a
		// connection that never comes, so check it here where the error reaches the operator.
		if _, err := os.Stat(cfg.Creds); err != nil {
			return nil, fmt.Errorf("cluster: creds: %w", err)
		}
		opts = append(opts, nats.UserCredentials(cfg.Creds))
	}
	if cfg.TLSCA != "" {
		if _, err := os.ReadFile(cfg.TLSCA); err != nil {
			return nil, fmt.Errorf("cluster: tls_ca: %w", err)
		}
		opts = append(opts, nats.RootCAs(cfg.TLSCA))
	}
	return opts, nil
}

// connect dials in the background: even with RetryOnFailedConnect, nats.Connect makes its first
// attempt synchronously, which can take the dial timeout on an unreachable host.
func (n *Node) connect(opts []nats.Option) {
	defer n.wg.Done()
	o := nats.GetDefaultOptions()
	o.Servers = n.cfg.URLs
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			n.log.Error("cluster: NATS option", "error", err)
			return
		}
	}
	nc, err := o.Connect()
	if err != nil {
		// With RetryOnFailedConnect only a bad option fails here; the node stays alone.
		n.log.Error("cluster: NATS connect", "error", err)
		n.caught.over()
		return
	}
	// Until the first connection is up and flushed (connected), the time of subscribing is
	// the join time: nothing sealed long before it can have been meant for this node.
	n.joined.CompareAndSwap(0, time.Now().UnixNano())
	subs := []struct {
		subject string
		kind    byte
	}{{n.prefix + "data", kindData}, {n.prefix + "sync", kindSyncReq}, {n.prefix + "to." + n.idHex, kindSyncData}}
	for _, s := range subs {
		kind := s.kind
		sub, err := nc.Subscribe(s.subject, func(m *nats.Msg) { n.receive(kind, m.Data) })
		if err != nil {
			n.log.Error("cluster: subscribe", "subject", s.subject, "error", err)
			nc.Close()
			n.caught.over()
			return
		}
		// Bound what waits in memory for the handler; beyond it NATS drops and counts
		// (ErrSlowConsumer), which is the flood bound of last resort.
		if err := sub.SetPendingLimits(1<<16, 64<<20); err != nil {
			n.log.Error("cluster: pending limits", "error", err)
		}
	}
	select {
	case <-n.done:
		nc.Close()
		return
	default:
	}
	n.nc.Store(nc)
	if nc.IsConnected() {
		n.connected("connected")
	} else {
		// The first attempt failed (nats.go retries in the background): no peer can answer
		// a catch-up request now, so the first decisions have nothing to wait for.
		n.caught.over()
	}
	// Otherwise nats.go calls the ConnectHandler once the server is there.
}

// connected asks peers for what this node missed: on start, it is a late joiner; on reconnect,
// it may have missed what was published while it was away. It runs on nats.go's callback
// goroutine or at the end of connect, never on the flusher.
func (n *Node) connected(what string) {
	nc := n.nc.Load()
	if nc == nil {
		// The first connection came up before connect subscribed; connect asks itself.
		return
	}
	// The replies come on this node's own subject: make sure the server has its
	// subscriptions (a round trip) before asking, or the first replies are lost.
	if err := nc.FlushTimeout(2 * time.Second); err != nil {
		n.debug("flush", "cluster: NATS flush before catch-up", "error", err)
	} else if n.joinedFinal.CompareAndSwap(false, true) {
		// The server has the subscriptions: from now on this node hears what is published,
		// and what was sealed before reaches it only through the catch-up (addressed to it).
		// A reconnect does not move it: a peer's reconnect buffer may deliver messages
		// sealed while this node was away, which are not replays.
		n.joined.Store(time.Now().UnixNano())
	}
	n.log.Info("cluster: NATS "+what, "id", n.idHex)
	select {
	case n.syncKick <- struct{}{}:
	default:
	}
}

// Close stops the node: no goroutine is left and no Handler method is called after it returns.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		close(n.done)
		n.wg.Wait()
		if nc := n.nc.Load(); nc != nil {
			if nc.IsConnected() {
				// An empty load record lets peers stop counting this replica's requests now
				// rather than after load_ttl.
				p := n.newPacker(kindData, n.prefix+"data")
				p.add(appendLoad(nil, nil))
				p.flush()
				_ = nc.FlushTimeout(200 * time.Millisecond)
			}
			nc.Close()
		}
		n.rmu.Lock()
		n.closed = true
		n.rmu.Unlock()
	})
	return nil
}

// ID is this node's random id for this run, as peers see it in their stats.
func (n *Node) ID() string { return n.idHex }

// SessionKey is the keyed digest of a session id under which replicas agree on a binding
// without the id crossing the wire. It is a pure function of the secret, the name and id.
func (n *Node) SessionKey(id string) string {
	d := n.sessPool.Get().(*sessionDigest)
	d.mac.Reset()
	d.in = append(d.in[:0], id...)
	d.mac.Write(d.in)
	d.sum = d.mac.Sum(d.sum[:0])
	var out [32]byte
	hex.Encode(out[:], d.sum[:16])
	if cap(d.in) > 4096 {
		d.in = nil // a megabyte session id must not stay in the pool
	}
	n.sessPool.Put(d)
	return string(out[:])
}

// sessionDigest is SessionKey's scratch space, pooled so that the digest allocates only its
// result on the request path.
type sessionDigest struct {
	mac hash.Hash
	in  []byte
	sum []byte
}

// PublishDecision queues a decision for the peers; it never blocks (a full queue drops and
// counts).
func (n *Node) PublishDecision(model, upstream, text string) {
	n.enqueue(item{kind: recDecision, a: model, b: upstream, c: text}, len(text))
}

// PublishBinding queues a session binding (sessionKey from SessionKey) made at time at (the
// time the local store keeps for it; zero means now).
func (n *Node) PublishBinding(model, sessionKey, upstream string, at time.Time) {
	if at.IsZero() {
		at = time.Now()
	}
	n.enqueue(item{kind: recBinding, a: model, b: sessionKey, c: upstream, at: at.UnixNano()}, 0)
}

// BindingNewer reports whether a binding made at time at to upstream replaces one made at
// heldAt to heldUpstream: the later wins, and of two made at the same nanosecond the greater
// upstream, so that replicas that hear a session's bindings in different orders all keep the
// same one. A binding of unknown time (zero) replaces none.
func BindingNewer(at time.Time, upstream string, heldAt time.Time, heldUpstream string) bool {
	switch {
	case at.IsZero():
		return false
	case heldAt.IsZero():
		return true
	case !at.Equal(heldAt):
		return at.After(heldAt)
	}
	return upstream > heldUpstream
}

// PublishForget queues an admin forget of a session (sessionKey from SessionKey).
func (n *Node) PublishForget(sessionKey string) {
	now := time.Now()
	n.tombs.forget(sessionKey, now.UnixNano(), now)
	n.enqueue(item{kind: recForget, b: sessionKey}, 0)
}

// PublishReset queues an admin reset: peers drop their trees and bindings, and every node drops
// its catch-up log, so that a late joiner does not learn what was reset.
func (n *Node) PublishReset() {
	n.tombs.reset(time.Now().UnixNano())
	n.enqueue(item{kind: recReset}, 0)
}

// LoadChanged tells the node that the local in-flight counts moved; it publishes them within
// FlushDelay. It never blocks.
func (n *Node) LoadChanged() {
	select {
	case n.loadKick <- struct{}{}:
	default:
	}
}

func (n *Node) enqueue(it item, textLen int) {
	size := int64(min(textLen, n.cfg.MaxText))
	if size > 0 && n.queuedBytes.Add(size) > int64(n.cfg.QueueBytes) {
		n.queuedBytes.Add(-size)
		n.st.droppedQueue.Add(1)
		return
	}
	select {
	case n.queue <- it:
	default:
		n.queuedBytes.Add(-size)
		n.st.droppedQueue.Add(1)
	}
}

// PeerLoad is the sum of the in-flight counts on upstream that live peers last published. It is
// one atomic load and one map lookup.
func (n *Node) PeerLoad(upstream string) int64 {
	if m := n.peerLoad.Load(); m != nil {
		return (*m)[upstream]
	}
	return 0
}

// PeerLoads is PeerLoad for every upstream at once; the map is shared and must not be changed.
func (n *Node) PeerLoads() map[string]int64 {
	if m := n.peerLoad.Load(); m != nil {
		return *m
	}
	return nil
}

// debug logs at most one line per reason every 10s: a flood of bad messages must not become a
// flood of log lines.
func (n *Node) debug(reason, msg string, args ...any) {
	if n.logDue(reason) {
		n.log.Debug(msg, args...)
	}
}

// logDue reports whether a line for reason may be logged now (one every 10s), and if so
// takes the turn. It allocates only the first time a reason is seen.
func (n *Node) logDue(reason string) bool {
	v, ok := n.lastLog.Load(reason)
	if !ok {
		v, _ = n.lastLog.LoadOrStore(reason, new(atomic.Int64))
	}
	last := v.(*atomic.Int64)
	now := time.Now().UnixNano()
	prev := last.Load()
	return now-prev >= int64(10*time.Second) && last.CompareAndSwap(prev, now)
}

// truncateText cuts s to at most max bytes at a rune boundary: a prefix of a routing text is
// still what a prefix tree needs.
func truncateText(s string, max int) string {
	if len(s) <= max {
		return s
	}
	i := max
	for i > 0 && i > max-utf8.UTFMax && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}
