package clustertest

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
)

const secret = "integration-test-secret-0123456789"

// state is a Handler that keeps what peers told it, as the lead's state would.
type state struct {
	mu        sync.Mutex
	decisions []decision
	bindings  map[string]string    // model + " " + session key → upstream
	boundAt   map[string]time.Time // and when it was made
	forgets   []string
	resets    int
}

type decision struct{ model, upstream, text string }

// applied returns how many distinct decision texts the state holds and how many of its
// decisions repeat one.
func (s *state) applied() (distinct, twice int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	count := map[string]int{}
	for _, d := range s.decisions {
		count[d.text]++
	}
	for _, c := range count {
		twice += c - 1
	}
	return len(count), twice
}

func newState() *state {
	return &state{bindings: map[string]string{}, boundAt: map[string]time.Time{}}
}

func (s *state) Decision(model, upstream, text string) {
	s.mu.Lock()
	s.decisions = append(s.decisions, decision{model, upstream, text})
	s.mu.Unlock()
}

// Binding keeps the newest binding of a session, as the session store does.
func (s *state) Binding(model, sk, upstream string, at time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := model + " " + sk
	if held, ok := s.bindings[k]; !ok || cluster.BindingNewer(at, upstream, s.boundAt[k], held) {
		s.bindings[k], s.boundAt[k] = upstream, at
		return true
	}
	return false
}
func (s *state) Forget(sk string) {
	s.mu.Lock()
	s.forgets = append(s.forgets, sk)
	s.mu.Unlock()
}
func (s *state) Reset() {
	s.mu.Lock()
	s.resets++
	s.mu.Unlock()
}

func (s *state) numDecisions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.decisions)
}

// loads is a LoadSource the test sets.
type loads struct {
	mu sync.Mutex
	m  map[string]int64
}

func (l *loads) set(m map[string]int64) {
	l.mu.Lock()
	l.m = m
	l.mu.Unlock()
}

func (l *loads) get() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m
}

type member struct {
	*cluster.Node
	st    *state
	loads *loads
}

func config(urls ...string) cluster.Config {
	return cluster.Config{URLs: urls, Name: "fleet-t", Secret: secret,
		LoadInterval: 50 * time.Millisecond, LoadTTL: 300 * time.Millisecond}
}

func join(t testing.TB, cfg cluster.Config) *member {
	t.Helper()
	m := &member{st: newState(), loads: &loads{}}
	n, err := cluster.Open(cfg, m.st, m.loads.get, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.Node = n
	t.Cleanup(func() { n.Close() })
	return m
}

// eventually polls cond every 10ms until it holds. d is how long that may take on an idle
// machine; it waits at least 10 s, since under -race on a loaded machine a message or a timer
// can take seconds, and only a failing test waits that long. A bound that a test asserts is
// checked apart (a measured time, or a TTL far beyond the wait).
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	d = max(d, 10*time.Second)
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func connected(t testing.TB, ms ...*member) {
	t.Helper()
	for i, m := range ms {
		eventually(t, 5*time.Second, fmt.Sprintf("member %d not connected", i), func() bool { return m.Stats().Connected })
	}
}

// proxy forwards TCP to a NATS server; pause stops forwarding without closing, so that the
// client behind it goes silent as a frozen or partitioned replica would.
type proxy struct {
	ln     net.Listener
	target string
	paused atomic.Bool
	// upDelay holds what the client sends for this long (nanoseconds) before forwarding it.
	upDelay atomic.Int64
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func startProxy(t testing.TB, target string) *proxy { return startProxyOn(t, "127.0.0.1:0", target) }

// startProxyOn is startProxy listening on addr.
func startProxyOn(t testing.TB, addr, target string) *proxy {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go p.pipe(c, s, false)
			go p.pipe(s, c, true)
		}
	}()
	t.Cleanup(p.close)
	return p
}

// pipe copies src to dst; up is the client-to-server direction, which upDelay slows.
func (p *proxy) pipe(dst, src net.Conn, up bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for p.paused.Load() {
			time.Sleep(5 * time.Millisecond)
		}
		if d := time.Duration(p.upDelay.Load()); up && d > 0 {
			time.Sleep(d)
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				dst.Close()
			}
			return
		}
	}
}

func (p *proxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *proxy) close() {
	p.paused.Store(false)
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// cut closes the connections through the proxy, as a network blip would; the listener stays,
// so that clients reconnect through it.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
