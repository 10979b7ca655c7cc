// Command fleetbench measures what reading the fleet from the engines buys (issue 24), on
// llm-d-inference-sim processes:
//
//   - lora: 4 engines serving one base model and N LoRA adapters with --max-loras M; per-adapter
//     conversations through Caddy; per policy: adapter switches (a request sent to an engine
//     where its adapter was not among the last M adapters that engine ran, counted alike for
//     every policy from the X-Upstream header Caddy adds), the engines' own prefix-cache hit
//     ratio and the p50/p99 time to first token.
//   - mixed: 4 engines, two serving model A and two model B, no annotations; per policy: the
//     requests answered 404 because they reached an engine that does not serve their model,
//     after a warm-up that lets the readers read the lists.
//
// Each Caddy binary is named with -caddy name=path; a policy runs as name:policy. Runs are
// interleaved, -repeats times, and reported as median [min-max].
//
//	go run ./examples/cmd/fleetbench -caddy new=./caddy -caddy old=/path/to/old/caddy \
//	    -runs new:kv_cache_aware,old:kv_cache_aware,new:round_robin -repeats 5
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

type caddyFlags map[string]string

func (c caddyFlags) String() string { return fmt.Sprint(map[string]string(c)) }
func (c caddyFlags) Set(v string) error {
	name, path, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("want name=path, got %q", v)
	}
	c[name] = path
	return nil
}

var (
	caddies       = caddyFlags{}
	simBin        = flag.String("sim", "examples/llmdsim/bin/llm-d-inference-sim", "llm-d-inference-sim binary")
	runsFlag      = flag.String("runs", "new:kv_cache_aware,new:round_robin", "comma list of caddy:policy")
	repeats       = flag.Int("repeats", 3, "repeats of each run (interleaved)")
	scenario      = flag.String("scenario", "lora", "lora or mixed")
	loras         = flag.Int("loras", 8, "lora: adapters")
	maxLoras      = flag.Int("max-loras", 2, "lora: --max-loras of each engine")
	conversations = flag.Int("conversations", 64, "conversations")
	turns         = flag.Int("turns", 4, "turns per conversation")
	concurrency   = flag.Int("concurrency", 16, "concurrent clients")
)

func main() {
	flag.Var(caddies, "caddy", "name=path of a Caddy binary with kvroute (repeatable)")
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fleetbench:", err)
		os.Exit(1)
	}
}

type result struct {
	switches, requests, notServed, failed int
	hitRatio                              float64
	ttft                                  []time.Duration
}

func run() error {
	runs := strings.Split(*runsFlag, ",")
	all := map[string][]result{}
	for rep := range *repeats {
		order := slices.Clone(runs)
		if rep%2 == 1 {
			slices.Reverse(order)
		}
		for _, r := range order {
			res, err := once(r, rep)
			if err != nil {
				return fmt.Errorf("%s: %w", r, err)
			}
			all[r] = append(all[r], res)
			fmt.Fprintf(os.Stderr, "%s #%d: %s\n", r, rep, res.line())
		}
	}
	fmt.Printf("scenario %s, %d repeats, median [min-max]\n", *scenario, *repeats)
	for _, r := range runs {
		rs := all[r]
		fmt.Printf("%-24s switches %s  not-served %s  failed %s  hit %s  p50 TTFT %s ms  p99 TTFT %s ms\n", r,
			stat(rs, func(x result) float64 { return float64(x.switches) }, 0),
			stat(rs, func(x result) float64 { return float64(x.notServed) }, 0),
			stat(rs, func(x result) float64 { return float64(x.failed) }, 0),
			stat(rs, func(x result) float64 { return x.hitRatio }, 3),
			stat(rs, func(x result) float64 { return ms(pct(x.ttft, 0.5)) }, 1),
			stat(rs, func(x result) float64 { return ms(pct(x.ttft, 0.99)) }, 1))
	}
	return nil
}

func (r result) line() string {
	return fmt.Sprintf("requests %d switches %d not-served %d failed %d hit %.3f p50 %.1fms p99 %.1fms",
		r.requests, r.switches, r.notServed, r.failed, r.hitRatio, ms(pct(r.ttft, 0.5)), ms(pct(r.ttft, 0.99)))
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func stat(rs []result, f func(result) float64, prec int) string {
	var v []float64
	for _, r := range rs {
		v = append(v, f(r))
	}
	slices.Sort(v)
	return fmt.Sprintf("%.*f [%.*f-%.*f]", prec, v[len(v)/2], prec, v[0], prec, v[len(v)-1])
}

func freePort() int {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// engine is one simulator process.
type engine struct {
	addr  string
	model string
	cmd   *exec.Cmd
}

func startEngines(ctx context.Context, dir string) ([]*engine, error) {
	var out []*engine
	for i := range 4 {
		model := "base"
		args := []string{"--force-dummy-tokenizer", "--enable-kvcache", "--zmq-endpoint", "", "--mode", "random",
			"--kv-cache-size", "512", "--block-size", "16", "--max-num-seqs", "4", "--max-model-len", "1048576",
			"--prefill-time-per-token", "50us", "--inter-token-latency", "2ms"}
		if *scenario == "lora" {
			var mods []string
			for a := range *loras {
				mods = append(mods, fmt.Sprintf(`{"name":"lora-%d","path":"/lora/%d","base_model_name":"base"}`, a, a))
			}
			args = append(args, "--max-loras", strconv.Itoa(*maxLoras), "--max-cpu-loras", strconv.Itoa(*loras), "--lora-modules")
			args = append(args, mods...)
		} else {
			model = []string{"model-a", "model-b"}[i%2]
		}
		port := freePort()
		args = append([]string{"--port", strconv.Itoa(port), "--model", model}, args...)
		cmd := exec.CommandContext(ctx, *simBin, args...)
		cmd.Env = append(os.Environ(), "POD_IP=127.0.0.1")
		logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("sim%d.log", i)))
		if err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		out = append(out, &engine{addr: fmt.Sprintf("127.0.0.1:%d", port), model: model, cmd: cmd})
	}
	for _, e := range out {
		if err := waitOK("http://"+e.addr+"/health", 30*time.Second); err != nil {
			return out, err
		}
	}
	return out, nil
}

func waitOK(url string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode < 500 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not up after %v", url, d)
}

