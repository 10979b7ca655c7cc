package fleetsim_test

import (
	"fmt"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/fleetsim"
	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
)

// fewestWaiting routes by the engines' latest readings alone: the fewest running plus waiting
// requests at the last telemetry interval, plus what it sent since.
type fewestWaiting struct {
	reported []int
	sent     []int
}

func (f *fewestWaiting) Start(engines []fleetsim.EngineInfo) {
	f.reported = make([]int, len(engines))
	f.sent = make([]int, len(engines))
}

func (f *fewestWaiting) Route(now time.Duration, req *fleetsim.Request) int {
	best := 0
	for i := range f.reported {
		if f.reported[i]+f.sent[i] < f.reported[best]+f.sent[best] {
			best = i
		}
	}
	f.sent[best]++
	return best
}

func (f *fewestWaiting) Reading(now time.Duration, i int, r engine.Reading) {
	f.reported[i] = r.Running + r.Waiting
	f.sent[i] = 0
}

func (f *fewestWaiting) FirstToken(time.Duration, *fleetsim.Request, int) {}

func (f *fewestWaiting) Done(time.Duration, *fleetsim.Request, int, fleetsim.Usage) {}

// A router of one's own on one scenario: build the workload for a seed, run it at a rate, and
// measure against an SLO.
func ExampleRun() {
	var sc *fleetsim.Scenario
	for _, s := range fleetsim.Scenarios() {
		if s.Name == "chat-80" {
			sc = s
		}
	}
	sc.Requests = 400
	built, err := fleetsim.Build(sc, 1)
	if err != nil {
		panic(err)
	}
	res := fleetsim.Run(sc, built, 1, 10, &fewestWaiting{})
	f := fleetsim.Measure(res, 100*time.Millisecond)
	fmt.Printf("%d requests, throughput %.1f/s\n", len(res.Requests), f.Throughput)
	// Output: 400 requests, throughput 9.8/s
}
