package kvroute

// Dynamic upstreams end to end: Caddy's `dynamic a`, `dynamic srv` and `dynamic multi` upstream
// sources ask a DNS server on loopback (the test's) for the engines, whose answers change mid-run. A new
// engine gets a reader and cold traffic at once; one that left gets no more requests, and
// after the grace period (the dynamic TTL) its reader, its share of the trees and its sessions
// are gone; names that churn leave nothing behind. Engines listen on 127.0.0.x (Linux routes
// all of 127.0.0.0/8 to loopback).

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// dnsServer answers A and SRV queries from tables the test changes.
type dnsServer struct {
	addr string

	mu      sync.Mutex
	a       map[string][]string // lowercase FQDN → IPv4 addresses
	srv     map[string][]string // lowercase FQDN → "target:port"
	queries map[string]int      // lowercase FQDN → queries answered: a change is seen once one came after it
}

func newDNSServer(t *testing.T) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dnsServer{addr: pc.LocalAddr().String(), a: map[string][]string{}, srv: map[string][]string{}, queries: map[string]int{}}
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(d.serve), NotifyStartedFunc: func() { close(started) }}
	go func() { _ = srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { _ = srv.Shutdown() })
	return d
}

func (d *dnsServer) serve(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	d.mu.Lock()
	for _, q := range req.Question {
		name := strings.ToLower(q.Name)
		d.queries[name]++
		hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 0}
		switch q.Qtype {
		case dns.TypeA:
			hdr.Rrtype = dns.TypeA
			for _, ip := range d.a[name] {
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.ParseIP(ip).To4()})
			}
		case dns.TypeSRV:
			hdr.Rrtype = dns.TypeSRV
			for _, tp := range d.srv[name] {
				target, port, _ := net.SplitHostPort(tp)
				p, _ := strconv.Atoi(port)
				m.Answer = append(m.Answer, &dns.SRV{Hdr: hdr, Priority: 1, Weight: 1, Port: uint16(p), Target: dns.Fqdn(target)})
			}
		}
	}
	d.mu.Unlock()
	_ = w.WriteMsg(m)
}

func (d *dnsServer) setA(name string, ips ...string) {
	d.mu.Lock()
	d.a[dns.Fqdn(name)] = ips
	d.mu.Unlock()
}

func (d *dnsServer) setSRV(name string, targets ...string) {
	d.mu.Lock()
	d.srv[dns.Fqdn(name)] = targets
	d.mu.Unlock()
}

