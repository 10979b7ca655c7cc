package fleetsim

import (
	"cmp"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
	"github.com/kvroute/caddy-kvroute/kvroute/decide"
)

// runKV runs scenario name's seed 1 (its first n requests) at load × its family's capacity
// with kvroute's decision rule and returns the router as the run left it.
func runKV(t *testing.T, name string, rule decide.Rule, n int) (*kvRouter, *Result) {
	t.Helper()
	sc := scenario(t, name)
	sc.Requests = min(sc.Requests, n)
	capacity, _, err := Calibrate(sc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	k := newKVRouter(rule, "kv_test", 1)
	return k, Run(sc, b, 1, sc.Load*capacity, k)
}

// kvroute's learning, fed in virtual time, learns what the simulated engines are: the
// scenario's true chars per token (3.6 on chat-sessions-80, not the default 4), the engines'
// prefill and decode speeds, and a KV bound per engine in the tree.
func TestKVRouterLearns(t *testing.T) {
	sc := scenario(t, "chat-sessions-80")
	k, res := runKV(t, "chat-sessions-80", decide.Thresholds, 2000)
	model := res.Requests[0].Model
	cpt := k.charsPerToken(model)
	if math.Abs(cpt-sc.CharsPerToken) > 0.05*sc.CharsPerToken {
		t.Errorf("chars per token learned %.3f, the scenario's %.2f", cpt, sc.CharsPerToken)
	}
	t.Logf("chars per token learned %.3f (true %.2f)", cpt, sc.CharsPerToken)
	for i := range k.up {
		u := &k.up[i]
		t.Logf("engine %d: prefill %.0f tok/s (learned %v), answers %.0f, decode %.1f tok/s (learned %v), slots %d, mean output %.0f, capacity %d, held %d chars",
			i, u.prefillSpeed, u.prefillLearned, u.answerSpeed, u.decodeSpeed, u.decodeLearnd, u.slotCount, u.meanOutput, u.capacity, k.forest.TenantChars(k.ids[i]))
		if !u.prefillLearned || !u.decodeLearnd || u.answerSpeed <= 0 {
			t.Errorf("engine %d: speeds not learned (prefill %v, decode %v, answers %.0f)", i, u.prefillLearned, u.decodeLearnd, u.answerSpeed)
		}
		// One token per step of a few ms: tens to hundreds of tokens per second per request.
		if u.decodeSpeed < 20 || u.decodeSpeed > 400 {
			t.Errorf("engine %d: decode speed %.1f tokens/s per request is no simulated engine's", i, u.decodeSpeed)
		}
		want := int64(sc.Engines[i].CapacityBlocks * BlockTokens)
		if u.capacity != want {
			t.Errorf("engine %d: KV capacity %d, the engine's %d", i, u.capacity, want)
		}
		if held, bound := k.forest.TenantChars(k.ids[i]), int64(float64(want)*cpt*kvTenantSlack); held > bound+bound/10 {
			t.Errorf("engine %d: the tree holds %d chars for it, beyond its bound %d", i, held, bound)
		}
		if u.inFlight != 0 || u.queuedTokens != 0 || u.prefillTokens != 0 {
			t.Errorf("engine %d: after the run, in flight %d, queued %d, prefill %d", i, u.inFlight, u.queuedTokens, u.prefillTokens)
		}
	}
}

// restartWatch records, at the reading that first shows engine 1's new start time, what the
// kv router's tree held for it before and after taking the reading in.
type restartWatch struct {
	*kvRouter
	started        time.Duration
	seen           bool
	before, after  int64
	restartReading time.Duration
}

func (w *restartWatch) Reading(now time.Duration, i int, r engine.Reading) {
	if i != 1 {
		w.kvRouter.Reading(now, i, r)
		return
	}
	restarted := w.seen && r.Started != w.started
	w.seen, w.started = true, r.Started
	if restarted {
		w.before = w.forest.TenantChars(w.ids[1])
	}
	w.kvRouter.Reading(now, i, r)
	if restarted {
		w.after, w.restartReading = w.forest.TenantChars(w.ids[1]), now
	}
}

// A restart shows in the readings (a new start time): the router drops the engine's share of
// its tree, as kvroute's engineRestarted does, and the requests it aborted leave no count.
func TestKVRouterRestart(t *testing.T) {
	sc := scenario(t, "chat-restart-80")
	sc.Requests = 400
	sc.Restart.At = 5 * time.Second
	b, err := Build(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	w := &restartWatch{kvRouter: newKVRouter(decide.Thresholds, "kv_test", 1)}
	res := Run(sc, b, 1, 20, w)
	if w.restartReading == 0 || w.before == 0 || w.after != 0 {
		t.Errorf("restart reading at %v: the tree held %d chars for engine 1 before it, %d after", w.restartReading, w.before, w.after)
	}
	aborted := 0
	for _, r := range res.Requests {
		if r.Aborted {
			aborted++
		}
	}
	if aborted == 0 {
		t.Error("the restart aborted nothing")
	}
	for i := range w.up {
		if u := &w.up[i]; u.inFlight != 0 || u.queuedTokens != 0 || u.prefillTokens != 0 {
			t.Errorf("engine %d: after the run, in flight %d, queued %d, prefill %d", i, u.inFlight, u.queuedTokens, u.prefillTokens)
		}
	}
}

// Late binding (queue_timeout): on chat-closed-64 (64 clients on 32 batch slots) the router
// holds requests while every engine runs its learned slots, sends them in arrival order when
// a slot frees, never longer than the timeout (a request that waited it goes on as without
// late binding), loses none, and keeps the slots it learned while it holds (the engines then
// stop queueing: decide.Slots.ObserveHeld).
func TestKVLateBinding(t *testing.T) {
	sc := scenario(t, "chat-closed-64")
	sc.Requests = 16000 // about 6 min: longer than a slot sample stands (decide.SlotSampleLife)
	b, err := Build(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 2 * time.Second
	k := newKVRouter(decide.Thresholds, "kv_test", 1)
	k.queueTimeout = timeout
	res := Run(sc, b, 1, 0, k)
	var waited []*Request
	var longest time.Duration
	for _, r := range res.Requests {
		if r.Done == 0 || r.Engine < 0 {
			t.Fatalf("request %d not answered (engine %d)", r.ID, r.Engine)
		}
		if w := r.Routed - r.Arrival; w > 0 {
			waited = append(waited, r)
			longest = max(longest, w)
		}
	}
	if len(waited) < len(res.Requests)/10 {
		t.Errorf("%d of %d requests waited at the router, want many (64 clients on 32 slots)", len(waited), len(res.Requests))
	}
	// The simulator offers a request again when a request ends or a reading comes: a timed-out
	// one leaves at its bound (its wake-up), never later.
	if longest > timeout {
		t.Errorf("a request waited %v at the router, beyond queue_timeout %v", longest, timeout)
	}
	// One model: the requests that waited left in their arrival order.
	// (Requests sent at the same instant are in the order the simulator sent them, which the
	// figures do not show: each must leave no earlier than every request sent before it.)
	slices.SortStableFunc(waited, func(a, b *Request) int { return cmp.Compare(a.Arrival, b.Arrival) })
	var before, group time.Duration // the latest departure of the earlier arrivals; of this instant's
	for i := 1; i < len(waited); i++ {
		if waited[i].Arrival > waited[i-1].Arrival {
			before, group = max(before, group, waited[i-1].Routed), 0
		}
		group = max(group, waited[i-1].Routed)
		if waited[i].Routed < before {
			t.Fatalf("request %d (arrived %v) left at %v, before request %d (arrived %v) at %v",
				waited[i].ID, waited[i].Arrival, waited[i].Routed, waited[i-1].ID, waited[i-1].Arrival, waited[i-1].Routed)
		}
	}
	if k.misordered != 0 || k.queue.Len() != 0 || len(k.items) != 0 {
		t.Errorf("misordered %d, %d still queued (%d items)", k.misordered, k.queue.Len(), len(k.items))
	}
	for i := range k.up {
		if u := &k.up[i]; u.slotCount != int64(sc.Engines[i].MaxNumSeqs) {
			t.Errorf("engine %d: %d slots learned at the end, want its %d kept while the router held requests", i, u.slotCount, sc.Engines[i].MaxNumSeqs)
		}
	}
	if span := res.End - res.Start; span < time.Duration(decide.SlotSampleLife)+30*time.Second {
		t.Errorf("the run lasted %v: too short to see a learned slot count lapse", span)
	}
	t.Logf("%d of %d requests waited, the longest %v; the run lasted %v", len(waited), len(res.Requests), longest, res.End-res.Start)
}
