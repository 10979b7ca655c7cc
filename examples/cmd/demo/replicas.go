package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/replay"
)

// -replicas N runs every policy behind N Caddy replicas and one front Caddy that spreads the
// requests over them round-robin, per request (as a cloud load balancer or a Kubernetes Service
// would), and kv_cache_aware three ways: one replica behind the same front, N replicas each
// alone, and N replicas sharing what they learn over NATS (`cluster`). The NATS server is the
// nats-server binary (-nats-server; ./xcaddy.sh demo installs it with go install): importing
// it would bring its requirements into this module. -nats-outage and -late-replica add a
// cluster run with a fault mid-run: NATS stopped for a while, or the last replica started late
// (late.go).

// expandReplicas returns the policies as -replicas runs them (a variant keeps its suffix, so
// that kv_cost and kv_thresholds stay apart in the tables); with outage, kv_cache_aware also
// runs with the cluster's NATS stopped mid-run, with late with its last replica started
// mid-run.
func expandReplicas(policies []policy, n int, outage, late bool) []policy {
	var out []policy
	for _, p := range policies {
		if p.Module == "kv_cache_aware" {
			one, alone, shared := p, p, p
			one.Replicas, one.Suffix = 1, p.Suffix+" ×1"
			alone.Replicas, alone.Suffix = n, fmt.Sprintf("%s ×%d", p.Suffix, n)
			shared.Replicas, shared.Cluster, shared.Suffix = n, true, fmt.Sprintf("%s ×%d +cluster", p.Suffix, n)
			one.Name, alone.Name, shared.Name = p.Name+"×1", fmt.Sprintf("%s×%d", p.Name, n), fmt.Sprintf("%s×%d+cluster", p.Name, n)
			out = append(out, one, alone, shared)
			if outage {
				down := shared
				down.Outage, down.Suffix, down.Name = true, fmt.Sprintf("%s ×%d +cluster, NATS down mid-run", p.Suffix, n), shared.Name+"+outage"
				out = append(out, down)
			}
			if late {
				l := shared
				l.Late, l.Suffix, l.Name = true, fmt.Sprintf("%s ×%d +cluster, last replica late", p.Suffix, n), shared.Name+"+late"
				out = append(out, l)
			}
			continue
		}
		p.Replicas, p.Suffix, p.Name = n, fmt.Sprintf("%s ×%d", p.Suffix, n), fmt.Sprintf("%s×%d", p.Name, n)
		out = append(out, p)
	}
	return out
}

// group is a front Caddy, its replicas and, with a cluster, their NATS server.
type group struct {
	front    *caddyProcess
	replicas []*caddyProcess
	admins   []int
	nats     *exec.Cmd
	natsDone chan struct{}
	natsBin  string
	natsPort int

	// -late-replica: the policy the replicas run (cluster line included) and the admin and
	// listen ports of the last replica, listed by the front but not started yet.
	policy    policy
	latePorts []int
}

// startGroup starts p's replicas (and NATS for a cluster), then the front.
func (b *bench) startGroup(ctx context.Context, p policy) (g *group, err error) {
	g = &group{}
	defer func() {
		if err != nil {
			g.Stop()
		}
	}()
	if p.Cluster {
		url, err := g.startNATS(b.cfg.natsServer)
		if err != nil {
			return nil, err
		}
		secret := make([]byte, 24)
		_, _ = rand.Read(secret)
		p.Block = append(p.Block[:len(p.Block):len(p.Block)], fmt.Sprintf("cluster %s {\n\t\t\t\tname demo\n\t\t\t\tsecret %s\n\t\t\t}", url, hex.EncodeToString(secret)))
	}
	g.policy = p
	var addrs []string
	for i := range p.Replicas {
		if p.Late && i == p.Replicas-1 {
			if g.latePorts, err = freePorts(2); err != nil {
				return nil, err
			}
			addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(g.latePorts[1]))
			break
		}
		c, admin, err := b.startCaddyPorts(ctx, p, nil)
		if err != nil {
			return nil, err
		}
		g.replicas = append(g.replicas, c)
		g.admins = append(g.admins, admin)
		addrs = append(addrs, strings.TrimPrefix(c.URL, "http://"))
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	front := site{AdminPort: ports[0], Port: ports[1], Upstreams: addrs, Policy: policy{Module: "round_robin"}, NoMatcher: true, Front: true, Retry: p.Late}
	if g.front, err = startCaddy(ctx, b.bin, front, b.cfg.verbose); err != nil {
		return nil, err
	}
	return g, nil
}