// seen returns once Caddy's upstream source holds the answers in force: two queries came
// after the change (the first may have been under way). Caddy looks its dynamic upstreams up
// when a request needs them: GET /health through the site's catch-all reverse_proxy, which
// shares the policy's source (one cache entry per name), makes it look.
func (d *dnsServer) seen(t *testing.T, client *http.Client, name string) {
	t.Helper()
	count := func() int {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.queries[dns.Fqdn(strings.ToLower(name))]
	}
	n := count()
	waitUntil(t, 10*time.Second, func() bool {
		if resp, err := client.Get(baseURL + "/health"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return count() >= n+2
	}, "two DNS queries of "+name+" after the change")
}

// dynamicConfig is a site whose LLM requests go to the upstreams a dynamic source names.
func dynamicConfig(source string) string {
	return fmt.Sprintf(`{
	admin `+adminAddr+`
	http_port %d
	https_port `+httpsPort+`
	grace_period 1s
}
localhost:%d {
	@llm llm_prompt
	reverse_proxy @llm {
		%s
		lb_policy kv_cache_aware {
			eviction_interval 1s
			telemetry {
				interval 100ms
				timeout 100ms
			}
		}
	}
	reverse_proxy {
		%s
	}
}
`, httpPort, httpPort, source, source)
}

// engineOn starts an engine on ip at port (0: any), and returns it and its port.
func engineOn(t *testing.T, name, ip string, port int) (*engine, int) {
	t.Helper()
	e := newEngineAt(t, name, net.JoinHostPort(ip, strconv.Itoa(port)), 1000)
	_, p, _ := net.SplitHostPort(e.addr())
	n, _ := strconv.Atoi(p)
	return e, n
}

// anyOf reports whether the state holds anything of addr: its state, a reader, a share of a
// tree, a session binding.
func anyOf(s *state, addr string) (what string, ok bool) {
	switch {
	case known(s, addr):
		return "state", true
	case s.tel.current.Load() != nil && s.tel.current.Load().Snapshot(addr) != nil:
		return "reader", true
	case s.forest.TenantChars(addr) > 0:
		return "tree chars", true
	case s.sessions.perUpstream()[addr] > 0:
		return "sessions", true
	}
	return "", false
}

func TestDynamicUpstreamsGrowAndShrink(t *testing.T) {
	for _, kind := range []string{"a", "srv", "multi"} {
		t.Run(kind, func(t *testing.T) {
			leakCheck(t)
			shortDynamicTTL(t, 2*time.Second) // the grace period
			d := newDNSServer(t)
			e2, port := engineOn(t, "e2", "127.0.0.2", 0)
			e3, _ := engineOn(t, "e3", "127.0.0.3", port)
			e4, _ := engineOn(t, "e4", "127.0.0.4", port)
			name := "fleet-" + kind + ".test"
			// dial is the upstream's dial address: IP:port from A records; from SRV records
			// the target's name and port, which the transport (and the readers) resolve
			// with the proxy's resolvers, as on Kubernetes with a headless Service.
			dial := func(e *engine) string {
				if kind != "srv" {
					return e.addr()
				}
				return fmt.Sprintf("%s.%s.:%d", e.name, name, port) // Caddy keeps the SRV target's final dot
			}
			for _, e := range []*engine{e2, e3, e4} {
				ip, _, _ := net.SplitHostPort(e.addr())
				d.setA(e.name+"."+name, ip)
			}
			watched := name
			if kind == "srv" {
				watched = "_llm._tcp." + name
			}
			var source string
			set := func(engines ...*engine) {
				var ips, targets []string
				for _, e := range engines {
					ip, _, _ := net.SplitHostPort(e.addr())
					ips = append(ips, ip)
					targets = append(targets, fmt.Sprintf("%s.%s:%d", e.name, name, port))
				}
				if kind != "srv" {
					d.setA(name, ips...)
				} else {
					d.setSRV("_llm._tcp."+name, targets...)
				}
			}
			switch kind {
			case "a":
				source = fmt.Sprintf("dynamic a %s %d {\n\t\t\tresolvers %s\n\t\t\trefresh 50ms\n\t\t\tversions ipv4\n\t\t}", name, port, d.addr)
			case "multi":
				// dynamic multi with one A source: the upstreams reach the policy through
				// Caddy's MultiUpstreams, the same addresses as from dynamic a.
				source = fmt.Sprintf("dynamic multi {\n\t\t\ta %s %d {\n\t\t\t\tresolvers %s\n\t\t\t\trefresh 50ms\n\t\t\t\tversions ipv4\n\t\t\t}\n\t\t}", name, port, d.addr)
			default:
				source = fmt.Sprintf("dynamic srv _llm._tcp.%s {\n\t\t\tresolvers %s\n\t\t\trefresh 50ms\n\t\t}\n\t\ttransport http {\n\t\t\tresolvers %s\n\t\t}", name, d.addr, d.addr)
			}
			set(e2, e3)
			startCaddy(t, dynamicConfig(source))
			client := newClient(t, 10*time.Second)
			d.seen(t, client, watched)
			s := currentState()

			// Conversations spread over e2 and e3, each bound to its upstream.
			const convs = 8
			turn := func(i, n int) string {
				rep, resp := send(t, client, baseURL+"/v1/chat/completions",
					chatBody("m", strings.Repeat(fmt.Sprintf("System prompt of conversation %d. ", i), 10), fmt.Sprintf("turn %d", n)),
					"X-Session-ID", fmt.Sprintf("conv-%d", i))
				if resp.StatusCode != 200 {
					t.Fatalf("conversation %d turn %d: status %d", i, n, resp.StatusCode)
				}
				return rep.Upstream
			}
			for i := range convs {
				turn(i, 0)
			}
			if e2.hits.Load() == 0 || e3.hits.Load() == 0 {
				t.Fatalf("conversations went to e2 %d, e3 %d times: want both", e2.hits.Load(), e3.hits.Load())
			}
			cold := 2000
			traffic := func() {
				cold++
				if _, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("m", coldPrompt(cold))); resp.StatusCode != 200 {
					t.Fatalf("status %d", resp.StatusCode)
				}
			}
			defer func() {
				if t.Failed() {
					for a, us := range getStatus(t).Upstreams {
						t.Logf("%s: telemetry %+v", a, us.Telemetry)
					}
				}
			}()
			waitUntil(t, 10*time.Second, func() bool {
				traffic()
				ts2, ts3 := upstreamStatus(t, dial(e2)).Telemetry, upstreamStatus(t, dial(e3)).Telemetry
				return ts2 != nil && ts2.ReadAt != nil && ts3 != nil && ts3.ReadAt != nil
			}, "readers of e2 and e3")
			if t.Failed() {
				return
			}

			// Grow: e4 gets a reader and cold traffic at once.
			set(e2, e3, e4)
			d.seen(t, client, watched)
			got := servedBy(t, client, "m", 30, 1000)
			if got["e4"] == 0 {
				t.Errorf("the new engine got none of 30 cold requests: %v", got)
			}
			waitUntil(t, 5*time.Second, func() bool {
				ts := upstreamStatus(t, dial(e4)).Telemetry
				return ts != nil && ts.ReadAt != nil
			}, "a reading of the new engine")

			// Shrink: e2 leaves. Its conversations move, and nothing reaches it.
			set(e3, e4)
			d.seen(t, client, watched)
			hits := e2.hits.Load()
			for i := range convs {
				if up := turn(i, 1); up == "e2" {
					t.Errorf("conversation %d went to e2, which DNS no longer names", i)
				}
			}
			if n := e2.hits.Load() - hits; n != 0 {
				t.Errorf("e2 got %d requests after it left", n)
			}
			// After the grace period, e2 is forgotten: reader, trees, sessions, state. Traffic
			// goes on meanwhile: a dynamic upstream stays known while decisions see it in
			// their pool (with no traffic at all, every dynamic upstream ages out alike).
			waitUntil(t, 15*time.Second, func() bool { traffic(); _, ok := anyOf(s, dial(e2)); return !ok }, "e2 forgotten")
			scrapes, others := e2.scrapes.Load(), e3.scrapes.Load()
			waitUntil(t, 5*time.Second, func() bool { traffic(); return e3.scrapes.Load() >= others+5 }, "five more reads of e3")
			if n := e2.scrapes.Load() - scrapes; n > 1 { // one may have been under way
				t.Errorf("e2's reader read %d more times after it was forgotten", n)
			}
			// The engines still named keep theirs.
			for _, e := range []*engine{e3, e4} {
				if what, ok := anyOf(s, dial(e)); !ok {
					t.Errorf("%s forgotten (%s), yet DNS names it", e.name, what)
				}
			}
		})
	}
}

