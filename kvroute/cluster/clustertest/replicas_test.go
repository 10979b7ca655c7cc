package clustertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
)

// These tests run replicas as separate Caddy processes (the state is one per process), built by
// `./xcaddy.sh build` (KVROUTE_CADDY, which `./xcaddy.sh test` sets), around the embedded NATS
// server, each on free ports (freePorts), so that two runs on one machine do not meet.

const replicaSecret = "replica-test-secret-0123456789ab"

func caddyBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("KVROUTE_CADDY")
	if bin == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("KVROUTE_CADDY is not set: run the tests with ./xcaddy.sh test")
		}
		t.Skip("KVROUTE_CADDY not set; ./xcaddy.sh test builds Caddy and sets it")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("KVROUTE_CADDY=%s: %v", bin, err)
	}
	return bin
}

// backend is a loopback LLM stand-in that names itself in X-Upstream. While hold is set, it holds
// the requests whose body says "held request" until hold is closed (for load).
type backend struct {
	name string
	srv  *httptest.Server
	mu   sync.Mutex
	hold chan struct{} // nil: answer at once
}

func newBackends(t *testing.T, n int) []*backend {
	t.Helper()
	bs := make([]*backend, n)
	for i := range bs {
		b := &backend{name: fmt.Sprintf("b%d", i)}
		b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			b.mu.Lock()
			hold := b.hold
			b.mu.Unlock()
			if hold != nil && bytes.Contains(body, []byte("held request")) {
				select {
				case <-hold:
				case <-r.Context().Done():
				}
			}
			w.Header().Set("X-Upstream", b.name)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"ok"}}]}`)
		}))
		t.Cleanup(b.srv.Close)
		bs[i] = b
	}
	return bs
}

func (b *backend) addr() string { return strings.TrimPrefix(b.srv.URL, "http://") }

func addrs(bs []*backend) string {
	var s []string
	for _, b := range bs {
		s = append(s, b.addr())
	}
	return strings.Join(s, " ")
}

// freePorts returns n distinct ports free on every interface right now (a replica's site
// listens on all of them); the replica binds them moments later.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close() // all held together: n different ports
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// replica is one Caddy process.
type replica struct {
	t     *testing.T
	name  string
	admin string
	site  string
	cmd   *exec.Cmd
	out   *bytes.Buffer
}

// startReplica runs Caddy with kv_cache_aware over bs and, when natsURL is not empty, a cluster
// block whose secret comes from the environment (resolved at provision).
func startReplica(t *testing.T, name string, bs []*backend, natsURL, secret string) *replica {
	t.Helper()
	return startReplicaWith(t, name, addrs(bs), natsURL, secret, "")
}

// startReplicaWith is startReplica over the upstreams upstreams (dial addresses), with extra
// lines in the policy's block.
func startReplicaWith(t *testing.T, name string, upstreams, natsURL, secret, extra string) *replica {
	t.Helper()
	return startReplicaSite(t, name, upstreams, natsURL, secret, extra, "")
}

// startReplicaSite is startReplicaWith with site lines ahead of the reverse_proxy (handlers
// such as llm_feedback).
func startReplicaSite(t *testing.T, name string, upstreams, natsURL, secret, extra, site string) *replica {
	t.Helper()
	bin := caddyBinary(t)
	ports := freePorts(t, 2)
	r := &replica{t: t, name: name, admin: fmt.Sprintf("127.0.0.1:%d", ports[0]), site: fmt.Sprintf("127.0.0.1:%d", ports[1]), out: new(bytes.Buffer)}
	clusterBlock := ""
	if natsURL != "" {
		clusterBlock = fmt.Sprintf(`
			cluster %s {
				name replicas-test
				secret {env.KVROUTE_CLUSTER_SECRET}
			}`, natsURL)
	}
	cfg := fmt.Sprintf(`{
	admin %s
	http_port %d
	metrics
	log {
		level WARN
	}
}
:%d {
	@llm llm_prompt
	%s
	reverse_proxy @llm %s {
		lb_policy kv_cache_aware {%s%s
		}
	}
}
`, r.admin, ports[1], ports[1], site, upstreams, clusterBlock, extra)
	dir := t.TempDir()
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	r.cmd = exec.Command(bin, "run", "--config", path)
	r.cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir, "KVROUTE_CLUSTER_SECRET="+secret)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.stop)
	eventually(t, 15*time.Second, "replica "+name+"'s admin API", func() bool {
		resp, err := http.Get("http://" + r.admin + "/config/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return r
}

func (r *replica) stop() {
	if r.cmd.ProcessState != nil {
		return
	}
	_ = r.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		<-done
	}
	if r.t.Failed() {
		r.t.Logf("replica %s output:\n%s", r.name, r.out.String())
	}
}

// status is the part of GET /kvroute/ these tests read.
type status struct {
	StoredChars int64          `json:"stored_chars"`
	Sessions    int            `json:"sessions"`
	Cluster     *cluster.Stats `json:"cluster"`
}

func (r *replica) status() status {
	r.t.Helper()
	resp, err := http.Get("http://" + r.admin + "/kvroute/")
	if err != nil {
		r.t.Fatalf("%s: GET /kvroute/: %v", r.name, err)
	}
	defer resp.Body.Close()
	var st status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		r.t.Fatalf("%s: GET /kvroute/: %v", r.name, err)
	}
	return st
}

// rawStatus returns r's GET /kvroute/ as it is.
func (r *replica) rawStatus() string {
	r.t.Helper()
	resp, err := http.Get("http://" + r.admin + "/kvroute/")
	if err != nil {
		r.t.Fatalf("%s: GET /kvroute/: %v", r.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metrics returns r's Prometheus exposition.
func (r *replica) metrics() string {
	r.t.Helper()
	resp, err := http.Get("http://" + r.admin + "/metrics")
	if err != nil {
		r.t.Fatalf("%s: GET /metrics: %v", r.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// livePeers is how many peers r hears from (0 before its node runs).
func (r *replica) livePeers() int {
	st := r.status()
	if st.Cluster == nil || !st.Cluster.Connected {
		return 0
	}
	n := 0
	for _, p := range st.Cluster.Peers {
		if p.Live {
			n++
		}
	}
	return n
}

func (r *replica) applied() uint64 {
	if st := r.status(); st.Cluster != nil {
		return st.Cluster.DecisionsReceived + st.Cluster.BindingsReceived
	}
	return 0
}

var client = &http.Client{Timeout: 20 * time.Second}

// chat sends a chat completion to r and returns the backend that answered ("" and the status on
// failure).
func (r *replica) chat(t *testing.T, msgs []string, headers ...string) (string, int) {
	t.Helper()
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []msg
	for i, m := range msgs {
		role := "user"
		if i == 0 {
			role = "system"
		} else if i%2 == 0 {
			role = "assistant"
		}
		ms = append(ms, msg{role, m})
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": ms, "max_tokens": 16})
	req, _ := http.NewRequest(http.MethodPost, "http://"+r.site+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Errorf("%s: %v", r.name, err)
		return "", 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", resp.StatusCode
	}
	return resp.Header.Get("X-Upstream"), resp.StatusCode
}

// waitApplied waits until r applied more than before peers' records: what the previous
// replica decided has arrived.
func waitApplied(t *testing.T, r *replica, before uint64) {
	t.Helper()
	eventually(t, 5*time.Second, r.name+" applies a peer's decision", func() bool { return r.applied() > before })
}

// conversation is one client's chat: a long system prompt of its own, and its turns so far.
type conversation struct {
	msgs []string
	home string // the backend of its first turn
}

func newConversation(i int) *conversation {
	sys := fmt.Sprintf("You are assistant number %d. ", i) + strings.Repeat(fmt.Sprintf("Rule %d: answer with care and precision. ", i), 30)
	return &conversation{msgs: []string{sys, fmt.Sprintf("first question of conversation %d", i)}}
}

func (c *conversation) next(turn int) {
	c.msgs = append(c.msgs, "an answer", fmt.Sprintf("question %d", turn))
}

// turn sends c's next turn to r and checks that it stays home. It waits until the peers
// applied the decision, as a client's think time would allow.
func (c *conversation) turn(t *testing.T, r *replica, peers []*replica, what string) {
	t.Helper()
	before := make([]uint64, len(peers))
	for i, p := range peers {
		before[i] = p.applied()
	}
	got, code := r.chat(t, c.msgs)
	if code != http.StatusOK {
		t.Fatalf("%s via %s: status %d", what, r.name, code)
	}
	if c.home == "" {
		c.home = got
	} else if got != c.home {
		t.Errorf("%s via %s went to %s, its earlier turns to %s", what, r.name, got, c.home)
	}
	for i, p := range peers {
		waitApplied(t, p, before[i])
	}
}

func TestReplicasShareWhatTheyLearn(t *testing.T) {
	caddyBinary(t)
	ns := startNATS(t, nil)
	bs := newBackends(t, 4)
	a := startReplica(t, "A", bs, ns.url(), replicaSecret)
	b := startReplica(t, "B", bs, ns.url(), replicaSecret)
	// The node opens on the first decision: one request each.
	a.chat(t, []string{"warm up A"})
	b.chat(t, []string{"warm up B"})
	eventually(t, 10*time.Second, "A and B hear each other", func() bool { return a.livePeers() == 1 && b.livePeers() == 1 })

	// A conversation whose turns alternate between replicas stays on one upstream. Without
	// the cluster, each replica places a cold first turn on its own, and the conversations'
	// homes differ between A and B.
	var convs []*conversation
	for i := range 8 {
		c := newConversation(i)
		convs = append(convs, c)
		c.turn(t, a, []*replica{b}, fmt.Sprintf("conversation %d turn 0", i))
	}
	for turn := 1; turn <= 3; turn++ {
		for i, c := range convs {
			c.next(turn)
			r, peer := a, b
			if turn%2 == 1 {
				r, peer = b, a
			}
			c.turn(t, r, []*replica{peer}, fmt.Sprintf("conversation %d turn %d", i, turn))
		}
	}
	homes := map[string]bool{}
	for _, c := range convs {
		homes[c.home] = true
	}
	if len(homes) < 2 {
		t.Errorf("8 conversations all went to %v: the test cannot tell shared routing from chance", homes)
	}

	// A header session bound on A is honoured on B, with a prompt B never saw.
	for i := range 4 {
		sid := fmt.Sprintf("header-session-%d", i)
		before := b.applied()
		home, code := a.chat(t, []string{fmt.Sprintf("session %d opening prompt, cold", i)}, "X-Session-ID", sid)
		if code != http.StatusOK {
			t.Fatalf("session %d on A: status %d", i, code)
		}
		eventually(t, 5*time.Second, "B applies A's decision and binding", func() bool { return b.applied() >= before+2 })
		// A prompt sharing nothing with anything routed so far: only the binding sends it home.
		if got, _ := b.chat(t, []string{fmt.Sprintf("%x totally unrelated text for %d", i*7919, i)}, "X-Session-ID", sid); got != home {
			t.Errorf("session %s bound on A to %s went to %s on B", sid, home, got)
		}
	}

	// A late replica catches up from its peers' logs: C, started now, routes the next turn of
	// every conversation home without having seen one of them.
	start := time.Now()
	c := startReplica(t, "C", bs, ns.url(), replicaSecret)
	c.chat(t, []string{"warm up C"})
	eventually(t, 10*time.Second, "C caught up", func() bool {
		st := c.status()
		return st.Cluster != nil && st.Cluster.SyncReceivedRecords >= uint64(len(convs))
	})
	t.Logf("C caught up in %v (including Caddy's start)", time.Since(start).Round(time.Millisecond))
	for i, cv := range convs {
		cv.next(4)
		cv.turn(t, c, []*replica{a, b}, fmt.Sprintf("conversation %d turn 4 on late C", i))
	}

	// A peer with the wrong secret changes nothing: its decisions are rejected and counted.
	eventually(t, 10*time.Second, "A hears B and C", func() bool { return a.livePeers() == 2 })
	// C's last decisions may still be on their way to A: read A once they have all arrived
	// (two readings 300 ms apart agree), or they count against D.
	settled := a.status().Cluster.DecisionsReceived
	eventually(t, 10*time.Second, "A's received decisions settle", func() bool {
		time.Sleep(300 * time.Millisecond)
		now := a.status().Cluster.DecisionsReceived
		same := now == settled
		settled = now
		return same
	})
	aBefore := a.status()
	d := startReplica(t, "D", bs, ns.url(), "another-secret-of-32-bytes-000000")
	for i := range 5 {
		if _, code := d.chat(t, []string{fmt.Sprintf("D's own prompt %d", i) + strings.Repeat(" padding", 40)}); code != http.StatusOK {
			t.Fatalf("D: status %d", code)
		}
	}
	eventually(t, 5*time.Second, "A rejects D's messages", func() bool {
		st := a.status()
		return st.Cluster.RejectedAuth > aBefore.Cluster.RejectedAuth
	})
	aAfter := a.status()
	if aAfter.StoredChars != aBefore.StoredChars || aAfter.Cluster.DecisionsReceived != aBefore.Cluster.DecisionsReceived {
		t.Errorf("D (wrong secret) changed A: stored chars %d → %d, decisions received %d → %d",
			aBefore.StoredChars, aAfter.StoredChars, aBefore.Cluster.DecisionsReceived, aAfter.Cluster.DecisionsReceived)
	}
	if n := a.livePeers(); n != 2 {
		t.Errorf("A counts %d live peers with D about, want 2", n)
	}
	eventually(t, 5*time.Second, "D rejects the fleet's messages", func() bool { return d.status().Cluster.RejectedAuth > 0 })
	if st := d.status(); st.Cluster.DecisionsReceived != 0 {
		t.Errorf("D (wrong secret) applied %d of the fleet's decisions", st.Cluster.DecisionsReceived)
	}
	d.stop()
	// Prometheus shows the same.
	metrics := a.metrics()
	for _, want := range []string{"caddy_kvroute_cluster_peers 2", "caddy_kvroute_cluster_connected 1", `caddy_kvroute_cluster_rejected_total{reason="auth"}`, `caddy_kvroute_cluster_applied_total{kind="decision"}`, "caddy_kvroute_cluster_duplicates_total "} {
		if !strings.Contains(metrics, want) {
			t.Errorf("A's /metrics lacks %q", want)
		}
	}
	if strings.Contains(metrics, `caddy_kvroute_cluster_rejected_total{reason="auth"} 0`+"\n") {
		t.Error(`A's /metrics counts no auth rejections of D's messages`)
	}

	// NATS killed mid-run: no request fails, routing goes on what each replica knows; once NATS
	// is back, they hear each other again and new conversations alternate as before.
	ns.stop()
	for i, cv := range convs {
		cv.next(5)
		r := []*replica{a, b, c}[i%3]
		if _, code := r.chat(t, cv.msgs); code != http.StatusOK {
			t.Errorf("conversation %d with NATS down via %s: status %d", i, r.name, code)
		}
	}
	ns.start()
	eventually(t, 15*time.Second, "A, B and C reconnect and hear each other", func() bool {
		return a.livePeers() == 2 && b.livePeers() == 2 && c.livePeers() == 2
	})
	for i := 100; i < 104; i++ {
		cv := newConversation(i)
		cv.turn(t, a, []*replica{b, c}, fmt.Sprintf("after NATS restart, conversation %d turn 0", i))
		for turn, r := range []*replica{b, c, a} {
			cv.next(turn + 1)
			peers := []*replica{a, b, c}
			for j, p := range peers {
				if p == r {
					peers = append(peers[:j:j], peers[j+1:]...)
					break
				}
			}
			cv.turn(t, r, peers, fmt.Sprintf("after NATS restart, conversation %d turn %d", i, turn+1))
		}
	}
	// GET /kvroute/ shows what was heard twice (live and in a catch-up reply) and applied once.
	for _, r := range []*replica{a, b, c} {
		st := r.status().Cluster
		t.Logf("%s after the NATS restart: %d decisions and %d bindings applied, %d duplicates skipped, %d catch-up records",
			r.name, st.DecisionsReceived, st.BindingsReceived, st.Duplicates, st.SyncReceivedRecords)
	}
	if !strings.Contains(a.rawStatus(), `"duplicates":`) {
		t.Error("GET /kvroute/ has no cluster duplicates counter")
	}
}

// With telemetry off, load held on A counts on B: A holds requests on b0, its only upstream;
// B, which routes over b0 and b1, sends cold requests to b1 while they last.
func TestReplicasShareLoad(t *testing.T) {
	caddyBinary(t)
	ns := startNATS(t, nil)
	bs := newBackends(t, 2)
	a := startReplica(t, "A", bs[:1], ns.url(), replicaSecret)
	b := startReplica(t, "B", bs, ns.url(), replicaSecret)
	a.chat(t, []string{"warm up A"})
	b.chat(t, []string{"warm up B"})
	eventually(t, 10*time.Second, "A and B hear each other", func() bool { return a.livePeers() == 1 && b.livePeers() == 1 })

	hold := make(chan struct{})
	bs[0].mu.Lock()
	bs[0].hold = hold
	bs[0].mu.Unlock()
	const held = 8
	var wg sync.WaitGroup
	release := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(func() { release(); wg.Wait() }) // before the replicas stop, even on a failure
	for i := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got, code := a.chat(t, []string{fmt.Sprintf("held request %d", i)}); code != http.StatusOK || got != "b0" {
				t.Errorf("held request %d: %d from %q", i, code, got)
			}
		}()
	}
	eventually(t, 5*time.Second, "B sees A's held requests", func() bool {
		st := b.status()
		var load int64
		for _, p := range st.Cluster.Peers {
			load += p.Load
		}
		return load == held
	})
	for i := range 6 {
		if got, code := b.chat(t, []string{fmt.Sprintf("%x cold request %d on B", i*104729, i)}); code != http.StatusOK || got != "b1" {
			t.Errorf("cold request %d on B with %d held on b0 by A: %d from %q, want b1", i, held, code, got)
		}
	}
	release()
	wg.Wait()
	// Once A's requests end, B counts them no more.
	eventually(t, 5*time.Second, "B sees A's requests end", func() bool {
		for _, p := range b.status().Cluster.Peers {
			if p.Load != 0 {
				return false
			}
		}
		return true
	})
}
