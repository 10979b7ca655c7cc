// Command soak floods a running Caddy with kvroute (over HTTP) with distinct sessions and
// distinct random prompts for a given duration, and reports, every interval and at the end, the
// caddy process's resident memory (VmRSS and its peak VmHWM from /proc/PID/status), the
// decisions per second (from caddy_kvroute_decisions_total on the admin /metrics), the
// requests per second and their latency percentiles, errors, and the router's live sessions and
// stored chars (GET /kvroute/), so that one can watch memory stay flat under max_sessions and
// max_tree_size while the load goes on. It is not run in CI.
//
//	./caddy run --config examples/soak/Caddyfile &
//	go run ./examples/soak -serve 127.0.0.1:8181,127.0.0.1:8182,127.0.0.1:8183,127.0.0.1:8184 -duration 60s
//
// -serve starts trivial upstreams in this process (they read the body and answer a tiny chat
// completion); without it, point Caddy at real or simulated workers (examples/cmd/llmsim).
// The caddy process is found by the port its admin API listens on (Linux /proc), or -pid.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type config struct {
	url         string
	admin       string
	path        string
	model       string
	duration    time.Duration
	interval    time.Duration
	concurrency int
	promptChars int
	noSession   bool
	pid         int
	serve       string
	timeout     time.Duration
}

func main() {
	var c config
	flag.StringVar(&c.url, "url", "http://127.0.0.1:8180", "the Caddy site to flood")
	flag.StringVar(&c.admin, "admin", "http://localhost:2119", "Caddy's admin API (for /metrics, /kvroute/ and finding the process)")
	flag.StringVar(&c.path, "path", "/v1/chat/completions", "request path")
	flag.StringVar(&c.model, "model", "demo-model", "model named in the requests")
	flag.DurationVar(&c.duration, "duration", 60*time.Second, "how long to flood")
	flag.DurationVar(&c.interval, "interval", 5*time.Second, "report every")
	flag.IntVar(&c.concurrency, "concurrency", 32, "requests in flight")
	flag.IntVar(&c.promptChars, "prompt-chars", 2000, "chars of each random prompt")
	flag.BoolVar(&c.noSession, "no-session", false, "send no X-Session-ID (prompts only)")
	flag.IntVar(&c.pid, "pid", 0, "caddy's process id (default: the process listening on the admin port)")
	flag.StringVar(&c.serve, "serve", "", "comma-separated addresses on which to start trivial upstreams in this process")
	flag.DurationVar(&c.timeout, "timeout", 30*time.Second, "per-request timeout")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: soak [flags]\n\nFloods a running Caddy with kvroute with distinct sessions and random prompts and reports\nthe caddy process's RSS, decisions/s and latency percentiles.\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run(c config) error {
	if c.concurrency < 1 || c.promptChars < 1 || c.duration <= 0 || c.interval <= 0 {
		return errors.New("-concurrency, -prompt-chars, -duration and -interval must be positive")
	}
	if c.serve != "" {
		for _, addr := range strings.Split(c.serve, ",") {
			l, err := net.Listen("tcp", strings.TrimSpace(addr))
			if err != nil {
				return fmt.Errorf("-serve: %w", err)
			}
			go func() { _ = http.Serve(l, http.HandlerFunc(sink)) }()
		}
	}
	pid := c.pid
	if pid == 0 {
		var err error
		if pid, err = pidOfAdmin(c.admin); err != nil {
			return fmt.Errorf("finding caddy's process (give -pid): %w", err)
		}
	}
	if _, _, err := memory(pid); err != nil {
		return fmt.Errorf("reading /proc/%d/status: %w", pid, err)
	}

	tr := &http.Transport{MaxIdleConnsPerHost: c.concurrency, MaxConnsPerHost: c.concurrency, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: c.timeout}
	admin := &http.Client{Timeout: 10 * time.Second}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, stopAt := context.WithTimeout(ctx, c.duration)
	defer stopAt()

	rss0, _, _ := memory(pid)
	dec0, _ := decisions(admin, c.admin)
	fmt.Printf("soak: %s for %v, %d in flight, %d-char prompts, distinct sessions %v; caddy pid %d, RSS %s at the start\n",
		c.url+c.path, c.duration, c.concurrency, c.promptChars, !c.noSession, pid, mib(rss0))
	fmt.Printf("%6s %9s %9s %9s %9s %9s %9s %9s %7s %8s %10s\n", "t", "req/s", "dec/s", "p50", "p90", "p99", "max", "RSS", "errors", "sessions", "tree chars")

	run := rand.Uint64()
	pool := words(rand.New(rand.NewPCG(run, 1)), 1<<20)
	var seq, errCount atomic.Int64
	var mu sync.Mutex
	var window, all []time.Duration
	var wg sync.WaitGroup
	for w := 0; w < c.concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(run, uint64(w)+2))
			for ctx.Err() == nil {
				n := seq.Add(1)
				off := rng.IntN(len(pool) - c.promptChars)
				prompt := fmt.Sprintf("%x-%d ", run, n) + pool[off:off+c.promptChars]
				body, _ := json.Marshal(map[string]any{
					"model":      c.model,
					"max_tokens": 1,
					"messages":   []map[string]string{{"role": "user", "content": prompt}},
				})
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url+c.path, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if !c.noSession {
					req.Header.Set("X-Session-ID", fmt.Sprintf("soak-%x-%d", run, n))
				}
				start := time.Now()
				resp, err := client.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				d := time.Since(start)
				if err != nil {
					if ctx.Err() == nil {
						errCount.Add(1)
					}
					continue
				}
				mu.Lock()
				window = append(window, d)
				mu.Unlock()
			}
		}(w)
	}

	begin := time.Now()
	tick := time.NewTicker(c.interval)
	defer tick.Stop()
	lastT, lastDec, peakRSS := begin, dec0, rss0
	var lastErr int64
	report := func(now time.Time) {
		mu.Lock()
		win := window
		window = nil
		all = append(all, win...)
		mu.Unlock()
		rss, hwm, _ := memory(pid)
		peakRSS = max(peakRSS, rss, hwm)
		dec, _ := decisions(admin, c.admin)
		st := routerState(admin, c.admin)
		secs := now.Sub(lastT).Seconds()
		e := errCount.Load()
		fmt.Printf("%6.0f %9.0f %9.0f %9s %9s %9s %9s %9s %7d %8d %10d\n",
			now.Sub(begin).Seconds(), float64(len(win))/secs, (dec-lastDec)/secs,
			pct(win, 0.5), pct(win, 0.9), pct(win, 0.99), pct(win, 1), mib(rss), e-lastErr, st.Sessions, st.StoredChars)
		lastT, lastDec, lastErr = now, dec, e
	}
