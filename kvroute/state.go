package kvroute

import (
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/kvroute/caddy-kvroute/energy"
	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
	"github.com/kvroute/caddy-kvroute/tree"
)

// states holds the one process-wide state. A UsagePool keeps it alive across config reloads:
// the new config provisions (taking a reference) before the old one is cleaned up (dropping
// one), so learned prefixes and session bindings survive `caddy reload` and POST /load.
var states = caddy.NewUsagePool()

const stateKey = "kvroute"

// Decision paths, in the order of the decision.
const (
	pathSession = iota
	pathImbalance
	pathPrefixHit
	pathFallback
	pathNoCandidate
	numPaths
)

var pathNames = [numPaths]string{"session", "imbalance", "prefix_hit", "fallback", "no_candidate"}

// maxTrees bounds the number of per-model trees: model names come from clients. Past it, the
// least recently used trees go (treeName).
const maxTrees = 1024

// upstreamState is what the router knows of one upstream, keyed by its dial address.
type upstreamState struct {
	addr     string
	inFlight atomic.Int64 // requests this router sent and that have not finished
	// reserved counts the slots the queue handed to requests not decided yet (queue.go).
	reserved     atomic.Int64
	queuedTokens atomic.Int64 // their estimated prompt tokens
	// prefillTokens: the uncached tokens of those that have not produced a first token
	// (prefill.go); prefillQ orders them for the deadline estimate; firstTokens: llm_feedback
	// reports first tokens for this upstream.
	prefillTokens atomic.Int64
	prefillQ      prefillQueue
	firstTokens   atomic.Bool
	decisions     [numPaths]atomic.Uint64
	lastUsed      atomic.Int64 // unix nanoseconds of the last decision
	// lastSeen is when a decision last saw it in a pool (dynamic upstreams only: static ones
	// leave with their config): one that DNS no longer names is forgotten after the dynamic
	// TTL.
	lastSeen atomic.Int64

	engine      atomic.Pointer[engineView] // the latest telemetry reading's load (telemetry.go)
	telemetryUp atomic.Bool                // its telemetry answers (for the appear/go-away log lines)
	noMetrics   atomic.Bool                // its engine answered /metrics with 404 and was warned about, once
	peerReadAt  atomic.Int64               // unix nanos (local clock) of a peer's latest good reading of it; 0: none (telemetry.go)
	health      healthState                // health.go
	learn       upstreamLearn              // what its engine's totals taught (learn.go)
	feedback    feedbackState              // what its answers taught (feedback.go)
	lora        loraState                  // its warm LoRA adapters (fleet.go)

	host atomic.Pointer[reverseproxy.Host] // Caddy's count of requests to the address (load.go: own)
}

// registration is what the state knows of one provisioned policy: the state serves policies
// without knowing their type.
type registration struct {
	// config identifies the config the policy belongs to: the Done channel of the config's
	// context. Caddy hands each server of a config a context of its own (with its server as a
	// value), all derived from the config's one cancelable context, whose Done they share.
	config      <-chan struct{}
	provisioned time.Time
	static      []string                  // dial addresses of its reverse_proxy's static upstreams
	profiles    map[string]energy.Profile // its upstream blocks
	logger      *zap.Logger
	scheme      string         // of its reverse_proxy's upstreams: http, or https over TLS
	resolvers   []string       // its reverse_proxy transport's DNS resolvers, if it names any
	process     processOptions // as given; zero: left out
	app         bool           // its config has the kvroute app, which starts it (app.go)
	// retired is set when the policy is cleaned up (unregister). Caddy cleans up a replaced
	// config without waiting for its requests: within the grace period they go on deciding
	// (afterRetired).
	retired atomic.Bool
}

// processOptions are the options that configure the process-wide state. All policies of one
// config must agree on the ones they give.
type processOptions struct {
	evictionInterval time.Duration
	maxTreeSize      int64
	sessionTTL       time.Duration
	maxSessions      int
	telemetry        telemetrySettings
	telemetryGiven   bool
	cluster          *cluster.Config // nil: left out (no cluster)
}

