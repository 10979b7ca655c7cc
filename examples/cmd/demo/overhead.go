package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// overheadResult is the throughput of Caddy with kv_cache_aware and its matcher against
// round_robin without one, on an upstream that answers at once. A third config,
// round_robin behind the matcher, splits the cost between the matcher and the policy.
type overheadResult struct {
	Clients       int              `json:"clients"`
	BodyBytes     int              `json:"body_bytes"`
	SecondsPerRun float64          `json:"seconds_per_run"`
	Upstreams     int              `json:"upstreams"`
	Configs       []overheadConfig `json:"configs"`
	Ratio         float64          `json:"ratio"`         // kv_cache_aware + matcher / round_robin alone
	MatcherRatio  float64          `json:"matcher_ratio"` // round_robin + matcher / round_robin alone
	TargetRatio   float64          `json:"target_ratio"`
	Errors        int64            `json:"errors"`
}

// overheadConfig is one Caddy config of the overhead measurement and its requests/s.
type overheadConfig struct {
	Name      string    `json:"name"`
	Short     string    `json:"short"`
	PerSecond []float64 `json:"rps"` // one per round
	Mean      float64   `json:"rps_mean"`
	url       string
}

// measureOverhead starts four trivial upstreams and three Caddy instances in front of them
// (kv_cache_aware behind the llm_prompt matcher; round_robin behind the matcher; round_robin
// alone), then drives 4 KiB chat bodies through each with keep-alive clients for a fixed
// time, rotating which goes first in each round so that drift (CPU frequency, other load)
// cancels.
func measureOverhead(ctx context.Context, cfg *config, bin *caddyBinary) (*overheadResult, error) {
	ups, stop, err := startTrivialUpstreams(4)
	if err != nil {
		return nil, err
	}
	defer stop()
	rr := policy{Name: "round_robin", Module: "round_robin"}
	sites := []site{
		{Upstreams: ups, Policy: allPolicies(cfg.kvOptions)[0]},
		{Upstreams: ups, Policy: rr},
		{Upstreams: ups, Policy: rr, NoMatcher: true},
	}
	names := []string{
		"lb_policy kv_cache_aware + llm_prompt matcher",
		"lb_policy round_robin + llm_prompt matcher",
		"lb_policy round_robin, no matcher",
	}
	shorts := []string{"kv+matcher", "rr+matcher", "rr"}
	bodies := overheadBodies()
	res := &overheadResult{Clients: cfg.overheadClients, BodyBytes: len(bodies[0]),
		SecondsPerRun: cfg.overheadDuration.Seconds(), TargetRatio: 0.9, Upstreams: len(ups)}
	var procs []*caddyProcess
	defer func() {
		for _, p := range procs {
			p.Stop()
		}
	}()
	for i, s := range sites {
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		s.AdminPort, s.Port = ports[0], ports[1]
		p, err := startCaddy(ctx, bin, s, cfg.verbose)
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
		res.Configs = append(res.Configs, overheadConfig{Name: names[i], Short: shorts[i], url: p.URL})
	}

	fmt.Printf("Overhead: %d keep-alive clients, %d-byte chat bodies, %s per config per round, %d rounds\n",
		cfg.overheadClients, len(bodies[0]), cfg.overheadDuration, cfg.overheadRounds)
	for _, c := range res.Configs { // warm up: connections, trees, pools
		drive(ctx, c.url, bodies, cfg.overheadClients, time.Second)
	}
	n := len(res.Configs)
	for r := range cfg.overheadRounds {
		fmt.Printf("  round %d:", r+1)
		for k := range n {
			i := (r + k) % n
			if r%2 == 1 {
				i = (r + n - k) % n
			}
			c := &res.Configs[i]
			rps, errs := drive(ctx, c.url, bodies, cfg.overheadClients, cfg.overheadDuration)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			res.Errors += errs
			c.PerSecond = append(c.PerSecond, rps)
			fmt.Printf("  %s %.0f", c.Short, rps)
		}
		fmt.Println(" req/s")
	}
	for i := range res.Configs {
		res.Configs[i].Mean = mean(res.Configs[i].PerSecond)
	}
	if base := res.Configs[2].Mean; base > 0 {
		res.Ratio = res.Configs[0].Mean / base
		res.MatcherRatio = res.Configs[1].Mean / base
	}
	return res, nil
}

// printOverhead prints the overhead result.
func printOverhead(w io.Writer, r *overheadResult) {
	t := &table{header: []string{"Caddy config", "requests/s", "min-max over rounds"}}
	for _, c := range r.Configs {
		lo, hi := minMax(c.PerSecond)
		t.add(c.Name, fmt.Sprintf("%.0f", c.Mean), fmt.Sprintf("%.0f-%.0f", lo, hi))
	}
	t.write(w)
	verdict := "meets"
	if r.Ratio < r.TargetRatio {
		verdict = "misses"
	}
	fmt.Fprintf(w, "ratio kv_cache_aware + matcher / round_robin: %.3f (%s the target %.2f); matcher alone: %.3f; %d errors\n",
		r.Ratio, verdict, r.TargetRatio, r.MatcherRatio, r.Errors)
	fmt.Fprintln(w, "(the load generator, the upstreams and Caddy share this machine's cores)")
}

func minMax(xs []float64) (lo, hi float64) {
	s := newSpan(xs)
	return s.Min, s.Max
}

// overheadBodies returns distinct chat bodies of about 4 KiB: 8 shared system prompts of
// 3,000 chars and a user message of 950 chars each.
func overheadBodies() [][]byte {
	w := workload.ChatWorkload(workload.ChatConfig{
		Conversations: 1024, SystemPrompts: 8, Turns: 1,
		SystemChars: [2]int{3000, 3000}, UserChars: [2]int{950, 950}, ReplyChars: [2]int{64, 64},
		Seed: 42,
	})
	out := make([][]byte, 0, len(w.Sessions))
	for _, s := range w.Sessions {
		b, err := s.Calls[0].Body(false)
		if err != nil {
			panic(err) // plain strings always encode
		}
		out = append(out, b)
	}
	return out
}

// drive posts bodies to url/v1/chat/completions from clients goroutines for d and returns the
// successful requests per second and the number of failures.
func drive(ctx context.Context, base string, bodies [][]byte, clients int, d time.Duration) (float64, int64) {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: clients,
		MaxConnsPerHost:     clients,
		DisableCompression:  true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var ok, failed, next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				b := bodies[int(next.Add(1))%len(bodies)]
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(b))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ok.Add(1)
				} else {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return float64(ok.Load()) / time.Since(start).Seconds(), failed.Load()
}

// trivialReply is what the trivial upstream answers: a small chat completion.
const trivialReply = `{"id":"cmpl-0","object":"chat.completion","model":"llama-3.1-8b","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1024,"completion_tokens":1,"total_tokens":1025}}`

// startTrivialUpstreams serves n upstreams on loopback that read the body and answer
// trivialReply at once; stop closes them.
func startTrivialUpstreams(n int) (addrs []string, stop func(), err error) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, trivialReply)
	})
	var srvs []*http.Server
	stop = func() {
		for _, s := range srvs {
			s.Close()
		}
	}
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			stop()
			return nil, nil, err
		}
		s := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		go s.Serve(ln)
		srvs = append(srvs, s)
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, stop, nil
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
