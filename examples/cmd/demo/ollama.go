package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/ollamafleet"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// Ollama, a real engine (examples/ollama pins it and writes its tiny model), as the fleet:
// -fleet ollama. Each worker runs ollamaParallel requests at once, each with a context of
// ollamaContext tokens, and keeps a prefix per slot (OLLAMA_MULTIUSER_CACHE=1); it computes
// with one thread (num_thread 1), the workers sharing the machine's cores. Answers are
// capped at ollamaMaxTokens: the model's random words cost decode time on the same CPUs as the
// prefills the comparison is about.
const (
	ollamaDir       = "examples/ollama"
	ollamaParallel  = 2
	ollamaContext   = 8192
	ollamaMaxTokens = 8
)

type ollamaFleet struct {
	f     *ollamafleet.Fleet
	kind  string
	speed []float64
}

// startOllamaFleet starts one Ollama per worker, with the tiny model registered under the
// workload's model name. The binary and the model are KVROUTE_OLLAMA_BIN's (and
// KVROUTE_OLLAMA_MODEL's), else examples/ollama/bin's, built there on first use.
func startOllamaFleet(ctx context.Context, cfg *config) (*ollamaFleet, error) {
	bin, model, ok := ollamafleet.Binary()
	if !ok {
		var err error
		if bin, model, err = ollamaBinary(ctx); err != nil {
			return nil, err
		}
	}
	fmt.Printf("starting %d Ollama instances (%s) ... ", cfg.workers, bin)
	start := time.Now()
	f, err := ollamafleet.Start(ctx, ollamafleet.Config{
		Bin: bin, Model: model, Name: cfg.chat.Model, Parallel: ollamaParallel, Context: ollamaContext, Threads: 1,
		StartTimeout: 5 * time.Minute,
	}, cfg.workers)
	if err != nil {
		fmt.Println()
		return nil, err
	}
	fmt.Printf("up in %s\n", time.Since(start).Round(100*time.Millisecond))
	return &ollamaFleet{f: f, kind: fmt.Sprintf("Ollama v0.6.5 (tiny model, OLLAMA_NUM_PARALLEL=%d, answers of %d tokens)", ollamaParallel, ollamaMaxTokens),
		speed: make([]float64, cfg.workers)}, nil
}

// ollamaBinary returns examples/ollama's binary and model, building them when missing. The
// build's output (the C compiler's warnings on llama.cpp's sources, thousands of lines) goes to
// bin/build.log, shown only when the build fails.
func ollamaBinary(ctx context.Context) (bin, model string, err error) {
	dir, err := findDir(ollamaDir)
	if err != nil {
		return "", "", err
	}
	bin, model = filepath.Join(dir, "bin", "ollama"), filepath.Join(dir, "bin", "tiny.gguf")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", "", err
	}
	logPath := filepath.Join(dir, "bin", "build.log")
	run := func(env []string, args ...string) error {
		log, err := os.Create(logPath)
		if err != nil {
			return err
		}
		defer log.Close()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%w; its last lines (all in %s):\n%s", err, logPath, lastLines(logPath, 20))
		}
		return nil
	}
	if _, err := os.Stat(bin); err != nil {
		if _, err := exec.LookPath(cCompiler()); err != nil {
			return "", "", fmt.Errorf("building Ollama needs a C/C++ compiler (cgo: %s not found; e.g. apt-get install build-essential), or KVROUTE_OLLAMA_BIN naming a built one", cCompiler())
		}
		start := time.Now()
		fmt.Printf("building Ollama into %s: first use only, minutes (CPU-only, cgo, -O3 -march=native; the compiler's output goes to %s) ... ", bin, logPath)
		flags := "-O3 -march=native"
		if err := run([]string{"CGO_ENABLED=1", "CGO_CFLAGS=" + flags, "CGO_CXXFLAGS=" + flags}, "build", "-o", "bin/ollama", "github.com/ollama/ollama"); err != nil {
			fmt.Println()
			return "", "", fmt.Errorf("building Ollama (see %s/doc.go): %w", dir, err)
		}
		fmt.Printf("done in %s\n", time.Since(start).Round(time.Second))
	}
	if _, err := os.Stat(model); err != nil {
		if err := run(nil, "run", "./cmd/tinymodel", "-o", "bin/tiny.gguf"); err != nil {
			return "", "", fmt.Errorf("writing the tiny model: %w", err)
		}
	}
	return bin, model, nil
}

// cCompiler is the C compiler cgo runs: $CC, else gcc (cgo's default on Linux).
func cCompiler() string {
	if cc := strings.Fields(os.Getenv("CC")); len(cc) > 0 {
		return cc[0]
	}
	return "gcc"
}

// lastLines returns the last n lines of the file at path ("" when it cannot be read).
func lastLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (o *ollamaFleet) Kind() string    { return o.kind }
func (o *ollamaFleet) Addrs() []string { return o.f.Addrs }

// CapacityBlocks is the tokens its slots hold (num_ctx each), in 16-token blocks: Ollama keeps
// a prefix per slot, not a block cache.
func (o *ollamaFleet) CapacityBlocks() int {
	return len(o.f.Addrs) * ollamaParallel * ollamaContext / o.BlockTokens()
}
func (o *ollamaFleet) BlockTokens() int { return 16 }

// Prompt: nil, our simulator's tokens (the reference hit ratio is only indicative here).
func (o *ollamaFleet) Prompt() func(workload.Call) llmsim.Prompt { return nil }

// PrefillSpeeds: not configured (a real engine's): zeros.
func (o *ollamaFleet) PrefillSpeeds() []float64 { return o.speed }

// Client caps every request's answer at ollamaMaxTokens.
func (o *ollamaFleet) Client(conns int) *http.Client {
	return &http.Client{Transport: rewriteBody{edit: withMaxTokens, next: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}}
}

// Fresh restarts every instance on its port: Ollama has no cache reset.
func (o *ollamaFleet) Fresh(ctx context.Context) error {
	errs := make([]error, len(o.f.Addrs))
	var wg sync.WaitGroup
	for i := range o.f.Addrs {
		wg.Go(func() { errs[i] = o.f.Restart(ctx, i) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (o *ollamaFleet) Restart(ctx context.Context, i int) error { return o.f.Restart(ctx, i) }
func (o *ollamaFleet) Close() error                             { return o.f.Close() }

// withMaxTokens sets max_tokens in a JSON object body: a last member, which wins
// (encoding/json and kvroute both take the last of a duplicated key).
func withMaxTokens(body []byte) []byte {
	if trimmed := bytes.TrimRight(body, " \t\r\n"); len(trimmed) > 2 && trimmed[len(trimmed)-1] == '}' {
		return append(trimmed[:len(trimmed)-1:len(trimmed)-1], fmt.Sprintf(`,"max_tokens":%d}`, ollamaMaxTokens)...)
	}
	return body
}