// merge fills o's unset options from q, and reports the first option both set differently.
func (o *processOptions) merge(q processOptions) error {
	conflict := func(name string, a, b any) error {
		return fmt.Errorf("%s: all kv_cache_aware policies of a config share one state and must give the same value or leave it out; got %v and %v", name, a, b)
	}
	switch {
	case o.evictionInterval != 0 && q.evictionInterval != 0 && o.evictionInterval != q.evictionInterval:
		return conflict("eviction_interval", o.evictionInterval, q.evictionInterval)
	case o.maxTreeSize != 0 && q.maxTreeSize != 0 && o.maxTreeSize != q.maxTreeSize:
		return conflict("max_tree_size", o.maxTreeSize, q.maxTreeSize)
	case o.sessionTTL != 0 && q.sessionTTL != 0 && o.sessionTTL != q.sessionTTL:
		return conflict("session_ttl", o.sessionTTL, q.sessionTTL)
	case o.maxSessions != 0 && q.maxSessions != 0 && o.maxSessions != q.maxSessions:
		return conflict("max_sessions", o.maxSessions, q.maxSessions)
	case o.telemetryGiven && q.telemetryGiven && o.telemetry != q.telemetry:
		return conflict("telemetry", o.telemetry, q.telemetry)
	case o.cluster != nil && q.cluster != nil && !o.cluster.Equal(*q.cluster):
		return conflict("cluster", describeCluster(o.cluster), describeCluster(q.cluster)+" (or another secret, creds or tls_ca)")
	}
	if !o.telemetryGiven {
		o.telemetry, o.telemetryGiven = q.telemetry, q.telemetryGiven
	}
	o.evictionInterval = or(o.evictionInterval, q.evictionInterval)
	o.maxTreeSize = or(o.maxTreeSize, q.maxTreeSize)
	o.sessionTTL = or(o.sessionTTL, q.sessionTTL)
	o.maxSessions = or(o.maxSessions, q.maxSessions)
	o.cluster = or(o.cluster, q.cluster)
	return nil
}

func (o processOptions) withDefaults() processOptions {
	return processOptions{
		evictionInterval: or(o.evictionInterval, DefaultEvictionInterval),
		maxTreeSize:      or(o.maxTreeSize, DefaultMaxTreeSize),
		sessionTTL:       or(o.sessionTTL, DefaultSessionTTL),
		maxSessions:      or(o.maxSessions, DefaultMaxSessions),
		telemetry:        o.telemetrySettings(),
		telemetryGiven:   true,
		cluster:          o.cluster,
	}
}

func (o processOptions) telemetrySettings() telemetrySettings {
	if o.telemetryGiven {
		return o.telemetry
	}
	return (*Telemetry)(nil).settings()
}

// state is the hub shared by every kv_cache_aware policy of the process: it knows the
// upstreams, the prefix trees, the session bindings and the counters, and answers the
// policies' and the admin API's questions. Policies feed it their decisions (Select's record
// step); every other source of knowledge feeds it the same way, through methods of its own.
type state struct {
	forest   *tree.Forest
	sessions *sessionStore
	// pending holds the bindings of cookie session ids issued and not yet presented back, in a
	// space of their own: clients that keep no cookies (SDKs) get a new id on every request,
	// and must not evict the sessions of those that do.
	pending *sessionStore
	// responses binds Responses ids (a keyed digest) to the engine that stored them
	// (responses.go); respSeed keys the digest without a cluster.
	responses *sessionStore
	respSeed  [32]byte

	upstreams sync.Map // dial address → *upstreamState

	// deciding is held by a decision from reading the loads to counting its choice in them
	// (select.go: Select), so that decisions running at once do not all see the same loads.
	deciding sync.Mutex

	// static holds the static upstreams of all live policies, for the per-request path: a
	// session bound to one of them that is not in this request's pool is another site's.
	static atomic.Pointer[map[string]bool]

	mu       sync.Mutex
	regs     map[*registration]struct{} // provisioned and not yet cleaned up
	options  processOptions             // in force: the newest config's, defaults applied
	logger   *zap.Logger
	reconfig chan struct{} // wakes the eviction loop when the interval changes
	stop     chan struct{}
	done     chan struct{}

	// started is set when the background sources of knowledge beside the decisions (telemetry,
	// the cluster) run: when the kvroute app starts a config (app.go), never during caddy
	// validate or adapt, which provision but start nothing. Destruct stops them.
	started atomic.Bool
	dirty   atomic.Bool // a config registered since the options in force were applied
	// gate is closed once decisions may go: after the first start, when the first catch-up
	// from the cluster's peers is over or firstDecisionWait passed (gateOpen: the same, in
	// one atomic load for the request path).
	gate     chan struct{}
	gateOpen atomic.Bool
	gateOnce sync.Once
	// resync wakes the eviction loop to put the options in force in the background: after a
	// reload, closing and opening connections, replacing readers and evicting to a smaller
	// max_tree_size never run on a request.
	resync chan struct{}

	tel telemetryState // the engines' metrics readers (telemetry.go)
	// learnedChars holds each model's chars per token: model → *modelChars (learn.go).
	learnedChars  sync.Map
	nLearnedChars atomic.Int64

	// Health probes (health.go): bg counts them, bgClosed refuses new ones once destroyed.
	bg       sync.WaitGroup
	bgMu     sync.Mutex
	bgClosed bool

	cl clusterLife // the NATS membership, opened when the config starts (cluster.go)

	// closeNodeHook and shrinkHook replace how a node the cluster option no longer wants is
	// closed and how the trees are brought within limits just put in force (closeNode,
	// shrink): seams for the tests that show a request never waits for either. Atomic: the
	// eviction loop may run while a test sets them.
	closeNodeHook atomic.Pointer[func(*cluster.Node)]
	shrinkHook    atomic.Pointer[func()]

	recent decisionRing // the latest decisions' predicted costs (explain.go)

	wq *waitQueue // the requests waiting for a slot (queue.go)

	lastEviction atomic.Pointer[evictionRecord]
	evictedChars atomic.Int64
	evictions    atomic.Int64
}

type evictionRecord struct {
	At       time.Time     `json:"at"`
	Chars    int64         `json:"chars_evicted"`
	Nodes    int           `json:"nodes_evicted"`
	Duration time.Duration `json:"duration_ns"`
	Left     int64         `json:"chars_left"`
}

func newState() *state {
	opts := processOptions{}.withDefaults()
	return &state{
		forest:    tree.NewForest(tree.Limits{}),
		sessions:  newSessionStore(opts.maxSessions, opts.sessionTTL),
		pending:   newSessionStore(pendingCap(opts.maxSessions), opts.sessionTTL),
		responses: newSessionStore(opts.maxSessions, opts.sessionTTL),
		respSeed:  newResponseSeed(),
		regs:      make(map[*registration]struct{}),
		options:   opts,
		logger:    zap.NewNop(),
		reconfig:  make(chan struct{}, 1),
		gate:      make(chan struct{}),
		resync:    make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		wq:        newWaitQueue(),
	}
}

// closeNode closes a node the cluster option no longer wants.
func (s *state) closeNode(n *cluster.Node) {
	if h := s.closeNodeHook.Load(); h != nil {
		(*h)(n)
		return
	}
	_ = n.Close()
}

// shrink runs the eviction pass that the limits in force call for.
func (s *state) shrink() {
	if h := s.shrinkHook.Load(); h != nil {
		(*h)()
		return
	}
	s.forest.Evict()
}

