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
	f, err := ollamafleet.Start(ctx, ollamafleet.Config{
		Bin: bin, Model: model, Name: cfg.chat.Model, Parallel: ollamaParallel, Context: ollamaContext, Threads: 1,
		StartTimeout: 5 * time.Minute,
	}, cfg.workers)
	if err != nil {
		return nil, err
	}
	return &ollamaFleet{f: f, kind: fmt.Sprintf("Ollama v0.6.5 (tiny model, OLLAMA_NUM_PARALLEL=%d, answers of %d tokens)", ollamaParallel, ollamaMaxTokens),
		speed: make([]float64, cfg.workers)}, nil
}

// ollamaBinary returns examples/ollama's binary and model, building them when missing.
func ollamaBinary(ctx context.Context) (bin, model string, err error) {
	dir, err := findDir(ollamaDir)
	if err != nil {
		return "", "", err
	}
	bin, model = filepath.Join(dir, "bin", "ollama"), filepath.Join(dir, "bin", "tiny.gguf")
	run := func(env []string, args ...string) error {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		return cmd.Run()
	}
	if _, err := os.Stat(bin); err != nil {
		fmt.Printf("building Ollama into %s (first use only: minutes, CPU-only with cgo)\n", bin)
		flags := "-O3 -march=native"
		if err := run([]string{"CGO_ENABLED=1", "CGO_CFLAGS=" + flags, "CGO_CXXFLAGS=" + flags}, "build", "-o", "bin/ollama", "github.com/ollama/ollama"); err != nil {
			return "", "", fmt.Errorf("building Ollama (see %s/doc.go): %w", dir, err)
		}
	}
	if _, err := os.Stat(model); err != nil {
		if err := run(nil, "run", "./cmd/tinymodel", "-o", "bin/tiny.gguf"); err != nil {
			return "", "", fmt.Errorf("writing the tiny model: %w", err)
		}
	}
	return bin, model, nil
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
