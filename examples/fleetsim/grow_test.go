package fleetsim

import (
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
	"github.com/kvroute/caddy-kvroute/kvroute/decide"
)

// reloads wraps a router and records what the simulator tells it: the engines at the start
// and at the reload, and which engines' readings came when.
type reloads struct {
	Router
	t        *testing.T
	started  int
	reloaded time.Duration
	after    int // engines after the reload
	early    int // readings of a joining engine before the reload
	readings map[int]int
	// before, when set, is called just before the reload reaches the router.
	before func()
}

func (r *reloads) See(engines []*engine.Engine) {
	if o, ok := r.Router.(Omniscient); ok {
		o.See(engines)
	}
}

func (r *reloads) Start(engines []EngineInfo) {
	r.started = len(engines)
	r.Router.Start(engines)
}

func (r *reloads) Reload(now time.Duration, engines []EngineInfo) {
	if r.reloaded > 0 {
		r.t.Errorf("a second reload at %v", now)
	}
	r.reloaded, r.after = now, len(engines)
	if r.before != nil {
		r.before()
	}
	r.Router.(Reloader).Reload(now, engines)
}

func (r *reloads) Reading(now time.Duration, i int, rd engine.Reading) {
	if i >= r.started && r.reloaded == 0 {
		r.early++
	}
	r.readings[i]++
	r.Router.Reading(now, i, rd)
}

// A fleet that grows: no router sees the joining engines before the reload, and every router
// sends them a share of the requests after it. The workload is the conversation look-alike,
// whose new conversations share only a first block with the others: a prefix-aware router
// places them by load or by its trees' sizes, where a new engine is the emptiest. (On chat,
// SGLang's rule would send the new engines nothing at this load: every prompt matches a
// system prompt on an old engine, and the loads stay inside its balance band.)
func TestGrow(t *testing.T) {
	sc := scenario(t, "conversation-80")
	sc.Engines = fleet(8, traceEngine())
	sc.Grow = &Grow{Engines: 4, Share: 0.5}
	sc.Requests = 600
	b, err := Build(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Policies {
		t.Run(p.Name, func(t *testing.T) {
			r := &reloads{Router: p.New(1), t: t, readings: map[int]int{}}
			res := Run(sc, b, 1, 4, r)
			if r.started != 4 || r.after != 8 || r.reloaded == 0 {
				t.Fatalf("started with %d engines, reloaded at %v with %d", r.started, r.reloaded, r.after)
			}
			if r.early > 0 {
				t.Errorf("%d readings of a joining engine before it joined", r.early)
			}
			sent := 0
			late, joined := 0, 0
			for _, q := range res.Requests {
				if q.Engine < 0 {
					continue
				}
				if q.Arrival < r.reloaded {
					sent++
					if q.Engine >= 4 {
						t.Fatalf("request %d sent at %v went to engine %d before it joined at %v", q.ID, q.Arrival, q.Engine, r.reloaded)
					}
					continue
				}
				late++
				if q.Engine >= 4 {
					joined++
				}
			}
			if sent != len(res.Requests)/2 {
				t.Errorf("%d requests sent before the engines joined, want half of %d", sent, len(res.Requests))
			}
			// Half the fleet is new: a router that sends it less than a fifth of the second
			// half's requests has not learned of it (prefix-aware routers keep conversations
			// where they began, so not half).
			if float64(joined) < 0.2*float64(late) {
				t.Errorf("the joining engines took %d of the %d requests sent after they joined", joined, late)
			}
			for i := 4; i < 8; i++ {
				if r.readings[i] == 0 {
					t.Errorf("engine %d: no reading after it joined", i)
				}
			}
		})
	}
}

// kvroute's router keeps what it learned of the engines it had across the reload and learns
// the new ones from their readings.
func TestGrowKVRouterLearns(t *testing.T) {
	sc := scenario(t, "chat-80")
	sc.Engines = fleet(8, chatEngine())
	sc.Grow = &Grow{Engines: 4, Share: 0.5}
	sc.Requests = 1200
	b, err := Build(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	k := newKVRouter(decide.DefaultRule, "kv", 1)
	var before [4]float64
	Run(sc, b, 1, 20, &reloads{Router: k, t: t, readings: map[int]int{}, before: func() {
		for i := range before {
			if k.up[i].prefillLearned {
				before[i] = k.up[i].prefillSpeed
			}
		}
	}})
	if len(k.up) != 8 || len(k.ids) != 8 {
		t.Fatalf("%d upstreams after the reload", len(k.up))
	}
	for i := range 4 {
		if before[i] == 0 || !k.up[i].prefillLearned {
			t.Errorf("engine %d: prefill speed not learned before the reload (%v) or lost after it", i, before[i])
		}
	}
	for i := 4; i < 8; i++ {
		if !k.up[i].learned || k.up[i].capacity == 0 {
			t.Errorf("engine %d: nothing learned after it joined (%+v)", i, k.up[i])
		}
	}
}

// Restart.Share restarts the engine when that share of the requests has been sent: the
// requests it held end aborted at that moment, the send of request n/2+1.
func TestRestartHalfway(t *testing.T) {
	sc := scenario(t, "chat-closed-16")
	sc.Requests = 400
	sc.Restart = &Restart{Engine: 1, Share: 0.5}
	b, err := Build(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	res := Run(sc, b, 1, 0, policy(t, "least_conn").New(1))
	arrivals := make([]time.Duration, 0, len(res.Requests))
	for _, q := range res.Requests {
		arrivals = append(arrivals, q.Arrival)
	}
	slices.Sort(arrivals)
	at := arrivals[len(arrivals)/2]
	aborted := 0
	for _, q := range res.Requests {
		if q.Aborted {
			aborted++
			if q.Engine != 1 || q.Done != at {
				t.Errorf("request %d aborted on engine %d at %v, want engine 1 at %v", q.ID, q.Engine, q.Done, at)
			}
		}
	}
	if aborted == 0 {
		t.Errorf("the restart at %v aborted nothing", at)
	}
}

// The card's scenarios that change the fleet while they run write the same card twice.
func TestChangingFleetDeterministic(t *testing.T) {
	if _, err := MooncakeWorkload(1); err != nil {
		t.Skip(err)
	}
	opts := Options{Scenarios: regexp.MustCompile(`^(mooncake-grow-4-8|mooncake-closed-restart|mooncake-cold-16-4slots)$`), Seeds: 1, MaxRequests: 300}
	var out [2][]byte
	for i := range out {
		card, err := RunCard(opts)
		if err != nil {
			t.Fatal(err)
		}
		if out[i], err = card.JSON(); err != nil {
			t.Fatal(err)
		}
	}
	if string(out[0]) != string(out[1]) {
		t.Errorf("two runs differ:\n%s\n---\n%s", out[0], out[1])
	}
}