// acquireState returns the process state, creating it (and its eviction goroutine) on first use.
func acquireState() (*state, error) {
	v, _, err := states.LoadOrNew(stateKey, func() (caddy.Destructor, error) {
		s := newState()
		activeQueue.Store(s.wq)
		go s.evictionLoop()
		return s, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*state), nil
}

// currentState returns the process state without taking a reference, or nil when no
// kv_cache_aware policy is loaded. The admin API and the metrics collector use it.
func currentState() *state {
	var s *state
	states.Range(func(_, v any) bool {
		s = v.(*state)
		return false
	})
	return s
}

// firstDecisionWait bounds how long the first decisions of a process wait: for the kvroute app
// to start (Caddy may start the http app first), then for the first catch-up from the
// cluster's peers. Past it a replica routes on what it knows alone. A catch-up on loopback or a
// LAN takes milliseconds; this leaves room for a loaded machine and a far NATS server.
const firstDecisionWait = 500 * time.Millisecond

// ready runs on every decision of the policy registered as r. The first decisions of the
// process wait at the gate (firstDecision). When r's config is the newest and was not applied
// yet, it puts that config's process-wide options in force (a config is only known to be
// accepted once it starts or routes: the old config's requests in the meantime leave them
// pending), and leaves the work that follows to the background. Afterwards it costs two
// atomic loads.
func (s *state) ready(r *registration) {
	if !s.gateOpen.Load() {
		s.firstDecision(r)
	}
	if r != nil && s.dirty.Load() && s.applyIfNewest(r.config) {
		s.resyncLater()
	}
}

// applyIfNewest puts the options of config in force when it is the newest live config and they
// were not applied yet, and reports whether it did. Only swaps: what follows from them runs in
// the background (resyncLater).
func (s *state) applyIfNewest(config <-chan struct{}) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.dirty.Load() {
		return false
	}
	if newest := s.newestLocked(); newest == nil || newest.config != config {
		return false
	}
	s.applyNewestLocked()
	return true
}

// firstDecision holds a decision that comes before the gate opened. A policy provisioned
// outside any config (no app: Go tests that build a caddy.Context by hand) starts the state
// itself and waits for nothing.
func (s *state) firstDecision(r *registration) {
	if r == nil || !r.app {
		if r != nil {
			s.start(r.config)
		}
		s.openGate()
		return
	}
	t := time.NewTimer(firstDecisionWait)
	defer t.Stop()
	select {
	case <-s.gate:
	case <-t.C:
		// The app did not start in time (or the state is going): route alone from now on.
		s.openGate()
	case <-s.stop:
	}
}

// start runs when a config starts (App.Start): it puts the config's options in force and
// starts or adjusts the background work. The first start opens the connection and the readers
// at once (there is nothing to close yet, and neither waits on the network), then opens the
// gate when the first catch-up is over; a later one (a reload) leaves that work to the
// background.
func (s *state) start(config <-chan struct{}) {
	s.applyIfNewest(config)
	if !s.started.CompareAndSwap(false, true) {
		s.resyncLater()
		return
	}
	s.syncTelemetry()
	s.reconcileCluster()
	go s.awaitCatchUp(time.Now().Add(firstDecisionWait))
	s.resyncLater() // the pass for the limits just put in force
}

// awaitCatchUp opens the gate when the node's first catch-up is over, or at deadline.
func (s *state) awaitCatchUp(deadline time.Time) {
	if n := s.node(); n != nil {
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-n.CaughtUp():
		case <-t.C:
		case <-s.stop:
		}
		t.Stop()
	}
	s.openGate()
}

func (s *state) openGate() {
	s.gateOnce.Do(func() {
		s.gateOpen.Store(true)
		close(s.gate)
	})
}

// resyncLater asks the eviction loop to bring the background work in line with the options in
// force (syncBackground). It never blocks.
func (s *state) resyncLater() {
	select {
	case s.resync <- struct{}{}:
	default:
	}
}

// syncBackground replaces the telemetry readers and the cluster node when the options in force
// changed them, and runs the eviction pass the limits in force call for (a smaller
// max_tree_size). It runs on the eviction loop.
func (s *state) syncBackground() {
	s.syncTelemetry()
	s.reconcileCluster()
	s.shrink()
}

// Destruct stops the eviction goroutine, the telemetry readers and the health probes when the
// last policy lets go of the state.
func (s *state) Destruct() error {
	s.closeCluster()
	s.wq.close()
	activeQueue.CompareAndSwap(s.wq, nil)
	close(s.stop)
	<-s.done
	s.stopTelemetry()
	s.stopHealth()
	return nil
}

// register adds a provisioned policy; a policy whose process-wide options disagree with
// another policy of its config is refused. Its options are not applied yet: a config can still
// be refused after this policy provisioned (by another module), and the old config must then
// keep serving as it was. They are applied when the config routes its first request (ready)
// or when the config it replaces lets go (unregister), whichever comes first.
func (s *state) register(r *registration) error {
	s.mu.Lock()
	config := r.process
	for q := range s.regs {
		if q.config == r.config {
			if err := config.merge(q.process); err != nil {
				s.mu.Unlock()
				return err
			}
		}
	}
	s.regs[r] = struct{}{}
	s.publishStaticLocked()
	s.dirty.Store(true)
	s.mu.Unlock()
	return nil
}

// unregister drops a policy that is being cleaned up and forgets the static upstreams that it
// listed and that no live policy lists any more: their cache is no longer reachable through
// this router. Dynamic upstreams age out through eviction. When it was the last policy, the
// state itself goes (UsagePool), so nothing is forgotten one by one (caddy validate and
// shutdown end that way).
func (s *state) unregister(r *registration) {
	r.retired.Store(true) // before the forgetting below: afterRetired relies on the order
	s.mu.Lock()
	delete(s.regs, r)
	s.publishStaticLocked()
	newest := s.newestLocked()
	if newest == nil {
		s.mu.Unlock()
		return
	}
	live := s.staticLocked()
	var gone []string
	for _, a := range r.static {
		if !live[a] {
			gone = append(gone, a)
		}
	}
	s.applyNewestLocked()
	logger := s.logger
	s.mu.Unlock()
	s.resyncLater()
	for _, a := range gone {
		if chars, sessions := s.forgetUpstream(a); chars > 0 || sessions > 0 {
			logger.Info("upstream left the config: dropped its prefixes and sessions",
				zap.String("upstream", a), zap.Int64("chars", chars), zap.Int("sessions", sessions))
		}
	}
}

// afterRetired runs after each decision of the policy registered as r once r is retired (a
// request of a replaced config, still running within the grace period): it forgets again the
// static upstreams of r that no live policy lists. The decision may have learned about one of
// them after unregister forgot it (its prefix in the tree, its session bound, its state made
// anew and its metrics read as a dynamic upstream's for 10 minutes): the request goes there, as
// its config says, but the router keeps nothing of an upstream that left the config. unregister
// retires r before it forgets, and a decision checks after it learned: a decision that learns
// after the forgetting sees r retired.
func (s *state) afterRetired(r *registration) {
	for _, a := range r.static {
		if !s.isStatic(a) {
			s.stopDynamic(s.tel.current.Load(), a)
			s.forgetUpstream(a)
		}
	}
}

// applyNewestLocked puts the newest live config's process-wide options in force (a smaller
// max_tree_size evicts at once, a smaller max_sessions trims the store); kv_capacity bounds
// are the union over live policies.
func (s *state) applyNewestLocked() {
	s.dirty.Store(false)
	newest := s.newestLocked()
	if newest == nil {
		return
	}
	config := processOptions{}
	for q := range s.regs {
		if q.config == newest.config {
			_ = config.merge(q.process) // they agreed when they registered
		}
	}
	s.logger = newest.logger
	s.applyLocked(config.withDefaults())
}

// applyLocked puts process-wide options in force.
func (s *state) applyLocked(o processOptions) {
	changed := s.options.evictionInterval != o.evictionInterval
	s.options = o
	s.sessions.configure(o.maxSessions, o.sessionTTL)
	s.pending.configure(pendingCap(o.maxSessions), o.sessionTTL)
	s.responses.configure(o.maxSessions, o.sessionTTL)
	// A smaller max_tree_size holds at once, without making inserts wait: the pass that
	// brings the trees within it runs in the background (syncBackground, and the one the next
	// insert starts).
	s.forest.StoreLimits(s.limitsLocked(o.maxTreeSize))
	if changed {
		select {
		case s.reconfig <- struct{}{}:
		default:
		}
	}
}

// pendingCap is the size of the space for issued cookie ids: a tenth of max_sessions, at least
// one.
func pendingCap(maxSessions int) int {
	return max(1, maxSessions/10)
}

// newestLocked returns the most recently provisioned live policy, or nil.
func (s *state) newestLocked() *registration {
	var newest *registration
	for q := range s.regs {
		if newest == nil || q.provisioned.After(newest.provisioned) {
			newest = q
		}
	}
	return newest
}

// staticLocked returns the static upstreams of all live policies.
func (s *state) staticLocked() map[string]bool {
	live := make(map[string]bool)
	for q := range s.regs {
		for _, a := range q.static {
			live[a] = true
		}
	}
	return live
}

func (s *state) publishStaticLocked() {
	live := s.staticLocked()
	s.static.Store(&live)
}

// isStatic reports whether addr is a static upstream of a live policy.
func (s *state) isStatic(addr string) bool {
	m := s.static.Load()
	return m != nil && (*m)[addr]
}

// limitsLocked computes the forest's bounds: maxChars, and for each upstream with a known KV
// capacity tenantBound(capacity): its kv_capacity annotation, else what its engine reports
// (telemetry). The annotation wins: the operator may know better (a cache shared with other
// work, an engine that misreports).
func (s *state) limitsLocked(maxChars int64) tree.Limits {
	l := tree.Limits{MaxChars: maxChars}
	set := func(addr string, tokens int64) {
		if l.TenantMaxChars == nil {
			l.TenantMaxChars = make(map[string]int64)
		}
		l.TenantMaxChars[addr] = int64(float64(tenantBound(tokens, s.upstreamCharsPerToken(addr))) * s.shareOf(addr))
	}
	annotated := make(map[string]bool)
	for q := range s.regs {
		for addr, prof := range q.profiles {
			if prof.KVCapacity > 0 {
				set(addr, prof.KVCapacity)
				annotated[addr] = true
			}
		}
	}
	for addr, tokens := range s.tel.capacity {
		if !annotated[addr] {
			set(addr, tokens)
		}
	}
	return l
}

// tenantBound returns the chars the tree remembers for an upstream whose KV cache holds tokens
// tokens: 1.5 × its capacity at charsPerToken, the chars per token learned for the model it is
// sent (4 until learned: on llm-d's simulator, whose tokenizer counts 5.2 chars of routing text
// per token on the Mooncake trace, 4 made the trees forget prefixes the engine still held). The tree cannot see what the worker evicts;
// forgetting a prefix the worker still holds sends its next request elsewhere to prefill it
// again, remembering one the worker dropped costs that one request a cold prefill on a worker
// that likely still holds its shorter prefixes. Measured on the demo (3 runs each,
// docs/benchmarks.md): at 1× the chat hit ratio was 0.525–0.535 and Mooncake's 0.096; at 1.5×,
// 0.547 and 0.101, with p99 TTFT still below round_robin's.
func tenantBound(tokens int64, charsPerToken float64) int64 {
	const slack = 1.5
	b := float64(tokens) * charsPerToken * slack
	if !(b < math.MaxInt64/2) {
		return math.MaxInt64
	}
	return int64(b)
}

// upstream returns the state of the upstream with dial address addr.
func (s *state) upstream(addr string) *upstreamState {
	if v, ok := s.upstreams.Load(addr); ok {
		return v.(*upstreamState)
	}
	v, _ := s.upstreams.LoadOrStore(addr, &upstreamState{addr: addr})
	return v.(*upstreamState)
}

// lastActive is when a decision last picked u or saw it in a pool (unix nanoseconds).
func (u *upstreamState) lastActive() int64 { return max(u.lastUsed.Load(), u.lastSeen.Load()) }

// forgetUpstream drops everything learned about addr: its prefixes, its session bindings and
// its state (its probe stops).
func (s *state) forgetUpstream(addr string) (chars int64, sessions int) {
	if v, ok := s.upstreams.Load(addr); ok {
		s.dropUpstream(v.(*upstreamState))
	}
	chars = s.forest.TenantChars(addr)
	s.forest.RemoveTenant(addr)
	s.responses.dropUpstream(addr)
	return chars, s.sessions.dropUpstream(addr) + s.pending.dropUpstream(addr)
}

// reset drops all trees and session bindings (admin POST /kvroute/reset).
func (s *state) reset() {
	s.forest.Reset()
	s.sessions.reset()
	s.pending.reset()
	s.responses.reset()
}