func once(spec string, rep int) (result, error) {
	name, policy, _ := strings.Cut(spec, ":")
	bin := caddies[name]
	if bin == "" {
		return result{}, fmt.Errorf("no -caddy %s=...", name)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "fleetbench-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	engines, err := startEngines(ctx, dir)
	defer func() {
		for _, e := range engines {
			_ = e.cmd.Process.Kill()
			_ = e.cmd.Wait()
		}
	}()
	if err != nil {
		return result{}, err
	}
	var addrs []string
	for _, e := range engines {
		addrs = append(addrs, e.addr)
	}
	port, admin := freePort(), freePort()
	lb := "lb_policy " + policy
	if policy == "kv_cache_aware" {
		lb = "lb_policy kv_cache_aware {\n\t\t\ttelemetry {\n\t\t\t\tinterval 200ms\n\t\t\t\ttimeout 200ms\n\t\t\t}\n\t\t}"
	}
	cf := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
}
:%d {
	@llm llm_prompt
	reverse_proxy @llm %s {
		%s
		header_down X-Upstream {http.reverse_proxy.upstream.hostport}
	}
}
`, admin, port, strings.Join(addrs, " "), lb)
	cfPath := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfPath, []byte(cf), 0o644); err != nil {
		return result{}, err
	}
	caddy := exec.CommandContext(ctx, bin, "run", "--config", cfPath, "--adapter", "caddyfile")
	logf, _ := os.Create(filepath.Join(dir, "caddy.log"))
	caddy.Stdout, caddy.Stderr = logf, logf
	if err := caddy.Start(); err != nil {
		return result{}, err
	}
	defer func() { _ = caddy.Process.Kill(); _ = caddy.Wait() }()
	if err := waitOK(fmt.Sprintf("http://127.0.0.1:%d/config/", admin), 20*time.Second); err != nil {
		return result{}, err
	}
	base := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	if *scenario == "mixed" {
		// Warm-up: two list reads' worth of time with a request of each model (kv_cache_aware's
		// readers start with the config).
		time.Sleep(1500 * time.Millisecond)
	}
	before := engineHits(engines)
	res := replay(client, base, engines, rand.New(rand.NewPCG(uint64(rep), 7)))
	after := engineHits(engines)
	if q := after[1] - before[1]; q > 0 {
		res.hitRatio = (after[0] - before[0]) / q
	}
	return res, nil
}

// engineHits adds up the engines' prefix-cache hits and queries.
func engineHits(engines []*engine) [2]float64 {
	var out [2]float64
	for _, e := range engines {
		resp, err := http.Get("http://" + e.addr + "/metrics")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			for i, name := range []string{"vllm:prefix_cache_hits", "vllm:prefix_cache_queries"} {
				if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"_total") {
					f := strings.Fields(line)
					v, _ := strconv.ParseFloat(f[len(f)-1], 64)
					out[i] += v
				}
			}
		}
		resp.Body.Close()
	}
	return out
}

type conv struct {
	model  string
	system string
	msgs   []string
}

func replay(client *http.Client, url string, engines []*engine, rng *rand.Rand) result {
	var convs []*conv
	for i := range *conversations {
		c := &conv{}
		if *scenario == "lora" {
			c.model = fmt.Sprintf("lora-%d", i%*loras)
			c.system = strings.Repeat(fmt.Sprintf("You are assistant %d of adapter %s. ", i%3, c.model), 20)
		} else {
			c.model = []string{"model-a", "model-b"}[i%2]
			c.system = strings.Repeat(fmt.Sprintf("You are assistant %d. ", i), 20)
		}
		c.msgs = []string{fmt.Sprintf("conversation %d starts: %s", i, strings.Repeat("tell me more. ", 10+rng.IntN(20)))}
		convs = append(convs, c)
	}
	serves := map[string]string{}
	for _, e := range engines {
		serves[e.addr] = e.model
	}
	var mu sync.Mutex
	var res result
	warm := map[string][]string{} // engine → its last max-loras adapters, most recent first
	work := make(chan *conv)
	var wg sync.WaitGroup
	for range *concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range work {
				for turn := range *turns {
					up, ttft, code := ask(client, url, c)
					mu.Lock()
					res.requests++
					switch {
					case code == http.StatusNotFound || (up != "" && *scenario == "mixed" && serves[up] != c.model):
						res.notServed++
					case code != http.StatusOK:
						res.failed++
					default:
						res.ttft = append(res.ttft, ttft)
					}
					if *scenario == "lora" && up != "" {
						w := warm[up]
						if !slices.Contains(w, c.model) {
							res.switches++
						} else {
							w = slices.DeleteFunc(w, func(s string) bool { return s == c.model })
						}
						w = append([]string{c.model}, w...)
						warm[up] = w[:min(len(w), *maxLoras)]
					}
					mu.Unlock()
					c.msgs = append(c.msgs, "an answer of some words", fmt.Sprintf("turn %d: and then?", turn))
				}
			}
		}()
	}
	for _, c := range convs {
		work <- c
	}
	close(work)
	wg.Wait()
	return res
}

// ask sends one streamed chat turn and returns the upstream, the time to the first content
// event, and the status.
func ask(client *http.Client, url string, c *conv) (string, time.Duration, int) {
	msgs := []map[string]string{{"role": "system", "content": c.system}}
	for i, m := range c.msgs {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": m})
	}
	body, _ := json.Marshal(map[string]any{"model": c.model, "messages": msgs, "max_tokens": 16, "stream": true, "ignore_eos": true})
	start := time.Now()
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return "", 0, 0
	}
	defer resp.Body.Close()
	up := resp.Header.Get("X-Upstream")
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return up, 0, resp.StatusCode
	}
	var ttft time.Duration
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if ttft == 0 && strings.HasPrefix(sc.Text(), "data: ") {
			ttft = time.Since(start)
		}
	}
	return up, ttft, resp.StatusCode
}
