// Package replay sends a workload to an OpenAI-compatible endpoint (a router in front of a
// fleet) and measures what routing did: prefix cache hit ratio against the best any router
// could do, time to first token, latency, and load balance across workers.
//
// Closed loop (the default) runs Concurrency clients; each takes the next session and sends its
// calls one after the other, each after the previous answer. Open loop sends each call at its
// At time scaled by TimeScale (and after the previous call of its session), with at most
// MaxInFlight calls in flight.
//
// The reference hit ratio replays the prompts actually sent, in the order they were sent,
// against one LRU block cache as large as the whole fleet (llmsim.BlockCache, the simulator's
// own code): a router that partitioned the prefixes perfectly would hit about that much. The
// infinite hit ratio is the same with an unlimited cache: what no fleet can beat.
package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// Options configure a replay. Zero fields take the defaults documented on each.
type Options struct {
	// BaseURL is where calls go, such as "http://127.0.0.1:8080"; the API path is appended.
	BaseURL string
	// Concurrency is the number of closed-loop clients (default 16).
	Concurrency int
	// OpenLoop sends calls at their At times instead of as fast as the clients can.
	OpenLoop bool
	// TimeScale multiplies At in open loop: 0.1 replays a trace ten times faster (default 1).
	TimeScale float64
	// MaxInFlight caps the calls in flight in open loop; later arrivals wait (default 256).
	MaxInFlight int
	// NoStream sends non-streaming calls; TTFT then equals latency.
	NoStream bool
	// BlockTokens is the fleet's KV block size, for the reference (default 16).
	BlockTokens int
	// Prompt returns a resolved call's prompt as the fleet's prefix cache sees it, for the
	// reference (default: the simulator's, llmsim.NewPrompt of SimText with BlockTokens). A
	// fleet of another simulator, with its own tokenizer, sets its own.
	Prompt func(workload.Call) llmsim.Prompt
	// FleetBlocks is the prefix cache capacity of the whole fleet in blocks; 0 skips the
	// reference hit ratio.
	FleetBlocks int
	// Workers is the fleet size, so that idle workers count in the imbalance; 0 counts the
	// workers seen.
	Workers int
	// Timeout bounds each call (default 10 minutes).
	Timeout time.Duration
	// Client sends the calls (default: a client with keep-alive and no proxy).
	Client *http.Client
	// Progress, when set, receives a progress line, rewritten in place (for a terminal).
	Progress io.Writer
	// OnDone, when set, is called as each call ends, with the calls ended so far and the
	// workload's calls; from the call's goroutine, several at once: it must be quick and safe
	// for concurrent use.
	OnDone func(done, total int)
	// KeepRecords puts every call's record in the result.
	KeepRecords bool
}

func (o Options) withDefaults() Options {
	if o.Concurrency <= 0 {
		o.Concurrency = 16
	}
	if o.TimeScale <= 0 {
		o.TimeScale = 1
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 256
	}
	if o.BlockTokens <= 0 {
		o.BlockTokens = llmsim.DefaultBlockTokens
	}
	if o.Prompt == nil {
		blockTokens := o.BlockTokens
		o.Prompt = func(c workload.Call) llmsim.Prompt { return llmsim.NewPrompt(SimText(c), blockTokens) }
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.Client == nil {
		o.Client = newClient(max(o.Concurrency, o.MaxInFlight))
	}
	o.BaseURL = strings.TrimRight(o.BaseURL, "/")
	return o
}

func newClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

// Run replays w and returns its measurements. Failed calls are counted in the result, not
// returned as errors; when ctx ends, Run stops sending and returns what was measured, with
// Result.Interrupted set.
func Run(ctx context.Context, w workload.Workload, opts Options) (*Result, error) {
	if opts.BaseURL == "" {
		return nil, errors.New("replay: no base URL")
	}
	opts = opts.withDefaults()
	r := &runner{opts: opts, w: w, records: make([]Record, w.Calls())}
	r.start = time.Now()
	stop := r.showProgress()
	if opts.OpenLoop {
		r.openLoop(ctx)
	} else {
		r.closedLoop(ctx)
	}
	wall := time.Since(r.start)
	stop()
	res := summarize(r.records[:r.seq.Load()], opts, wall)
	res.Workload = w.Name
	res.Interrupted = ctx.Err() != nil
	return res, nil
}

// runner is one replay in progress.
type runner struct {
	opts    Options
	w       workload.Workload
	start   time.Time
	records []Record // indexed by send order
	seq     atomic.Int64

	done, errors, prompt, cached, inFlight atomic.Int64
}

func (r *runner) closedLoop(ctx context.Context) {
	next := make(chan int)
	go func() {
		defer close(next)
		for i := range r.w.Sessions {
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for range r.opts.Concurrency {
		wg.Go(func() {
			for i := range next {
				s := r.w.Sessions[i]
				for turn, c := range s.Calls {
					if ctx.Err() != nil {
						break
					}
					r.send(ctx, s.ID, turn, c)
				}
			}
		})
	}
	wg.Wait()
}

func (r *runner) openLoop(ctx context.Context) {
	order := make([]int, 0, len(r.w.Sessions))
	for i, s := range r.w.Sessions {
		if len(s.Calls) > 0 {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Compare(r.w.Sessions[a].Calls[0].At, r.w.Sessions[b].Calls[0].At)
	})
	sem := make(chan struct{}, r.opts.MaxInFlight)
	var wg sync.WaitGroup
	for _, i := range order {
		s := r.w.Sessions[i]
		if !r.waitUntil(ctx, s.Calls[0].At) {
			break
		}
		wg.Go(func() {
			for turn, c := range s.Calls {
				if !r.waitUntil(ctx, c.At) {
					return
				}
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					return
				}
				r.send(ctx, s.ID, turn, c)
				<-sem
			}
		})
	}
	wg.Wait()
}

// waitUntil sleeps until at (scaled) after the start and reports whether ctx is still alive.
func (r *runner) waitUntil(ctx context.Context, at time.Duration) bool {
	d := time.Until(r.start.Add(time.Duration(float64(at) * r.opts.TimeScale)))
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// send sends one call and fills its record.
func (r *runner) send(ctx context.Context, session string, turn int, c workload.Call) {
	c = c.Resolve()
	prompt := r.opts.Prompt(c)
	body, err := c.Body(!r.opts.NoStream)
	seq := r.seq.Add(1) - 1
	rec := &r.records[seq]
	*rec = Record{Seq: int(seq), Session: session, Turn: turn, prompt: prompt}
	r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	if err != nil {
		rec.Error = fmt.Sprintf("building body: %v", err)
	} else {
		ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
		r.do(ctx, rec, c, body)
		cancel()
	}
	if n := r.done.Add(1); r.opts.OnDone != nil {
		r.opts.OnDone(int(n), len(r.records))
	}
	if rec.Error != "" {
		r.errors.Add(1)
		return
	}
	r.prompt.Add(int64(rec.PromptTokens))
	r.cached.Add(int64(rec.CachedTokens))
}

// SimText returns the prompt text a simulated worker sees for the call: the chat messages as
// llmsim serializes them, or the completions prompt.
func SimText(c workload.Call) string {
	c = c.Resolve()
	if c.API == workload.APICompletions {
		return c.Prompt
	}
	msgs := make([]llmsim.Message, len(c.Messages))
	for i, m := range c.Messages {
		msgs[i] = llmsim.Message{Role: m.Role, Content: m.Content}
	}
	return llmsim.ChatText(msgs)
}