loop:
	for {
		select {
		case now := <-tick.C:
			report(now)
		case <-ctx.Done():
			break loop
		}
	}
	wg.Wait()
	end := time.Now()
	report(end)
	rss1, hwm, _ := memory(pid)
	dec1, _ := decisions(admin, c.admin)
	secs := end.Sub(begin).Seconds()
	fmt.Printf("total: %d requests in %.0fs = %.0f req/s, %.0f decisions/s, %d errors; latency p50 %s p90 %s p99 %s max %s; caddy RSS %s → %s (peak %s)\n",
		len(all), secs, float64(len(all))/secs, (dec1-dec0)/secs, errCount.Load(),
		pct(all, 0.5), pct(all, 0.9), pct(all, 0.99), pct(all, 1), mib(rss0), mib(rss1), mib(max(peakRSS, hwm)))
	return nil
}

// sink is a trivial upstream: it reads the request and answers a one-token chat completion.
func sink(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"id":"soak","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
}

// words returns n bytes of random lowercase words.
func words(rng *rand.Rand, n int) string {
	var sb strings.Builder
	for sb.Len() < n {
		l := 2 + rng.IntN(8)
		for i := 0; i < l; i++ {
			sb.WriteByte(byte('a' + rng.IntN(26)))
		}
		sb.WriteByte(' ')
	}
	return sb.String()[:n]
}

// memory returns the process's VmRSS and VmHWM in bytes.
func memory(pid int) (rss, hwm int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if k == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
	}
	return rss, hwm, sc.Err()
}

// decisions sums caddy_kvroute_decisions_total over its paths from the admin /metrics.
func decisions(c *http.Client, admin string) (float64, error) {
	resp, err := c.Get(admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "caddy_kvroute_decisions_total{") {
			if i := strings.LastIndexByte(line, ' '); i > 0 {
				v, _ := strconv.ParseFloat(line[i+1:], 64)
				sum += v
			}
		}
	}
	return sum, sc.Err()
}

type status struct {
	Sessions    int   `json:"sessions"`
	StoredChars int64 `json:"stored_chars"`
}

func routerState(c *http.Client, admin string) status {
	var st status
	resp, err := c.Get(admin + "/kvroute/")
	if err != nil {
		return st
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(&st)
	return st
}

// pidOfAdmin finds the process listening on the admin URL's TCP port: the socket's inode in
// /proc/net/tcp{,6}, then the process holding it among /proc/*/fd.
func pidOfAdmin(admin string) (int, error) {
	u, err := url.Parse(admin)
	if err != nil {
		return 0, err
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return 0, fmt.Errorf("admin URL %q has no port", admin)
	}
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		raw, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			if p, err := strconv.ParseInt(hexPort, 16, 32); err == nil && int(p) == port {
				inodes["socket:["+f[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("nothing listens on port %d", port)
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	var pids []int
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && inodes[target] {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			if !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
	}
	if len(pids) != 1 {
		return 0, fmt.Errorf("%d processes hold the socket listening on port %d", len(pids), port)
	}
	return pids[0], nil
}

func pct(d []time.Duration, p float64) string {
	if len(d) == 0 {
		return "-"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	v := s[min(len(s)-1, int(p*float64(len(s))))]
	switch {
	case v < time.Millisecond:
		return fmt.Sprintf("%dµs", v.Microseconds())
	case v < time.Second:
		return fmt.Sprintf("%.1fms", float64(v.Microseconds())/1e3)
	}
	return v.Round(time.Millisecond).String()
}

func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }
