package fleetsim

import (
	"fmt"
	"io"
	"math"
	"slices"
)

// Issue 35's targets for flow control, judged on a card that ran the flow scenarios: each
// figure is the median over the card's seeds of one policy's figure (a class's where named).
//
//   - tenants: the light tenant's TTFT p99 in tenants_flood within FlowLightP99 × its TTFT p99
//     in tenants_alone (the same policy, the fleet to itself at the same rate); the heavy
//     tenant's throughput at least FlowHeavyShare × what the fleet serves beyond the light
//     tenant's (the fleet's throughput on tenants_flood without flow control, kv_cache_aware's,
//     less the light tenant's under the policy); the fleet's throughput at least FlowFleet ×
//     kv_cache_aware's on tenants_flood (flow control costs the fleet little);
//   - priority: the interactive band's TTFT p99 in priority_flood within FlowInteractiveP99 ×
//     its TTFT p99 in priority_alone;
//   - the router's queue wait p99 at most FlowQueueWaitMs in the alone scenarios (a fleet at 15%
//     and 50% of capacity: at most 80%).
const (
	FlowLightP99       = 1.5
	FlowHeavyShare     = 0.9
	FlowFleet          = 0.97
	FlowInteractiveP99 = 1.25
	FlowQueueWaitMs    = 1.0
)

// FlowTarget is one target for one policy: the figure (a ratio, or milliseconds for the queue
// wait), what it is made of, and whether it is met.
type FlowTarget struct {
	Name   string
	Policy string
	Value  float64
	Detail string
	Met    bool
}

// FlowTargets judges the card's flow scenarios for each of policies it ran them with; nil when
// the card lacks them.
func (c *Card) FlowTargets(policies []string) []FlowTarget {
	med := func(scen, pol, class string, fig func(*Figures) Num) float64 {
		var v []float64
		for _, s := range c.Scenarios {
			if s.Name != scen {
				continue
			}
			f := s.Policies[pol]
			if f != nil && class != "" {
				f = f.Classes[class]
			}
			if f == nil {
				continue
			}
			if x := float64(fig(f)); !math.IsNaN(x) {
				v = append(v, x)
			}
		}
		if len(v) == 0 {
			return math.NaN()
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	p99 := func(f *Figures) Num { return f.TTFTP99 }
	thr := func(f *Figures) Num { return f.Throughput }
	wait := func(f *Figures) Num { return f.QueueWaitP99 }
	var out []FlowTarget
	add := func(name, pol string, v float64, met bool, detail string, args ...any) {
		if math.IsNaN(v) {
			return
		}
		out = append(out, FlowTarget{Name: name, Policy: pol, Value: v, Met: met, Detail: fmt.Sprintf(detail, args...)})
	}
	base := med("tenants_flood", "kv_cache_aware", "", thr)
	for _, p := range policies {
		alone, flood := med("tenants_alone", p, "light", p99), med("tenants_flood", p, "light", p99)
		r := flood / alone
		add("light_ttft_p99", p, r, r <= FlowLightP99, "light TTFT p99 %.0f ms flooded / %.1f ms alone (≤ %.2f×)", flood, alone, FlowLightP99)
		heavy, light := med("tenants_flood", p, "heavy", thr), med("tenants_flood", p, "light", thr)
		r = heavy / (base - light)
		add("heavy_throughput", p, r, r >= FlowHeavyShare, "heavy %.2f rps / (fleet without flow control %.2f − light %.2f) (≥ %.2f×)", heavy, base, light, FlowHeavyShare)
		all := med("tenants_flood", p, "", thr)
		r = all / base
		add("fleet_throughput", p, r, r >= FlowFleet, "fleet %.2f rps / %.2f without flow control (≥ %.2f×)", all, base, FlowFleet)
		alone, flood = med("priority_alone", p, "interactive", p99), med("priority_flood", p, "interactive", p99)
		r = flood / alone
		add("interactive_ttft_p99", p, r, r <= FlowInteractiveP99, "interactive TTFT p99 %.0f ms flooded / %.1f ms alone (≤ %.2f×)", flood, alone, FlowInteractiveP99)
		w := max(med("tenants_alone", p, "", wait), med("priority_alone", p, "", wait))
		add("queue_wait_p99", p, w, w <= FlowQueueWaitMs, "router queue wait p99 %.3f ms at 15%% and 50%% of capacity, the larger (≤ %.0f ms)", w, FlowQueueWaitMs)
	}
	return out
}

// WriteFlowTargets writes the card's flow targets for policies, one line each; nothing when
// the card did not run the flow scenarios.
func (c *Card) WriteFlowTargets(w io.Writer, policies []string) {
	ts := c.FlowTargets(policies)
	if len(ts) == 0 {
		return
	}
	fmt.Fprintln(w, "flow-control targets (issue 35), medians over seeds:")
	for _, t := range ts {
		mark := "met"
		if !t.Met {
			mark = "MISSED"
		}
		fmt.Fprintf(w, "  %-21s %-15s %8.3f  %-6s %s\n", t.Name, t.Policy, t.Value, mark, t.Detail)
	}
}
