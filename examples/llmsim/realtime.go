package llmsim

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
)

// realtime runs one engine.Engine (the fleet simulator's model of an engine, in virtual time)
// on the wall clock: the engine's time is the time since origin. Requests are submitted as
// they arrive; a goroutine, running only while the engine is busy, sleeps until the running
// step's end and advances the engine there, then tells each request what the step produced.
//
// Steps end at their nominal times, not when the goroutine happens to wake: a late wake-up
// does not lengthen the engine's steps (the steps due are run at once, as the simulator would
// have run them, and a request that arrives while the goroutine is late first ends the steps
// due before it), so that the engine's figures (prefill and decode time) are the model's, not
// the host's scheduling jitter. A step is never ended before the last submission, so that no
// request is admitted before it arrived.
type realtime struct {
	cfg        engine.Config // the engine's, defaults filled in
	mu         sync.Mutex
	eng        *engine.Engine
	origin     time.Time
	pending    map[*engine.Request]*pending
	lastSubmit time.Duration
	looping    bool          // the stepping goroutine runs
	wake       chan struct{} // the engine's next step end moved earlier (a restart)

	// vLLM's request histograms: prefill (admission to first token) and decode (first token
	// to last) in the engine's time, TTFT from the HTTP request's arrival.
	prefillTime, decodeTime, ttft histogram
}

// pending is one request in the engine, as its HTTP handler follows it.
type pending struct {
	req     engine.Request
	arrived time.Time
	first   chan struct{} // closed at the first token, or when the request is aborted
	done    chan struct{} // closed at the last token, or when the request is aborted
	tick    chan struct{} // a step generated tokens (streamed requests only)
	gen     atomic.Int64  // output tokens generated so far
	want    atomic.Int64  // tick when gen reaches this (the handler's next event)

	aborted atomic.Bool // set before first or done is closed for it
	// Set before first is closed.
	cached    int
	firstSent bool // first is closed (the stepping side's own record)
	firstAt   time.Duration
	doneAt    time.Duration // set before done is closed at the last token
}

func newRealtime(cfg engine.Config) *realtime {
	origin := time.Now()
	eng := engine.New(cfg, 0)
	return &realtime{
		cfg:     eng.Config(),
		eng:     eng,
		origin:  origin,
		pending: make(map[*engine.Request]*pending),
		wake:    make(chan struct{}, 1),
	}
}

func (d *realtime) now() time.Duration { return time.Since(d.origin) }

// submit queues a request of p's prompt for output tokens. remote: its KV was transferred
// (prefill/decode disaggregation). stream: its handler follows every token.
func (d *realtime) submit(p Prompt, output int, remote, stream bool, arrived time.Time) *pending {
	pd := &pending{
		req:     engine.Request{Tokens: p.Tokens, Hashes: p.Hashes, Output: output, Remote: remote},
		arrived: arrived,
		first:   make(chan struct{}),
		done:    make(chan struct{}),
	}
	if stream {
		pd.tick = make(chan struct{}, 1)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	// The steps that ended before the arrival end now, at their nominal times, before the
	// request joins: a stepping goroutine that wakes late must not stretch a step to the
	// arrival (a loaded host's lateness is not the engine's time).
	d.catchUp(now)
	d.pending[&pd.req] = pd
	d.lastSubmit = max(d.lastSubmit, now)
	d.eng.Submit(&pd.req, now)
	if !d.eng.Busy() {
		evs, _ := d.eng.Advance(now)
		d.dispatch(evs, now)
	}
	d.start()
	return pd
}

// start starts the stepping goroutine when the engine is busy and none runs. d.mu held.
func (d *realtime) start() {
	if d.eng.Busy() && !d.looping {
		d.looping = true
		go d.loop()
	}
}

// loop steps the engine on the wall clock until it is idle.
func (d *realtime) loop() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		d.mu.Lock()
		d.catchUp(d.now())
		if !d.eng.Busy() {
			d.looping = false
			d.mu.Unlock()
			return
		}
		wait := d.eng.StepEnd() - d.now()
		d.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-d.wake:
		}
	}
}

// catchUp ends the steps due by now, each at its nominal end (never before the last
// submission: no request is admitted before it arrived). d.mu held.
func (d *realtime) catchUp(now time.Duration) {
	for d.eng.Busy() && d.eng.StepEnd() <= now {
		at := max(d.eng.StepEnd(), d.lastSubmit)
		evs, _ := d.eng.Advance(at)
		d.dispatch(evs, at)
	}
}

// dispatch tells the requests what a step ending at `at` produced, and the streamed ones how
// far their decode went. d.mu held.
func (d *realtime) dispatch(evs []engine.Event, at time.Duration) {
	for _, ev := range evs {
		pd := d.pending[ev.Req]
		if pd == nil {
			continue
		}
		switch ev.Kind {
		case engine.FirstToken:
			d.prefillTime.observe(at - ev.Admitted)
			d.ttft.observe(d.origin.Add(at).Sub(pd.arrived))
			pd.cached, pd.firstAt = ev.Cached, at
			pd.gen.Store(1)
			pd.firstSent = true
			close(pd.first)
		case engine.Finished:
			d.decodeTime.observe(at - pd.firstAt)
			pd.doneAt = at
			pd.gen.Store(int64(pd.req.Output))
			delete(d.pending, ev.Req)
			close(pd.done)
		case engine.Aborted:
			d.drop(pd)
		}
	}
	d.eng.Generated(func(r *engine.Request, n int) {
		if pd := d.pending[r]; pd != nil && pd.tick != nil && int64(n) != pd.gen.Load() {
			// gen is stored before want is read, and the handler stores want before it reads
			// gen: one of the two sees the other's.
			if pd.gen.Store(int64(n)); int64(n) < pd.want.Load() {
				return
			}
			select {
			case pd.tick <- struct{}{}:
			default:
			}
		}
	})
}

// drop ends pd as aborted. d.mu held.
func (d *realtime) drop(pd *pending) {
	delete(d.pending, &pd.req)
	pd.aborted.Store(true)
	if !pd.firstSent {
		pd.firstSent = true
		close(pd.first)
	}
	close(pd.done)
}

// abort takes pd out of the engine: its client went away.
func (d *realtime) abort(pd *pending) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pending[&pd.req] == pd {
		d.eng.Abort(&pd.req)
		d.drop(pd)
	}
}

// lookup returns the tokens of p the engine's cache holds now.
func (d *realtime) lookup(p Prompt) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.eng.Lookup(&engine.Request{Tokens: p.Tokens, Hashes: p.Hashes})
}

// restart empties the engine (cache, queues, counters, histograms): the requests it held end
// as aborted.
func (d *realtime) restart() {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	d.dispatch(d.eng.Restart(now), now)
	d.prefillTime.reset()
	d.decodeTime.reset()
	d.ttft.reset()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// reading returns the engine's figures now.
func (d *realtime) reading() engine.Reading {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.eng.Reading()
}

// wait waits for ch, or for ctx to end (then pd is aborted). It reports whether pd is still
// alive: ch came and pd was not aborted.
func (d *realtime) wait(ctx context.Context, pd *pending, ch <-chan struct{}) bool {
	select {
	case <-ch:
		return !pd.aborted.Load()
	case <-ctx.Done():
		d.abort(pd)
		return false
	}
}
