package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// fleet is the set of workers behind Caddy.
type fleet interface {
	// Kind names the simulator, for the header lines.
	Kind() string
	// Addrs returns the workers' host:port, in order (w0, w1, ...).
	Addrs() []string
	// CapacityBlocks returns the prefix cache capacity of the whole fleet, in blocks.
	CapacityBlocks() int
	// BlockTokens returns the KV block size in tokens.
	BlockTokens() int
	// Prompt returns a call's prompt as the workers' prefix cache sees it, for the
	// reference hit ratio (nil: our simulator's).
	Prompt() func(workload.Call) llmsim.Prompt
	// Client returns the HTTP client that sends calls to this fleet (nil: the replay's).
	Client(conns int) *http.Client
	// Fresh empties every worker's cache and counters before a run.
	Fresh(ctx context.Context) error
	// PrefillSpeeds are the workers' configured prefill speeds, uncached prompt tokens per
	// second, in order.
	PrefillSpeeds() []float64
	// Restart restarts worker i as an engine process restarts: an empty cache, its counters
	// from zero.
	Restart(ctx context.Context, i int) error
	// Close stops the workers.
	Close() error
}

// startFleet starts the fleet -fleet names.
func startFleet(ctx context.Context, cfg *config) (fleet, error) {
	switch cfg.fleet {
	case "llmd":
		return startLLMDFleet(ctx, cfg)
	case "ollama":
		return startOllamaFleet(ctx, cfg)
	}
	return startSimFleet(cfg)
}

// simFleet is our simulator (examples/llmsim), run in this process.
type simFleet struct{ *llmsim.Fleet }

// startSimFleet starts the workers on free ports, named worker-0, worker-1, ... as
// llmsim.StartFleet names them, each running the engine the flags describe; -slow's workers
// take every part of their step time × -slow-factor (as the fleet simulator's slowed engines).
func startSimFleet(cfg *config) (*simFleet, error) {
	f := &simFleet{&llmsim.Fleet{}}
	e := cfg.engine
	if e == (engineFlags{}) {
		e = engineFlags{llmsim.DefaultSlots, llmsim.DefaultMaxBatchTokens, llmsim.DefaultBlockTokens,
			llmsim.DefaultStepFixed, llmsim.DefaultPrefillPerToken, llmsim.DefaultPerSeq}
	}
	// llmsim takes zero for its default and a negative time for none.
	none := func(d time.Duration) time.Duration {
		if d <= 0 {
			return -1
		}
		return d
	}
	for i := range cfg.workers {
		k := cfg.slowdown(i)
		w, err := llmsim.StartWorker("127.0.0.1:0", llmsim.Config{
			Name:            fmt.Sprintf("worker-%d", i),
			Model:           workload.DefaultChat.Model,
			CapacityBlocks:  cfg.blocks,
			BlockTokens:     e.blockTokens,
			Slots:           e.maxNumSeqs,
			MaxBatchTokens:  e.maxBatchTokens,
			Speed:           cfg.speed,
			StepFixed:       none(time.Duration(k * float64(e.stepFixed))),
			PrefillPerToken: none(time.Duration(k * float64(e.prefillPerToken))),
			PerSeq:          none(time.Duration(k * float64(e.perSeq))),
		})
		if err != nil {
			f.Close()
			return nil, err
		}
		f.Workers = append(f.Workers, w)
	}
	return f, nil
}

func (f *simFleet) PrefillSpeeds() []float64 {
	out := make([]float64, len(f.Workers))
	for i, w := range f.Workers {
		// The engine's durations are divided by the speed already.
		if p := w.Engine().PerPrefillToken; p > 0 {
			out[i] = 1 / p.Seconds()
		}
	}
	return out
}

// Restart restarts worker i in place (llmsim's Server.Restart): its port stays open.
func (f *simFleet) Restart(_ context.Context, i int) error {
	f.Workers[i].Restart()
	return nil
}

func (f *simFleet) Kind() string { return "llmsim" }

func (f *simFleet) BlockTokens() int { return f.Workers[0].Config().BlockTokens }

func (f *simFleet) Prompt() func(workload.Call) llmsim.Prompt { return nil }

func (f *simFleet) Client(int) *http.Client { return nil }

func (f *simFleet) Fresh(context.Context) error {
	for _, w := range f.Workers {
		if n := w.Stats(); n.Running+n.Waiting > 0 {
			return fmt.Errorf("worker %s still has requests in flight", w.Addr)
		}
	}
	f.Reset()
	return nil
}
