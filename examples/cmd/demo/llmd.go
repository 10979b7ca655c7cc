package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// llm-d-inference-sim, the vLLM simulator of the llm-d project, pinned in examples/llmdsim.
const (
	llmdModule  = "github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim"
	llmdDir     = "examples/llmdsim"
	llmdBinName = "bin/llm-d-inference-sim"
)

// llm-d's simulator pins the KV blocks of running requests and answers 500 to a request whose
// blocks do not fit next to them, where vLLM would queue or preempt it. So on chat its workers
// run two requests at once, and get 320 blocks each: room for two of the longest prompts
// (about 141 blocks with its word-level dummy tokenizer, which makes a token of about 5 chars
// where ours makes one of 4), and a fleet LRU that still hits well below an infinite cache
// (Estimate with llmdPrompt: 0.39 at 192 blocks, 0.51 at 256, 0.81 at 384; infinite 0.85).
const (
	// The timings llm-d's workers have been measured with (docs/benchmarks.md): 50µs per
	// uncached prompt token, 2ms per output token (our simulator's before it ran the fleet
	// simulator's engine model).
	llmdPrefillPerToken = 50 * time.Microsecond
	llmdInterToken      = 2 * time.Millisecond

	llmdChatBlocks = 320
	llmdChatSlots  = 2
	llmdSlots      = 8
)

// llmdStartTimeout is how long a worker may take to answer /health after it starts: seconds
// on a quiet machine, more on a loaded one.
const llmdStartTimeout = time.Minute

// llmdFleet runs one llm-d-inference-sim process per worker.
type llmdFleet struct {
	bin    string
	args   []string
	ports  []int
	addrs  []string
	blocks int
	logDir string
	procs  []*exec.Cmd
	// perWorker are each worker's own flags (its timings: -slow); prefill its configured
	// prefill speed in tokens per second.
	perWorker [][]string
	prefill   []float64
}

// startLLMDFleet builds the simulator when its binary is missing and starts the workers.
func startLLMDFleet(ctx context.Context, cfg *config) (*llmdFleet, error) {
	bin, err := llmdBinary(ctx, cfg.llmdBin)
	if err != nil {
		return nil, err
	}
	blocks, slots := cfg.blocks, llmdSlots
	if cfg.kind == "chat" {
		slots = llmdChatSlots
	}
	scale := func(d time.Duration) string { return time.Duration(float64(d) / cfg.speed).String() }
	f := &llmdFleet{bin: bin, blocks: blocks}
	f.args = []string{
		"--model", "llama-3.1-8b", "--force-dummy-tokenizer", "--enable-kvcache", "--zmq-endpoint", "",
		"--mode", "random", "--kv-cache-size", strconv.Itoa(blocks), "--block-size", "16",
		"--max-num-seqs", strconv.Itoa(slots), "--max-model-len", "1048576", "--max-request-body-size-mb", "64",
	}
	for i := range cfg.workers {
		// -slow's workers -slow-factor times the timings.
		k := cfg.slowdown(i)
		prefill := scale(time.Duration(k * float64(llmdPrefillPerToken)))
		f.perWorker = append(f.perWorker, []string{"--prefill-time-per-token", prefill,
			"--inter-token-latency", scale(time.Duration(k * float64(llmdInterToken)))})
		d, err := time.ParseDuration(prefill)
		if err != nil {
			return nil, err
		}
		f.prefill = append(f.prefill, 1/d.Seconds())
	}
	if f.logDir, err = os.MkdirTemp("", "kvroute-demo-llmd-"); err != nil {
		return nil, err
	}
	if f.ports, err = freePorts(cfg.workers); err != nil {
		return nil, err
	}
	for _, p := range f.ports {
		f.addrs = append(f.addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	}
	if err := f.start(ctx); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// llmdBinary returns the simulator's binary: the one given, or examples/llmdsim's, built with
// `go build` on first use.
func llmdBinary(ctx context.Context, given string) (string, error) {
	if given != "" {
		if _, err := os.Stat(given); err != nil {
			return "", fmt.Errorf("-llmd-bin: %w", err)
		}
		return given, nil
	}
	dir, err := findDir(llmdDir)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, llmdBinName)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	fmt.Printf("building llm-d-inference-sim into %s (first use only: about 5 minutes on 2 cores, 77 MB)\n", bin)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", llmdBinName, llmdModule)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building llm-d-inference-sim (cd %s && go build -o %s %s): %w", dir, llmdBinName, llmdModule, err)
	}
	return bin, nil
}

// findDir finds rel from the working directory or one of its parents.
func findDir(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, rel)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%s not found from the working directory up: run the demo from the repository", rel)
		}
		dir = parent
	}
}

