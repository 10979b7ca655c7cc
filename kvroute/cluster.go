package kvroute

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"

	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
)

// ClusterConfig is the `cluster` option: replicas with the same name share what they learn over
// NATS (docs/design.md "Cluster"). It is process-wide, like max_tree_size.
type ClusterConfig struct {
	// NATS server URLs (nats://, tls://, ws://, wss://); several for a NATS cluster.
	URLs []string `json:"urls,omitempty"`
	// Name of the fleet; replicas with the same name share state. One NATS subject token.
	Name string `json:"name,omitempty"`
	// Secret that seals and authenticates every message, at least 16 bytes; placeholders such
	// as {env.KVROUTE_CLUSTER_SECRET} are resolved at provision.
	Secret string `json:"secret,omitempty"`
	// Optional NATS credentials file.
	Creds string `json:"creds,omitempty"`
	// Optional PEM file of the CAs that tls:// servers are verified against.
	TLSCA string `json:"tls_ca,omitempty"`
}

// parseCluster reads `cluster <url>... { name; secret; creds; tls_ca }`, d on "cluster".
func parseCluster(d *caddyfile.Dispenser) (*ClusterConfig, error) {
	c := &ClusterConfig{URLs: d.RemainingArgs()}
	seen := make(map[string]bool)
	for d.NextBlock(1) {
		sub := d.Val()
		if seen[sub] {
			return nil, d.Errf("cluster: %s: given twice", sub)
		}
		seen[sub] = true
		var dst *string
		switch sub {
		case "name":
			dst = &c.Name
		case "secret":
			dst = &c.Secret
		case "creds":
			dst = &c.Creds
		case "tls_ca":
			dst = &c.TLSCA
		default:
			return nil, d.Errf("cluster: unrecognized option %q (options: name, secret, creds, tls_ca)", sub)
		}
		if !d.NextArg() {
			return nil, d.Errf("cluster: %s: expected one value", sub)
		}
		*dst = d.Val()
		if d.NextArg() {
			return nil, d.Errf("cluster: %s: expected one value, got more", sub)
		}
	}
	return c, nil
}

// config returns c as the cluster package takes it. With resolve, placeholders in the secret are
// replaced (at provision time: the Caddyfile adapter may run on another machine than Caddy).
func (c *ClusterConfig) config(resolve bool) cluster.Config {
	cfg := cluster.Config{URLs: c.URLs, Name: c.Name, Secret: c.Secret, Creds: c.Creds, TLSCA: c.TLSCA}
	if resolve {
		cfg.Secret = caddy.NewReplacer().ReplaceKnown(c.Secret, "")
	}
	return cfg
}

// checkCluster is the `cluster` option's check. A secret whose placeholders are not resolved
// yet (Caddyfile parsing, caddy adapt) is checked for everything but its length.
func checkCluster(c *cluster.Config, secretSet bool) error {
	if c == nil {
		return nil
	}
	cfg := *c
	if strings.Contains(cfg.Secret, "{") {
		cfg.Secret = strings.Repeat("x", cluster.MinSecretLen) // resolved at provision
	} else if secretSet && cfg.Secret == "" {
		return errors.New("secret resolved to nothing (is its environment variable set?)")
	}
	if err := cfg.Validate(); err != nil {
		// cluster's errors start with "cluster: "; the caller names the option.
		return errors.New(strings.TrimPrefix(err.Error(), "cluster: "))
	}
	return nil
}

// clusterLink is the process's running membership: the node and the configuration it was
// opened with (a reload with an equal configuration keeps it).
type clusterLink struct {
	cfg  cluster.Config
	node *cluster.Node
}

// activeNode is the running node of the process's state, or nil. The state is one per process,
// and the in-flight accounting (llmRequest.track, which knows only the upstream) needs to tell
// the node that the counts moved without a pointer to the state.
var activeNode atomic.Pointer[cluster.Node]

// loadChanged tells the running node, if any, that the in-flight counts moved. One atomic
// load and a non-blocking channel send.
func loadChanged() {
	if n := activeNode.Load(); n != nil {
		n.LoadChanged()
	}
}

// clusterLife is the part of the state that owns the connection.
type clusterLife struct {
	mu     sync.Mutex // serialises reconcile and close
	closed bool       // Destruct ran: never open again
	link   atomic.Pointer[clusterLink]
}

// node returns the running node, or nil.
func (s *state) node() *cluster.Node {
	if l := s.cl.link.Load(); l != nil {
		return l.node
	}
	return nil
}

// reconcileCluster opens, keeps, replaces or closes the node so that it matches the cluster
// option in force. It does nothing before the config starts (App.Start): background work never
// starts during caddy validate or adapt. Open never waits on the network; closing a node does
// (it flushes), so after the first start it runs on the eviction loop (syncBackground), never
// on a request.
func (s *state) reconcileCluster() {
	if !s.started.Load() {
		return
	}
	s.cl.mu.Lock()
	defer s.cl.mu.Unlock()
	if s.cl.closed {
		return
	}
	s.mu.Lock()
	want := s.options.cluster
	logger := s.logger
	s.mu.Unlock()
	cur := s.cl.link.Load()
	switch {
	case cur == nil && want == nil:
		return
	case cur != nil && want != nil && cur.cfg.Equal(*want):
		return // unchanged: the connection stays
	}
	var next *clusterLink
	if want != nil {
		n, err := cluster.Open(*want, clusterHandler{s}, s.ownLoads, slogFor(logger))
		if err != nil {
			// Provision validated the option: this is not expected; serve alone.
			logger.Error("cluster: not joining", zap.Error(err))
		} else {
			next = &clusterLink{cfg: *want, node: n}
			logger.Info("cluster: joining", zap.String("name", want.Name), zap.String("id", n.ID()))
		}
	}
	s.cl.link.Store(next)
	if next != nil {
		activeNode.Store(next.node)
	} else if cur != nil {
		activeNode.CompareAndSwap(cur.node, nil)
	}
	if cur != nil {
		s.closeNode(cur.node)
		logger.Info("cluster: left", zap.String("name", cur.cfg.Name), zap.String("id", cur.node.ID()))
	}
}

// closeCluster closes the node for good (Destruct).
func (s *state) closeCluster() {
	s.cl.mu.Lock()
	defer s.cl.mu.Unlock()
	s.cl.closed = true
	if cur := s.cl.link.Swap(nil); cur != nil {
		activeNode.CompareAndSwap(cur.node, nil)
		s.closeNode(cur.node)
	}
}

// slogFor gives the cluster package (which logs with log/slog) the policy's zap logger.
func slogFor(l *zap.Logger) *slog.Logger {
	return slog.New(zapslog.NewHandler(l.Named("cluster").Core()))
}

// ownLoads is the node's LoadSource: this replica's own in-flight requests per upstream.
func (s *state) ownLoads() map[string]int64 {
	m := make(map[string]int64)
	s.upstreams.Range(func(k, v any) bool {
		if n := v.(*upstreamState).inFlight.Load(); n > 0 {
			m[k.(string)] = n
		}
		return true
	})
	return m
}

// PrefillTokens is the node's PrefillSource: this replica's queued prefill tokens per upstream
// (prefill.go), its requests past their predicted first token expired first.
func (h clusterHandler) PrefillTokens() map[string]int64 {
	m := make(map[string]int64)
	now := time.Now().UnixNano()
	h.s.upstreams.Range(func(k, v any) bool {
		u := v.(*upstreamState)
		u.expirePrefill(now)
		if n := u.prefillTokens.Load(); n > 0 {
			m[k.(string)] = n
		}
		return true
	})
	return m
}

// peersInFlight is the in-flight count on upstream addr that live peers last published: load's
// peers term, also what telemetry's external term subtracts at reading time.
func (s *state) peersInFlight(addr string) int64 {
	if n := s.node(); n != nil {
		return n.PeerLoad(addr)
	}
	return 0
}

// peersPrefill is the queued prefill tokens on upstream addr that live peers last published
// (decision cost's queue: prefill.go).
func (s *state) peersPrefill(addr string) int64 {
	if n := s.node(); n != nil {
		return n.PeerPrefill(addr)
	}
	return 0
}

// sessionKey is the key under which session id is bound: with a cluster, the keyed digest that
// every replica computes alike (ids never cross the wire); without, the id itself.
func (s *state) sessionKey(id string) string {
	if n := s.node(); n != nil && id != "" {
		return n.SessionKey(id)
	}
	return id
}

// share publishes a local decision to the peers: the routing text under upstream, and the
// session binding when one was made (bindKey from sessionKey, boundAt the time the session
// store keeps for it). It never blocks.
func (s *state) share(model, upstream, text, bindKey string, boundAt time.Time) {
	n := s.node()
	if n == nil {
		return
	}
	if text != "" {
		n.PublishDecision(model, upstream, text)
	}
	if bindKey != "" {
		n.PublishBinding(model, bindKey, upstream, boundAt)
	}
}

// adminForget forgets session id here and, with a cluster, on every peer. It reports whether
// this replica had a binding, and whether the forget was published.
func (s *state) adminForget(id string) (found, published bool) {
	key := s.sessionKey(id)
	found = s.forgetSession(key)
	if n := s.node(); n != nil {
		n.PublishForget(key)
		published = true
	}
	return found, published
}

// adminReset drops all trees and bindings here and, with a cluster, on every peer.
func (s *state) adminReset() {
	s.reset()
	if n := s.node(); n != nil {
		n.PublishReset()
	}
}

// clusterStats returns the node's counters, or nil without a cluster.
func (s *state) clusterStats() *cluster.Stats {
	if n := s.node(); n != nil {
		st := n.Stats()
		return &st
	}
	return nil
}

// makeRoomFor lets the least recently used trees go when model is new and the forest holds
// maxTrees already: model names come from clients and peers alike.
func (s *state) makeRoomFor(model string) {
	if f := s.forest; f.Get(model) == nil && f.Len() >= maxTrees {
		f.MakeRoom(maxTrees)
	}
}

// clusterHandler applies what peers publish exactly as a local decision: the same trees (with
// their bounds, eviction and per-upstream capacity) and the same session store. It never
// publishes: a peer's decision is its own to share.
type clusterHandler struct{ s *state }

func (h clusterHandler) Decision(model, upstream, text string) {
	model = boundKey(model, maxModelLen)
	h.s.makeRoomFor(model)
	h.s.forest.Tree(model).Insert(text, upstream)
	if v, ok := h.s.upstreams.Load(upstream); ok && h.s.listedAdapter(upstream, model) {
		h.s.adapterSent(v.(*upstreamState), model, false)
	}
}

// Binding applies a peer's binding only when it is newer than the one held: a catch-up reply
// can bring one replica's older binding after another's newer one.
func (h clusterHandler) Binding(model, sessionKey, upstream string, at time.Time) bool {
	if model == "" && isResponseKey(sessionKey) {
		return h.s.responses.bindPeer("", sessionKey, upstream, at, time.Now())
	}
	return h.s.sessions.bindPeer(boundKey(model, maxModelLen), sessionKey, upstream, at, time.Now())
}

func (h clusterHandler) Forget(sessionKey string) {
	h.s.forgetSession(sessionKey)
}

func (h clusterHandler) Reset() {
	h.s.reset()
}

// Reading: a peer that owns an engine read it (telemetry.go, adoptReading).
func (h clusterHandler) Reading(r cluster.EngineReading) {
	h.s.adoptReading(r)
}

// Learned: a peer that owns an engine learned from its totals (learn.go, adoptLearned).
func (h clusterHandler) Learned(l cluster.EngineLearned) {
	h.s.adoptLearned(l)
}

// describeCluster is how a conflicting cluster option is named in an error: never the secret,
// nor credentials given in a URL.
func describeCluster(c *cluster.Config) string {
	urls := make([]string, len(c.URLs))
	for i, raw := range c.URLs {
		u, err := url.Parse(raw)
		switch {
		case err != nil:
			urls[i] = "(unparsable)"
		case u.User != nil:
			u.User = url.User("redacted")
			urls[i] = u.String()
		default:
			urls[i] = raw
		}
	}
	return fmt.Sprintf("{urls %v name %q}", urls, c.Name)
}

var (
	_ cluster.Handler        = clusterHandler{}
	_ cluster.ReadingHandler = clusterHandler{}
	_ cluster.PrefillSource  = clusterHandler{}
	_ cluster.LearnedHandler = clusterHandler{}
)
