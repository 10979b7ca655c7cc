package fleetsim

import (
	"slices"
	"testing"
)

// workloadStats returns a trace workload's input tokens mean, p50, p90, p99, output mean, and
// the block hit ratio of an infinite cache.
func workloadStats(w *Workload) (mean, p50, p90, p99, out, inf float64) {
	var in []int
	seen := map[uint64]bool{}
	hit, total := 0, 0
	outSum := 0
	for _, s := range w.sessions {
		for _, c := range s.calls {
			n := 0
			matched := true
			for _, sg := range c.segs {
				n += sg.tokens
				if matched && seen[sg.id] {
					hit++
				} else {
					matched = false
				}
				seen[sg.id] = true
				total++
			}
			in = append(in, n)
			outSum += c.output
		}
	}
	slices.Sort(in)
	sum := 0
	for _, v := range in {
		sum += v
	}
	q := func(p float64) float64 { return float64(in[int(p*float64(len(in)-1))]) }
	return float64(sum) / float64(len(in)), q(0.5), q(0.9), q(0.99), float64(outSum) / float64(len(in)), float64(hit) / float64(total)
}

// The conversation look-alike stays near the published trace's figures: mean input 12,035,
// p50 6,909, p99 85,399 tokens, output mean 343, infinite-cache block hits 0.37.
func TestLookAlikes(t *testing.T) {
	mean, p50, p90, p99, out, inf := workloadStats(ConversationWorkload(6000, 1))
	t.Logf("conversation look-alike: input mean %.0f p50 %.0f p90 %.0f p99 %.0f, output mean %.0f, infinite cache %.3f", mean, p50, p90, p99, out, inf)
	if mean < 0.75*12035 || mean > 1.25*12035 || p50 < 0.7*6909 || p50 > 1.3*6909 || out < 280 || out > 410 || inf < 0.30 || inf > 0.45 {
		t.Error("the look-alike strays from the trace's figures")
	}
	mean, p50, p90, p99, out, inf = workloadStats(ToolAgentWorkload(6000, 1))
	t.Logf("tool-agent look-alike: input mean %.0f p50 %.0f p90 %.0f p99 %.0f, output mean %.0f, infinite cache %.3f", mean, p50, p90, p99, out, inf)
	if mean < 0.75*8596 || mean > 1.25*8596 || out < 140 || out > 230 {
		t.Error("the tool-agent look-alike strays from the README's averages")
	}
}