// startNATS runs the nats-server binary on a free loopback port and waits until it accepts
// connections.
func (g *group) startNATS(bin string) (string, error) {
	if bin == "" {
		return "", errors.New("-replicas with a cluster needs -nats-server (go install github.com/nats-io/nats-server/v2@v2.15.2)")
	}
	if g.natsPort == 0 {
		ports, err := freePorts(1)
		if err != nil {
			return "", err
		}
		g.natsBin, g.natsPort = bin, ports[0]
	}
	addr := "127.0.0.1:" + strconv.Itoa(g.natsPort)
	g.nats = exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(g.natsPort))
	g.natsDone = make(chan struct{})
	if err := g.nats.Start(); err != nil {
		g.nats = nil
		return "", fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() { _ = g.nats.Wait(); close(g.natsDone) }()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return "nats://" + addr, nil
		}
		select {
		case <-g.natsDone:
			return "", fmt.Errorf("%s exited at start", bin)
		default:
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%s not accepting on %s after 10s", bin, addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// clusterFigures are the replicas' cluster counters added up, read before they stop.
type clusterFigures struct {
	Decisions     uint64            `json:"decisions"` // decisions the replicas made
	Paths         map[string]uint64 `json:"paths"`     // by decision path
	SentBytes     uint64            `json:"sent_bytes"`
	Sent          uint64            `json:"sent_messages"`
	TextBytes     uint64            `json:"text_bytes"`
	WireTextBytes uint64            `json:"wire_text_bytes"`
	Dropped       uint64            `json:"dropped"`
	Rejected      uint64            `json:"rejected"`
	BytesPerDec   float64           `json:"bytes_per_decision"`
}

// clusterFigures reads every replica's GET /kvroute/.
func (g *group) clusterFigures() (clusterFigures, error) {
	f := clusterFigures{Paths: map[string]uint64{}}
	for _, port := range g.admins {
		resp, err := http.Get(fmt.Sprintf("http://localhost:%d/kvroute/", port))
		if err != nil {
			return f, err
		}
		var st struct {
			Upstreams map[string]struct {
				Decisions map[string]uint64 `json:"decisions"`
			} `json:"upstreams"`
			Cluster *struct {
				Sent              uint64 `json:"sent"`
				SentBytes         uint64 `json:"sent_bytes"`
				TextBytes         uint64 `json:"text_bytes"`
				WireTextBytes     uint64 `json:"wire_text_bytes"`
				DroppedQueue      uint64 `json:"dropped_queue"`
				DroppedPublish    uint64 `json:"dropped_publish"`
				DroppedSlow       uint64 `json:"dropped_slow"`
				DroppedFlood      uint64 `json:"dropped_flood"`
				RejectedAuth      uint64 `json:"rejected_auth"`
				RejectedReplay    uint64 `json:"rejected_replay"`
				RejectedStale     uint64 `json:"rejected_stale"`
				RejectedMalformed uint64 `json:"rejected_malformed"`
			} `json:"cluster"`
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			return f, fmt.Errorf("GET /kvroute/: %w", err)
		}
		for _, u := range st.Upstreams {
			for path, n := range u.Decisions {
				f.Decisions += n
				f.Paths[path] += n
			}
		}
		if c := st.Cluster; c != nil {
			f.Sent += c.Sent
			f.SentBytes += c.SentBytes
			f.TextBytes += c.TextBytes
			f.WireTextBytes += c.WireTextBytes
			f.Dropped += c.DroppedQueue + c.DroppedPublish + c.DroppedSlow + c.DroppedFlood
			f.Rejected += c.RejectedAuth + c.RejectedReplay + c.RejectedStale + c.RejectedMalformed
		}
	}
	if f.Decisions > 0 {
		f.BytesPerDec = float64(f.SentBytes) / float64(f.Decisions)
	}
	return f, nil
}

func (f clusterFigures) String() string {
	ratio := 0.0
	if f.WireTextBytes > 0 {
		ratio = float64(f.TextBytes) / float64(f.WireTextBytes)
	}
	if f.Sent == 0 {
		return fmt.Sprintf("replicas: %d decisions (session %d, prefix_hit %d, imbalance %d, fallback %d)",
			f.Decisions, f.Paths["session"], f.Paths["prefix_hit"], f.Paths["imbalance"], f.Paths["fallback"])
	}
	return fmt.Sprintf("cluster: %d decisions (session %d, prefix_hit %d, imbalance %d, fallback %d), %d messages, %.0f bytes published per decision (text compressed %.1f×), %d dropped, %d rejected",
		f.Decisions, f.Paths["session"], f.Paths["prefix_hit"], f.Paths["imbalance"], f.Paths["fallback"],
		f.Sent, f.BytesPerDec, ratio, f.Dropped, f.Rejected)
}

// Stop stops the front, the replicas and NATS.
func (g *group) Stop() error {
	var errs []error
	if g.front != nil {
		errs = append(errs, g.front.Stop())
	}
	for _, r := range g.replicas {
		errs = append(errs, r.Stop())
	}
	g.stopNATS()
	return errors.Join(errs...)
}

// stopNATS stops the NATS server, if one runs.
func (g *group) stopNATS() {
	if g.nats == nil {
		return
	}
	_ = g.nats.Process.Signal(os.Interrupt)
	select {
	case <-g.natsDone:
	case <-time.After(5 * time.Second):
		_ = g.nats.Process.Kill()
		<-g.natsDone
	}
	g.nats = nil
}

// outage stops NATS at `at` after the replay started and starts it again, on the same port,
// `length` later, unless ctx ends first.
func (g *group) outage(ctx context.Context, at, length time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
			return
		case <-time.After(at):
		}
		g.stopNATS()
		select {
		case <-ctx.Done():
		case <-time.After(length):
		}
		if _, err := g.startNATS(g.natsBin); err != nil {
			done <- err
		}
	}()
	return done
}

// windowHits returns the hit ratio of the requests sent before at, during the outage, and
// after it.
func windowHits(recs []replay.Record, at, length time.Duration) [3]float64 {
	var cached, prompt [3]float64
	a, b := float64(at.Milliseconds()), float64((at + length).Milliseconds())
	for _, r := range recs {
		w := 0
		if r.StartMs >= b {
			w = 2
		} else if r.StartMs >= a {
			w = 1
		}
		cached[w] += float64(r.CachedTokens)
		prompt[w] += float64(r.PromptTokens)
	}
	var out [3]float64
	for i := range out {
		if prompt[i] > 0 {
			out[i] = cached[i] / prompt[i]
		}
	}
	return out
}
