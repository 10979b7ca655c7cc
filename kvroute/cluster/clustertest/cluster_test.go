package clustertest

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
	"github.com/nats-io/nats-server/v2/server"
)

func TestExchange(t *testing.T) {
	s := startNATS(t, nil)
	// c holds a silent peer's load for a minute: only a's goodbye can take it away in the
	// wait at the end.
	cfgC := config(s.url())
	cfgC.LoadTTL = time.Minute
	a, b, c := join(t, config(s.url())), join(t, config(s.url())), join(t, cfgC)
	connected(t, a, b, c)
	a.PublishDecision("llama", "10.0.0.1:8000", "system: be brief\nuser: hello")
	b.PublishDecision("qwen", "10.0.0.2:8000", strings.Repeat("long prompt ", 5000))
	a.PublishBinding("llama", a.SessionKey("conv-1"), "10.0.0.1:8000", time.Now())
	a.loads.set(map[string]int64{"10.0.0.1:8000": 3, "10.0.0.2:8000": 1})
	b.loads.set(map[string]int64{"10.0.0.1:8000": 2})
	a.LoadChanged()
	b.LoadChanged()

	for name, m := range map[string]*member{"b": b, "c": c} {
		eventually(t, 3*time.Second, name+" did not get a's decision and binding", func() bool {
			m.st.mu.Lock()
			defer m.st.mu.Unlock()
			for _, d := range m.st.decisions {
				if d == (decision{"llama", "10.0.0.1:8000", "system: be brief\nuser: hello"}) {
					return m.st.bindings["llama "+m.SessionKey("conv-1")] == "10.0.0.1:8000"
				}
			}
			return false
		})
	}
	eventually(t, 3*time.Second, "c did not get b's decision", func() bool {
		c.st.mu.Lock()
		defer c.st.mu.Unlock()
		for _, d := range c.st.decisions {
			if d.model == "qwen" && d.text == strings.Repeat("long prompt ", 5000) {
				return true
			}
		}
		return false
	})
	eventually(t, 3*time.Second, "c's peer load", func() bool { return c.PeerLoad("10.0.0.1:8000") == 5 && c.PeerLoad("10.0.0.2:8000") == 1 })
	eventually(t, 3*time.Second, "a's peer load (b's only)", func() bool { return a.PeerLoad("10.0.0.1:8000") == 2 })

	// Own messages never come back.
	if got := a.st.numDecisions(); got != 1 {
		t.Errorf("a applied %d decisions, want 1 (b's only)", got)
	}
	c.PublishForget(c.SessionKey("conv-1"))
	c.PublishReset()
	eventually(t, 3*time.Second, "forget and reset", func() bool {
		a.st.mu.Lock()
		defer a.st.mu.Unlock()
		return len(a.st.forgets) == 1 && a.st.forgets[0] == a.SessionKey("conv-1") && a.st.resets == 1
	})
	st := b.Stats()
	if len(st.Peers) != 2 || st.Rejected() != 0 || st.Dropped() != 0 || st.Sent == 0 || st.CompressionRatio() < 10 {
		t.Errorf("b's stats: %+v", st)
	}
	// Closing tells peers at once that its load is gone: c would hold it for its minute-long
	// load_ttl otherwise.
	a.Close()
	eventually(t, 10*time.Second, "a's load gone from c after a closed", func() bool { return c.PeerLoad("10.0.0.1:8000") == 2 })
}

func TestWrongSecret(t *testing.T) {
	s := startNATS(t, nil)
	a := join(t, config(s.url()))
	bad := config(s.url())
	bad.Secret = "not-the-fleet-secret-at-all"
	x := join(t, bad)
	connected(t, a, x)
	for i := 0; i < 20; i++ {
		x.PublishDecision("llama", "10.0.0.9:8000", fmt.Sprintf("poison %d", i))
		x.PublishBinding("llama", a.SessionKey("victim"), "10.0.0.9:8000", time.Now())
	}
	x.PublishReset()
	x.loads.set(map[string]int64{"10.0.0.1:8000": 1000})
	x.LoadChanged()
	eventually(t, 3*time.Second, "rejected count", func() bool { return a.Stats().RejectedAuth > 0 })
	time.Sleep(200 * time.Millisecond)
	a.st.mu.Lock()
	defer a.st.mu.Unlock()
	if len(a.st.decisions) != 0 || len(a.st.bindings) != 0 || a.st.resets != 0 || a.PeerLoad("10.0.0.1:8000") != 0 || len(a.Stats().Peers) != 0 {
		t.Errorf("wrong secret changed something: %d decisions, %d bindings, %d resets, load %d", len(a.st.decisions), len(a.st.bindings), a.st.resets, a.PeerLoad("10.0.0.1:8000"))
	}
}

// TestOpenWithoutNATS: Open returns at once with no server, the node serves alone, and joins
// when the server appears; its peer catches up with what it decided meanwhile.
func TestOpenWithoutNATS(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	start := time.Now()
	a := join(t, config(url))
	// Waiting for NATS would take nats.go's connect timeout (2 s) or for ever; 1 s leaves a
	// loaded machine room.
	if d := time.Since(start); d > time.Second {
		t.Errorf("Open took %v with NATS down", d)
	}
	for i := 0; i < 50; i++ {
		begin := time.Now()
		a.PublishDecision("m", "u1", fmt.Sprintf("decided alone %d", i))
		if d := time.Since(begin); d > 250*time.Millisecond {
			t.Fatalf("PublishDecision took %v with NATS down", d)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if a.Stats().Connected {
		t.Fatal("connected to nothing")
	}
	startNATS(t, func(o *server.Options) { o.Port = port })
	b := join(t, config(url))
	connected(t, a, b)
	eventually(t, 5*time.Second, "b did not catch up with what a decided before NATS was there", func() bool { return b.st.numDecisions() == 50 })
}

func TestNATSRestart(t *testing.T) {
	s := startNATS(t, nil)
	a, b := join(t, config(s.url())), join(t, config(s.url()))
	connected(t, a, b)
	a.PublishDecision("m", "u1", "before")
	eventually(t, 3*time.Second, "before", func() bool { return b.st.numDecisions() == 1 })

	s.stop()
	eventually(t, 3*time.Second, "a still connected", func() bool { return !a.Stats().Connected })
	var slowest time.Duration
	for i := 0; i < 2000; i++ {
		begin := time.Now()
		a.PublishDecision("m", "u1", fmt.Sprintf("during outage %d %s", i, strings.Repeat("x", 500)))
		slowest = max(slowest, time.Since(begin))
	}
	// Blocking on NATS would take a reconnect wait (500ms); this bound leaves room for a
	// scheduler or GC pause on a busy machine.
	if slowest > 250*time.Millisecond {
		t.Errorf("slowest PublishDecision during the outage: %v", slowest)
	}
	s.start()
	connected(t, a, b)
	a.PublishDecision("m", "u1", "after")
	// What a decided during the outage reaches b, from nats.go's reconnect buffer or a's
	// catch-up log; the test only needs all of it, at least once.
	eventually(t, 10*time.Second, "b did not get the outage's and the later decisions", func() bool {
		b.st.mu.Lock()
		defer b.st.mu.Unlock()
		seen := map[string]bool{}
		for _, d := range b.st.decisions {
			seen[d.text] = true
		}
		// Publishing never blocks: a flusher starved by a loaded machine drops from a full
		// queue (counted) rather than wait, and those decisions are lost by design.
		st := a.Stats()
		return len(seen) == 2002-int(st.DroppedQueue+st.DroppedPublish)
	})
	if st := a.Stats(); st.DroppedQueue+st.DroppedPublish > 200 {
		t.Errorf("%d of 2,000 decisions dropped during the outage", st.DroppedQueue+st.DroppedPublish)
	}
	// ... and at most once: b hears the outage's batches live (nats.go's reconnect buffer) and
	// in a's reply to the catch-up request it sent on reconnecting, which covers the same
	// messages. Let any late reply land first.
	time.Sleep(500 * time.Millisecond)
	distinct, twice := b.st.applied()
	bs := b.Stats()
	t.Logf("b: %d decisions applied, %d distinct, %d duplicates skipped, %d catch-up records", bs.DecisionsReceived, distinct, bs.Duplicates, bs.SyncReceivedRecords)
	if twice != 0 {
		t.Errorf("%d decisions applied twice after the NATS restart", twice)
	}
	if a.Stats().Disconnects == 0 {
		t.Error("no disconnect counted")
	}
}

func TestLateJoiner(t *testing.T) {
	s := startNATS(t, nil)
	a, b := join(t, config(s.url())), join(t, config(s.url()))
	connected(t, a, b)
	for i := 0; i < 300; i++ {
		a.PublishDecision("m", "u1", fmt.Sprintf("a's conversation %d", i))
		b.PublishDecision("m", "u2", fmt.Sprintf("b's conversation %d", i))
	}
	a.PublishBinding("m", a.SessionKey("s1"), "u1", time.Now())
	a.PublishBinding("m", a.SessionKey("s1"), "u3", time.Now()) // the newer binding is the one replayed
	b.PublishBinding("m", b.SessionKey("s2"), "u2", time.Now())
	b.PublishBinding("m", b.SessionKey("s3"), "u2", time.Now())
	b.PublishForget(b.SessionKey("s3"))
	eventually(t, 3*time.Second, "a and b exchanged", func() bool { return a.st.numDecisions() == 300 && b.st.numDecisions() == 300 })

	start := time.Now()
	c := join(t, config(s.url()))
	eventually(t, 5*time.Second, "late joiner did not catch up", func() bool { return c.st.numDecisions() == 600 })
	t.Logf("late joiner caught up with 600 decisions in %v", time.Since(start))
	c.st.mu.Lock()
	defer c.st.mu.Unlock()
	want := map[string]string{"m " + c.SessionKey("s1"): "u3", "m " + c.SessionKey("s2"): "u2"}
	if fmt.Sprint(c.st.bindings) != fmt.Sprint(want) {
		t.Errorf("late joiner's bindings %v, want %v", c.st.bindings, want)
	}
}

func TestSilentPeerExpires(t *testing.T) {
	s := startNATS(t, nil)
	p := startProxy(t, fmt.Sprintf("127.0.0.1:%d", s.opts.Port))
	a, b := join(t, config(p.url())), join(t, config(s.url()))
	connected(t, a, b)
	a.loads.set(map[string]int64{"u1": 7})
	a.LoadChanged()
	eventually(t, 2*time.Second, "b sees a's load", func() bool { return b.PeerLoad("u1") == 7 })
	p.paused.Store(true)
	paused := time.Now()
	// load_ttl is 300ms in these tests; the janitor runs every load_interval (50ms).
	eventually(t, time.Second, "a's load still counts while a is silent", func() bool { return b.PeerLoad("u1") == 0 })
	if d := time.Since(paused); d < 250*time.Millisecond {
		t.Errorf("a's load expired after %v, before load_ttl", d)
	}
	if st := b.Stats(); len(st.Peers) != 1 || st.Peers[0].Live {
		t.Errorf("b's view of a: %+v", st.Peers)
	}
	p.paused.Store(false)
	eventually(t, 2*time.Second, "a's load back after it speaks again", func() bool { return b.PeerLoad("u1") == 7 })
}

func TestOversizedText(t *testing.T) {
	s := startNATS(t, func(o *server.Options) { o.MaxPayload = 16 << 10 })
	a, b := join(t, config(s.url())), join(t, config(s.url()))
	connected(t, a, b)
	// Random text does not compress: 200 KB must cross a 16 KB max_payload in fragments.
	raw := make([]byte, 150<<10)
	rand.Read(raw)
	text := base64.StdEncoding.EncodeToString(raw)
	a.PublishDecision("m", "u1", "small one first")
	a.PublishDecision("m", "u1", text)
	a.PublishDecision("m", "u1", "small one after")
	eventually(t, 5*time.Second, "fragments not reassembled", func() bool { return b.st.numDecisions() == 3 })
	b.st.mu.Lock()
	defer b.st.mu.Unlock()
	if b.st.decisions[1].text != text || b.st.decisions[2].text != "small one after" {
		t.Errorf("reassembled text differs (%d bytes, want %d)", len(b.st.decisions[1].text), len(text))
	}
	if a.Stats().Fragmented != 1 || a.Stats().DroppedPublish != 0 {
		t.Errorf("a's stats: %+v", a.Stats())
	}
}

func TestQueueFull(t *testing.T) {
	s := startNATS(t, nil)
	cfg := config(s.url())
	cfg.QueueLen = 16
	a, b := join(t, cfg), join(t, config(s.url()))
	connected(t, a, b)
	text := strings.Repeat("a prompt of some size ", 2000)
	const n = 20000
	begin := time.Now()
	for i := 0; i < n; i++ {
		a.PublishDecision("m", "u1", text)
	}
	perCall := time.Since(begin) / n
	st := a.Stats()
	if st.DroppedQueue == 0 {
		t.Fatal("no drop counted with a 16-item queue and 20,000 decisions in a loop")
	}
	if perCall > 20*time.Microsecond {
		t.Errorf("PublishDecision took %v per call with a full queue", perCall)
	}
	eventually(t, 5*time.Second, "b got what was not dropped", func() bool { return uint64(b.st.numDecisions()) == n-a.Stats().DroppedQueue })
}

func TestCloseLeavesNoGoroutine(t *testing.T) {
	s := startNATS(t, nil)
	before := runtime.NumGoroutine()
	for _, url := range []string{s.url(), "nats://127.0.0.1:1"} {
		n, err := cluster.Open(config(url), newState(), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		n.PublishDecision("m", "u", "x")
		time.Sleep(100 * time.Millisecond)
		n.Close()
		n.Close() // twice is fine
	}
	eventually(t, 3*time.Second, fmt.Sprintf("goroutines: %d before, more after Close", before), func() bool { return runtime.NumGoroutine() <= before })
}

func TestOpenRejectsBadConfig(t *testing.T) {
	c := config("nats://127.0.0.1:4222")
	c.Secret = "short"
	if _, err := cluster.Open(c, newState(), nil, nil); err == nil || !strings.Contains(err.Error(), "secret") {
		t.Errorf("short secret: %v", err)
	}
	c = config("nats://127.0.0.1:4222")
	c.Creds = "/nonexistent/nats.creds"
	if _, err := cluster.Open(c, newState(), nil, nil); err == nil || !strings.Contains(err.Error(), "creds") {
		t.Errorf("missing creds file: %v", err)
	}
}