// start starts every worker and waits until each answers /health.
func (f *llmdFleet) start(ctx context.Context) error {
	f.procs = make([]*exec.Cmd, len(f.ports))
	for i := range f.ports {
		if err := f.startOne(i); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(llmdStartTimeout)
	for i := range f.addrs {
		if err := f.waitHealthy(ctx, i, deadline); err != nil {
			return err
		}
	}
	return nil
}

// startOne starts worker i on its port.
func (f *llmdFleet) startOne(i int) error {
	logf, err := os.OpenFile(filepath.Join(f.logDir, fmt.Sprintf("w%d.log", i)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := append([]string{"--port", strconv.Itoa(f.ports[i])}, f.args...)
	if i < len(f.perWorker) {
		args = append(args, f.perWorker[i]...)
	}
	cmd := exec.Command(f.bin, args...)
	cmd.Env = append(os.Environ(), "POD_IP=127.0.0.1")
	cmd.Stdout, cmd.Stderr = logf, logf
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return fmt.Errorf("starting %s: %w", f.bin, err)
	}
	f.procs[i] = cmd
	return nil
}

// waitHealthy waits until worker i answers /health, until deadline.
func (f *llmdFleet) waitHealthy(ctx context.Context, i int, deadline time.Time) error {
	client := &http.Client{Timeout: time.Second}
	a := f.addrs[i]
	for {
		resp, err := client.Get("http://" + a + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("llm-d-inference-sim w%d on %s not healthy after %v (log: %s)", i, a, llmdStartTimeout, filepath.Join(f.logDir, fmt.Sprintf("w%d.log", i)))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop stops every worker (SIGTERM, then SIGKILL after 5 s).
func (f *llmdFleet) stop() error {
	var wg sync.WaitGroup
	errs := make([]error, len(f.procs))
	for i, cmd := range f.procs {
		if cmd == nil || cmd.Process == nil {
			continue
		}
		wg.Go(func() {
			cmd.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				cmd.Process.Kill()
				<-done
				errs[i] = fmt.Errorf("w%d killed after 5s", i)
			}
		})
	}
	wg.Wait()
	f.procs = nil
	return errors.Join(errs...)
}

// Restart kills worker i, as a crash would, and starts it again on its port with an empty
// cache and counters from zero; the requests it was serving fail.
func (f *llmdFleet) Restart(ctx context.Context, i int) error {
	if cmd := f.procs[i]; cmd != nil && cmd.Process != nil {
		cmd.Process.Kill()
		cmd.Wait()
	}
	if err := f.startOne(i); err != nil {
		return err
	}
	return f.waitHealthy(ctx, i, time.Now().Add(llmdStartTimeout))
}

func (f *llmdFleet) PrefillSpeeds() []float64 { return f.prefill }

func (f *llmdFleet) Kind() string        { return "llm-d-inference-sim" }
func (f *llmdFleet) Addrs() []string     { return f.addrs }
func (f *llmdFleet) CapacityBlocks() int { return f.blocks * len(f.addrs) }
func (f *llmdFleet) BlockTokens() int    { return 16 }

// Prompt tokenizes as the simulator's dummy tokenizer does (llmdPrompt).
func (f *llmdFleet) Prompt() func(workload.Call) llmsim.Prompt {
	return func(c workload.Call) llmsim.Prompt { return llmdPrompt(c, f.BlockTokens()) }
}

// Client adds "ignore_eos": true to every request (llmdClient).
func (f *llmdFleet) Client(conns int) *http.Client { return llmdClient(conns) }

// Fresh restarts the workers on the same ports: the simulator has no reset endpoint. A worker
// that had to be killed (slow to stop on a loaded machine) is only worth a warning.
//
// A port freed by the stop may be taken meanwhile (an outgoing connection of a busy machine gets
// it as its local port), and the worker then never answers: the fleet moves to new free ports
// once, which Caddy, started after Fresh, is given.
func (f *llmdFleet) Fresh(ctx context.Context) error {
	if err := f.stop(); err != nil {
		fmt.Fprintln(os.Stderr, "warning:", err)
	}
	err := f.start(ctx)
	if err == nil || ctx.Err() != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "warning:", err, "- starting the workers on new ports")
	if serr := f.stop(); serr != nil {
		fmt.Fprintln(os.Stderr, "warning:", serr)
	}
	if f.ports, err = freePorts(len(f.ports)); err != nil {
		return err
	}
	for i, p := range f.ports {
		f.addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	return f.start(ctx)
}

// Close stops the workers and removes their logs.
func (f *llmdFleet) Close() error {
	err := f.stop()
	os.RemoveAll(f.logDir)
	return err
}

// llmdClient is an HTTP client that adds "ignore_eos": true to every JSON request body, so
// that llm-d's simulator answers max_tokens tokens as our workload expects.
func llmdClient(conns int) *http.Client {
	return &http.Client{Transport: rewriteBody{edit: withIgnoreEOS, next: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}}
}

// rewriteBody rewrites the bodies of POST requests with edit before next sends them.
type rewriteBody struct {
	next http.RoundTripper
	edit func([]byte) []byte
}

func (t rewriteBody) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Method != http.MethodPost {
		return t.next.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	body = t.edit(body)
	r := req.Clone(req.Context())
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return t.next.RoundTrip(r)
}

// withIgnoreEOS inserts "ignore_eos":true as the first member of a non-empty JSON object.
func withIgnoreEOS(body []byte) []byte {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) < 2 || trimmed[0] != '{' || bytes.HasPrefix(bytes.TrimLeft(trimmed[1:], " \t\r\n"), []byte("}")) {
		return body
	}
	out := make([]byte, 0, len(trimmed)+20)
	out = append(out, `{"ignore_eos":true,`...)
	return append(out, trimmed[1:]...)
}
