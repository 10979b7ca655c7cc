package kvroute

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// These tests need no NATS server: a node opens without one (it keeps trying in the
// background), which is also what a replica does when NATS is down at start. The tests against
// a real server and separate Caddy processes are in cluster/clustertest.

const testClusterSecret = "0123456789abcdef-cluster"

// deadNATS returns a nats:// URL on which nothing listens.
func deadNATS(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "nats://" + addr
}

func TestClusterCaddyfile(t *testing.T) {
	d := caddyfile.NewTestDispenser(`kv_cache_aware {
		cluster nats://10.0.0.9:4222 tls://nats.example:4222 {
			name fleet-a
			secret {env.KVROUTE_CLUSTER_SECRET}
			creds /etc/nats/kvroute.creds
			tls_ca /etc/nats/ca.pem
		}
	}`)
	var p KVCacheAware
	if err := p.UnmarshalCaddyfile(d); err != nil {
		t.Fatalf("a valid cluster block refused: %v", err)
	}
	got, _ := json.Marshal(p.Cluster)
	want := `{"urls":["nats://10.0.0.9:4222","tls://nats.example:4222"],"name":"fleet-a","secret":"{env.KVROUTE_CLUSTER_SECRET}","creds":"/etc/nats/kvroute.creds","tls_ca":"/etc/nats/ca.pem"}`
	if string(got) != want {
		t.Errorf("cluster JSON\n got %s\nwant %s", got, want)
	}

	for _, tc := range []struct{ block, want string }{
		{"cluster nats://a:4222 {\nname f\nsecret short\n}", "cluster: secret: 5 bytes"},
		{"cluster nats://a:4222 {\nsecret " + testClusterSecret + "\n}", "cluster: name: required"},
		{"cluster {\nname f\nsecret " + testClusterSecret + "\n}", "cluster: at least one NATS URL"},
		{"cluster http://a:4222 {\nname f\nsecret " + testClusterSecret + "\n}", `scheme "http"`},
		{"cluster nats://a:4222 {\nname f.g\nsecret " + testClusterSecret + "\n}", "NATS subject token"},
		{"cluster nats://a:4222 {\nname f\nsecret " + testClusterSecret + "\ntls_ca /ca.pem\n}", "tls_ca: given but no URL"},
		{"cluster nats://a:4222 {\nname f\nsecrets x\n}", `unrecognized option "secrets"`},
		{"cluster nats://a:4222 {\nname f\nname g\n}", "name: given twice"},
		{"cluster nats://a:4222 {\nname\n}", "name: expected one value"},
	} {
		d := caddyfile.NewTestDispenser("kv_cache_aware {\n" + tc.block + "\n}")
		err := new(KVCacheAware).UnmarshalCaddyfile(d)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "Testfile:") {
			t.Errorf("%q: got %v, want an error with file:line containing %q", tc.block, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), testClusterSecret) {
			t.Errorf("%q: the error shows the secret: %v", tc.block, err)
		}
	}
}

// A JSON config's secret is resolved at provision, and refused when it resolves short or empty.
func TestClusterSecretResolvedAtProvision(t *testing.T) {
	provision := func() error {
		p := &KVCacheAware{Cluster: &ClusterConfig{URLs: []string{deadNATS(t)}, Name: "f", Secret: "{env.KVROUTE_TEST_CLUSTER_SECRET}"}}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
		err := p.Provision(ctx)
		if err == nil {
			_ = p.Cleanup()
		}
		return err
	}
	t.Setenv("KVROUTE_TEST_CLUSTER_SECRET", "")
	if err := provision(); err == nil || !strings.Contains(err.Error(), "cluster: secret resolved to nothing") {
		t.Errorf("an unset secret variable: got %v", err)
	}
	t.Setenv("KVROUTE_TEST_CLUSTER_SECRET", "tooshort")
	if err := provision(); err == nil || !strings.Contains(err.Error(), "cluster: secret: 8 bytes") {
		t.Errorf("an 8-byte secret: got %v", err)
	}
	t.Setenv("KVROUTE_TEST_CLUSTER_SECRET", testClusterSecret)
	if err := provision(); err != nil {
		t.Errorf("a valid secret refused: %v", err)
	}
}

// cluster is process-wide: two policies of one config must agree, and the error must not show
// the secret.
func TestClusterMustAgreeWithinConfig(t *testing.T) {
	url := deadNATS(t)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	a := &KVCacheAware{Cluster: &ClusterConfig{URLs: []string{url}, Name: "f", Secret: testClusterSecret}}
	if err := a.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer a.Cleanup()
	// Leaving it out takes the config's value.
	b := new(KVCacheAware)
	if err := b.Provision(ctx); err != nil {
		t.Fatalf("a policy leaving cluster out refused: %v", err)
	}
	defer b.Cleanup()
	for _, other := range []*ClusterConfig{
		{URLs: []string{url}, Name: "f", Secret: testClusterSecret + "x"},
		{URLs: []string{"nats://kvroute:hunter2-password@127.0.0.1:4222"}, Name: "f", Secret: testClusterSecret},
	} {
		c := &KVCacheAware{Cluster: other}
		err := c.Provision(ctx)
		if err == nil {
			_ = c.Cleanup()
			t.Fatalf("two policies of one config with different clusters were accepted: %+v", other)
		}
		if !strings.HasPrefix(err.Error(), "cluster: ") || strings.Contains(err.Error(), testClusterSecret) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error %q must name the option and show neither the secret nor a URL's password", err)
		}
	}
}