// forgetSession drops every binding of session id sid, for every model (admin DELETE
// /kvroute/sessions/{id}), and reports whether there was one.
func (s *state) forgetSession(sid string) bool {
	return s.sessions.forget(sid)+s.pending.forget(sid) > 0
}

// loaded reports whether a kv_cache_aware policy is in a running config.
func (s *state) loaded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.regs) > 0
}

func (s *state) evictionLoop() {
	defer close(s.done)
	var ticker *time.Ticker
	var tick <-chan time.Time
	arm := func() {
		if ticker != nil {
			ticker.Stop()
		}
		s.mu.Lock()
		d := s.options.evictionInterval
		s.mu.Unlock()
		ticker, tick = nil, nil
		if d > 0 {
			ticker = time.NewTicker(d)
			tick = ticker.C
		}
	}
	arm()
	for {
		select {
		case <-s.stop:
			if ticker != nil {
				ticker.Stop()
			}
			return
		case <-s.reconfig:
			arm()
		case <-s.resync:
			s.syncBackground()
		case <-tick:
			s.evict()
		}
	}
}

// evict runs one eviction pass over the trees and the sessions, and drops the bookkeeping of
// dynamic upstreams idle for the dynamic TTL.
func (s *state) evict() {
	st := s.forest.Evict()
	expired := s.sessions.expire(time.Now()) + s.pending.expire(time.Now())
	s.responses.expire(time.Now())
	rec := &evictionRecord{At: time.Now(), Chars: st.Chars, Nodes: st.Nodes, Duration: st.Duration, Left: s.forest.Chars()}
	s.lastEviction.Store(rec)
	s.evictions.Add(1)
	s.evictedChars.Add(st.Chars)
	s.mu.Lock()
	logger := s.logger
	static := s.staticLocked()
	s.mu.Unlock()
	s.expireDynamic(time.Now())
	// A dynamic upstream (DNS, a discovery service) that no decision saw in its pool for the
	// dynamic TTL has left: down or not, its state, its probe, its share of the trees and its
	// session bindings go. Should it come back, it starts afresh (up, cold).
	idle := time.Now().Add(-dynamicTTL()).UnixNano()
	now := time.Now().UnixNano()
	s.upstreams.Range(func(_, v any) bool {
		u := v.(*upstreamState)
		// An upstream no decision reads (never chosen again, down) lets go of the requests
		// its prefill queue still points to (prefill.go).
		u.expirePrefill(now)
		if !static[u.addr] && u.inFlight.Load() == 0 && u.lastActive() < idle {
			if chars, sessions := s.forgetUpstream(u.addr); chars > 0 || sessions > 0 {
				logger.Info("dynamic upstream gone: dropped its prefixes and sessions",
					zap.String("upstream", u.addr), zap.Int64("chars", chars), zap.Int("sessions", sessions))
			}
		}
		return true
	})
	if st.Chars > 0 || expired > 0 {
		logger.Info("eviction",
			zap.String("evicted", humanize.Comma(st.Chars)+" chars"),
			zap.Int("nodes", st.Nodes),
			zap.String("left", humanize.Comma(rec.Left)+" chars"),
			zap.Int("sessions_expired", expired),
			zap.Duration("took", st.Duration))
	}
}

// upstreamAddrs returns the dial addresses the router knows, sorted.
func (s *state) upstreamAddrs() []string {
	seen := make(map[string]bool)
	s.upstreams.Range(func(k, _ any) bool {
		seen[k.(string)] = true
		return true
	})
	for _, t := range s.forest.Tenants() {
		seen[t] = true
	}
	out := make([]string, 0, len(seen))
	for a := range seen {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// profile returns the newest live policy's annotation of addr, if any.
func (s *state) profile(addr string) (energy.Profile, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var newest *registration
	var prof energy.Profile
	for q := range s.regs {
		if p, ok := q.profiles[addr]; ok && (newest == nil || q.provisioned.After(newest.provisioned)) {
			newest, prof = q, p
		}
	}
	return prof, newest != nil
}