// Names that churn (an autoscaler, rolling restarts) leave nothing behind: at any time the
// state holds only the upstreams DNS named within the grace period (plus an eviction pass),
// and once the churn stops, only the current ones.
func TestDynamicUpstreamNameChurnBounded(t *testing.T) {
	leakCheck(t)
	const grace = time.Second
	shortDynamicTTL(t, grace)
	d := newDNSServer(t)
	first, port := engineOn(t, "c0", "127.0.0.10", 0)
	engines := []*engine{first}
	for i := 1; i < 30; i++ {
		e, _ := engineOn(t, fmt.Sprintf("c%d", i), fmt.Sprintf("127.0.0.%d", 10+i), port)
		engines = append(engines, e)
	}
	name := "fleet-churn.test"
	// lastNamed is when Caddy last held each name: a name given up is held until the change
	// is seen (seen returns).
	lastNamed := map[string]time.Time{}
	var current []string
	var client *http.Client
	set := func(i int) {
		a, b := engines[i%len(engines)], engines[(i+1)%len(engines)]
		ipA, _, _ := net.SplitHostPort(a.addr())
		ipB, _, _ := net.SplitHostPort(b.addr())
		d.setA(name, ipA, ipB)
		if client != nil {
			d.seen(t, client, name)
		}
		now := time.Now()
		for _, addr := range append(current, a.addr(), b.addr()) {
			lastNamed[addr] = now
		}
		current = []string{a.addr(), b.addr()}
	}
	set(0)
	startCaddy(t, dynamicConfig(fmt.Sprintf("dynamic a %s %d {\n\t\t\tresolvers %s\n\t\t\trefresh 50ms\n\t\t\tversions ipv4\n\t\t}", name, port, d.addr)))
	client = newClient(t, 10*time.Second)
	set(0)
	s := currentState()
	held := func() (n int) {
		for _, e := range engines {
			if _, ok := anyOf(s, e.addr()); ok {
				n++
			}
		}
		return n
	}
	// The bound: names Caddy held within the grace period, plus an eviction interval for the
	// pass to come, plus two seconds of slack for a loaded machine.
	window := grace + time.Second + 2*time.Second
	maxHeld, maxAllowed := 0, 0
	for step := 0; step < 2*len(engines); step++ {
		set(step)
		for i := range 3 {
			rep, resp := send(t, client, baseURL+"/v1/chat/completions",
				chatBody("m", coldPrompt(step*10+i)), "X-Session-ID", fmt.Sprintf("s-%d-%d", step, i))
			if resp.StatusCode != 200 {
				t.Fatalf("step %d: status %d from %q", step, resp.StatusCode, rep.Upstream)
			}
		}
		allowed := 0
		for _, at := range lastNamed {
			if time.Since(at) <= window {
				allowed++
			}
		}
		n := held()
		maxHeld, maxAllowed = max(maxHeld, n), max(maxAllowed, allowed)
		if n > allowed {
			t.Errorf("step %d: the state holds %d upstreams, DNS named %d within %v", step, n, allowed, window)
		}
	}
	t.Logf("churned through %d names: at most %d held at once (bound %d)", len(engines), maxHeld, maxAllowed)
	waitUntil(t, 15*time.Second, func() bool { return held() <= 2 }, "only the two current upstreams held")
	if n := s.tel.nDynamic.Load(); n > 2 {
		t.Errorf("%d dynamic readers counted, want at most 2", n)
	}
}