// Outside a config (a hand-built caddy.Context, no kvroute app), the first decision starts the
// node; in a running Caddy the app starts it with the config (lifecycle_test.go).
func TestClusterStartsOnFirstDecisionAndKeepsNodeOnReload(t *testing.T) {
	url := deadNATS(t)
	cfg := func(name string) *ClusterConfig {
		return &ClusterConfig{URLs: []string{url}, Name: name, Secret: testClusterSecret}
	}
	p := newPolicy(t, &KVCacheAware{Cluster: cfg("f")})
	if p.state.node() != nil {
		t.Fatal("provisioning opened the cluster node: caddy validate and adapt would connect")
	}
	pool := newPool("10.0.0.1:8000", "10.0.0.2:8000")
	pick(t, p, pool, "m", "hello")
	first := p.state.node()
	if first == nil {
		t.Fatal("the first decision did not open the cluster node")
	}
	if st := p.state.status(); st.Cluster == nil || st.Cluster.ID != first.ID() {
		t.Errorf("GET /kvroute/ lacks the cluster's stats: %+v", st.Cluster)
	}

	// A reload with the same cluster keeps the node; a changed one replaces it.
	q := newPolicy(t, &KVCacheAware{Cluster: cfg("f")})
	if q.state != p.state || p.state.node() != first {
		t.Fatal("a reload with an unchanged cluster replaced the node")
	}
	_ = p.Cleanup()
	if p.state.node() != first {
		t.Fatal("cleaning up the old config replaced the node")
	}
	r := newPolicy(t, &KVCacheAware{Cluster: cfg("g")})
	if r.state.node() != first {
		t.Fatal("provisioning a config with another cluster replaced the node before that config routed")
	}
	pick(t, r, pool, "m", "hello again") // the new config's first decision puts its options in force
	// and the node is replaced in the background.
	waitUntil(t, 10*time.Second, func() bool {
		second := r.state.node()
		return second != nil && second != first
	}, "a changed cluster reconnects")
	_ = q.Cleanup()
	_ = r.Cleanup()
	if activeNode.Load() != nil {
		t.Error("the node outlived the last policy")
	}
}

// What a peer publishes goes into the same trees and session store as a local decision, and
// local lookups key sessions the way peers do.
func TestClusterRemoteDecisionIsLocal(t *testing.T) {
	p := newPolicy(t, &KVCacheAware{Cluster: &ClusterConfig{URLs: []string{deadNATS(t)}, Name: "f", Secret: testClusterSecret}})
	pool := newPool("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000")
	pick(t, p, pool, "m", "warm up")
	n := p.state.node()
	if n == nil {
		t.Fatal("no node after the first decision")
	}
	h := clusterHandler{p.state}

	long := strings.Repeat("a long shared system prompt of many words; ", 20)
	for _, up := range []string{"10.0.0.3:8000", "10.0.0.2:8000"} {
		h.Decision("m", up, routingText("m", long+up))
		if got := pick(t, p, pool, "m", long+up+" and a follow-up"); got != up {
			t.Errorf("a peer's decision for %s: the next turn went to %s", up, got)
		}
	}

	h.Binding("m", n.SessionKey("sess-1"), "10.0.0.4:8000", time.Now())
	if got := pick(t, p, pool, "m", "unrelated", "X-Session-ID", "sess-1"); got != "10.0.0.4:8000" {
		t.Errorf("a peer's session binding was not honoured: went to %s", got)
	}
	if decisions(p, "10.0.0.4:8000", pathSession) != 1 {
		t.Error("the bound request was not a session decision")
	}
	h.Forget(n.SessionKey("sess-1"))
	if _, ok := p.state.sessions.get("m", n.SessionKey("sess-1"), time.Now()); ok {
		t.Error("a peer's forget left the binding")
	}

	// A local binding is stored under the key peers use, never under the id.
	pick(t, p, pool, "m", "another", "X-Session-ID", "sess-2")
	if _, ok := p.state.sessions.get("m", "sess-2", time.Now()); ok {
		t.Error("with a cluster, a session is bound under its clear id")
	}
	local, ok := p.state.sessions.get("m", n.SessionKey("sess-2"), time.Now())
	if !ok {
		t.Error("with a cluster, a session is not bound under its SessionKey")
	}
	// A peer's binding older than the local one (a late catch-up reply) leaves it; a newer one
	// replaces it.
	other := "10.0.0.1:8000"
	if local == other {
		other = "10.0.0.2:8000"
	}
	h.Binding("m", n.SessionKey("sess-2"), other, time.Now().Add(-time.Minute))
	if got, _ := p.state.sessions.get("m", n.SessionKey("sess-2"), time.Now()); got != local {
		t.Errorf("a peer's older binding replaced the local one: %s, want %s", got, local)
	}
	h.Binding("m", n.SessionKey("sess-2"), other, time.Now().Add(time.Millisecond))
	if got, _ := p.state.sessions.get("m", n.SessionKey("sess-2"), time.Now()); got != other {
		t.Errorf("a peer's newer binding did not replace the local one: %s, want %s", got, other)
	}

	h.Reset()
	if p.state.forest.Chars() != 0 || p.state.sessions.len() != 0 {
		t.Errorf("a peer's reset left %d chars and %d sessions", p.state.forest.Chars(), p.state.sessions.len())
	}
}
