package fleetsim

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// The card's printed forms. The JSON holds every run (scenario × seed × policy); what is
// printed is the medians over the seeds: Standing, one line per scenario with where a policy
// stands against the best baseline on the figures issue 34 judges; Medians, every policy's
// figures per scenario with the best of each column marked; Table (scorecard.go), every run.

// column is one figure of the printed tables.
type column struct {
	name   string
	width  int
	format string
	better int // +1: higher is better, -1: lower is better
	help   string
	get    func(*Figures) float64
}

var columns = []column{
	{"hit", 6, "%.3f", +1, "share of the prompt tokens the engines found in their prefix cache", func(f *Figures) float64 { return float64(f.HitRatio) }},
	{"ttft_p50", 9, "%.1f", -1, "time to first token, ms: median (router queue included)", func(f *Figures) float64 { return float64(f.TTFTP50) }},
	{"ttft_p99", 9, "%.1f", -1, "time to first token, ms: 99th percentile", func(f *Figures) float64 { return float64(f.TTFTP99) }},
	{"e2e_p99", 9, "%.0f", -1, "time to the last token, ms: 99th percentile", func(f *Figures) float64 { return float64(f.E2EP99) }},
	{"rps", 7, "%.2f", +1, "requests answered per second", func(f *Figures) float64 { return float64(f.Throughput) }},
	{"goodput", 8, "%.2f", +1, "requests answered per second with a TTFT within the scenario's SLO", func(f *Figures) float64 { return float64(f.Goodput) }},
	{"imbal", 6, "%.2f", -1, "the busiest engine's requests in flight over the mean engine's, averaged over the run: 1.00 is even", func(f *Figures) float64 { return float64(f.Imbalance) }},
	{"qwait_p99", 10, "%.1f", -1, "time waited at the router before going to an engine, ms: 99th percentile (0 unless the policy holds requests)", func(f *Figures) float64 { return float64(f.QueueWaitP99) }},
	{"shed", 6, "%.2f", -1, "requests the router refused (429), per second", func(f *Figures) float64 { return float64(f.Shed) }},
	{"unserved", 9, "%.0f", -1, "requests sent and not answered when the run ended (still queued, or aborted by a restart)", func(f *Figures) float64 { return float64(f.Unserved) }},
}

// medianCard is a card's figures as medians over its seeds, per scenario (in the card's order)
// and policy, each class's too.
type medianCard struct {
	names []string
	seeds map[string]int
	slo   map[string]float64
	fig   map[string]map[string][]float64            // scenario → policy → per column
	class map[string]map[string]map[string][]float64 // scenario → policy → class → per column
	order []string
}

func (c *Card) medianCard() *medianCard {
	m := &medianCard{seeds: map[string]int{}, slo: map[string]float64{}, fig: map[string]map[string][]float64{},
		class: map[string]map[string]map[string][]float64{}, order: c.order}
	type acc = map[string][][]float64 // key → per column, the seeds' values
	runs := map[string]acc{}
	classRuns := map[string]map[string]acc{}
	add := func(a acc, key string, f *Figures) {
		if a[key] == nil {
			a[key] = make([][]float64, len(columns))
		}
		for i, col := range columns {
			a[key][i] = append(a[key][i], col.get(f))
		}
	}
	for _, s := range c.Scenarios {
		if runs[s.Name] == nil {
			m.names = append(m.names, s.Name)
			runs[s.Name], classRuns[s.Name] = acc{}, map[string]acc{}
			m.slo[s.Name] = float64(s.SLO)
		}
		m.seeds[s.Name]++
		for p, f := range s.Policies {
			add(runs[s.Name], p, f)
			for cl, cf := range f.Classes {
				if classRuns[s.Name][p] == nil {
					classRuns[s.Name][p] = acc{}
				}
				add(classRuns[s.Name][p], cl, cf)
			}
		}
	}
	meds := func(v [][]float64) []float64 {
		out := make([]float64, len(v))
		for i := range v {
			out[i] = median(v[i])
		}
		return out
	}
	for _, n := range m.names {
		m.fig[n], m.class[n] = map[string][]float64{}, map[string]map[string][]float64{}
		for p, v := range runs[n] {
			m.fig[n][p] = meds(v)
		}
		for p, cls := range classRuns[n] {
			m.class[n][p] = map[string][]float64{}
			for cl, v := range cls {
				m.class[n][p][cl] = meds(v)
			}
		}
	}
	if len(m.order) == 0 { // a card built by hand: its policies by name
		seen := map[string]bool{}
		for _, ps := range m.fig {
			for p := range ps {
				if !seen[p] {
					seen[p] = true
					m.order = append(m.order, p)
				}
			}
		}
		slices.Sort(m.order)
	}
	return m
}

// best is the best value of column i among rows (NaN skipped); ok is false when there is none
// or when every row has the same value (no row stands out).
func best(rows [][]float64, i int) (v float64, ok bool) {
	v = math.NaN()
	distinct := false
	for _, r := range rows {
		x := r[i]
		if math.IsNaN(x) {
			continue
		}
		if math.IsNaN(v) {
			v = x
			continue
		}
		if x != v {
			distinct = true
		}
		if columns[i].better > 0 && x > v || columns[i].better < 0 && x < v {
			v = x
		}
	}
	return v, distinct
}

// cell formats v in column i, with a mark (one char) after it.
func cell(i int, v float64, mark string) string {
	s := "-"
	if !math.IsNaN(v) {
		s = fmt.Sprintf(columns[i].format, v)
	}
	return fmt.Sprintf("%*s", columns[i].width, s+mark)
}

// Legend writes what the printed columns mean.
func Legend(w io.Writer) {
	fmt.Fprintln(w, "Columns (each the median over the scenario's seeds; every run is in scorecard.json):")
	for _, c := range columns {
		dir := "higher is better"
		if c.better < 0 {
			dir = "lower is better"
		}
		fmt.Fprintf(w, "  %-10s %s (%s)\n", c.name, c.help, dir)
	}
	fmt.Fprintln(w, "  slo        the scenario's TTFT bound for goodput, ms: 3 × the oracle's median TTFT at half the fleet's capacity")
	fmt.Fprintln(w, "Policies: kv_cache_aware is kvroute as it ships (kv_thresholds and kv_cost: its two decisions; kv_flow: with")
	fmt.Fprintln(w, "flow_control, in the flow scenarios); the baselines are sglang (SGLang's cache-aware router), least_conn,")
	fmt.Fprintln(w, "round_robin and prefix_hash; oracle is a greedy router that sees every engine's cache and queue, a bound")
	fmt.Fprintln(w, "to measure against, never counted as the best.")
}

// Medians writes, per scenario, every policy's median figures, a * after the best value of each
// column among the policies (the oracle aside, and unmarked; no mark where all are equal), each
// class's figures indented under its policy, in the card's order of the policies.
func (c *Card) Medians(w io.Writer) {
	m := c.medianCard()
	for _, n := range m.names {
		fmt.Fprintf(w, "\n%s: %d seed(s), slo %.0f ms\n", n, m.seeds[n], m.slo[n])
		head := fmt.Sprintf("  %-16s", "policy")
		for _, col := range columns {
			head += fmt.Sprintf(" %*s", col.width, col.name)
		}
		fmt.Fprintln(w, head)
		var rows [][]float64
		for _, p := range m.order {
			if r := m.fig[n][p]; r != nil && p != "oracle" {
				rows = append(rows, r)
			}
		}
		for _, p := range m.order {
			r := m.fig[n][p]
			if r == nil {
				continue
			}
			if p == "oracle" {
				fmt.Fprintln(w, medianRow("  "+p, r, nil))
				continue
			}
			fmt.Fprintln(w, medianRow("  "+p, r, rows))
			var classes []string
			for cl := range m.class[n][p] {
				classes = append(classes, cl)
			}
			slices.Sort(classes)
			for _, cl := range classes {
				var crows [][]float64
				for _, q := range m.order {
					if r := m.class[n][q][cl]; r != nil && q != "oracle" {
						crows = append(crows, r)
					}
				}
				fmt.Fprintln(w, medianRow("    "+cl, m.class[n][p][cl], crows))
			}
		}
	}
}

func medianRow(name string, r []float64, rows [][]float64) string {
	line := fmt.Sprintf("%-18s", name)
	for i := range columns {
		mark := " "
		if b, ok := best(rows, i); ok && r[i] == b {
			mark = "*"
		}
		line += " " + cell(i, r[i], mark)
	}
	return strings.TrimRight(line, " ")
}

// byWidth is the width of a baseline's name in Standing.
const byWidth = 11

// standingColumns are the figures Standing shows (issue 34's: hit ratio, TTFT p50 and p99,
// goodput).
var standingColumns = []int{0, 1, 2, 5}

// Standing writes, per scenario, policy's median of each of issue 34's figures beside the best
// baseline's (BaselineNames: the oracle and kvroute's own policies aside) and who has it, a *
// after policy's value where it is at least as good, then how many scenarios that makes.
func (c *Card) Standing(w io.Writer, policy string) {
	m := c.medianCard()
	fmt.Fprintf(w, "Where %s stands, per figure: its median (value), the best baseline's (best: %s) and who has it (by);\n",
		policy, strings.Join(BaselineNames, ", "))
	fmt.Fprintf(w, "* where %s is at least as good\n", policy)
	names, sub := fmt.Sprintf("%-26s", ""), fmt.Sprintf("%-26s", "scenario")
	for _, i := range standingColumns {
		wd := columns[i].width
		names += fmt.Sprintf("  %-*s", 2*wd+2+byWidth, columns[i].name)
		sub += fmt.Sprintf("  %*s %*s %-*s", wd, "value ", wd, "best ", byWidth, "by")
	}
	fmt.Fprintln(w, strings.TrimRight(names, " "))
	fmt.Fprintln(w, strings.TrimRight(sub, " "))
	atLeast := make([]int, len(standingColumns))
	judged := 0
	for _, n := range m.names {
		r := m.fig[n][policy]
		if r == nil {
			continue
		}
		judged++
		line := fmt.Sprintf("%-26s", n)
		for k, i := range standingColumns {
			bv, by := math.NaN(), ""
			for _, b := range BaselineNames {
				x, ok := m.fig[n][b]
				if !ok || math.IsNaN(x[i]) {
					continue
				}
				if math.IsNaN(bv) || columns[i].better > 0 && x[i] > bv || columns[i].better < 0 && x[i] < bv {
					bv, by = x[i], b
				}
			}
			mark := " "
			if !math.IsNaN(r[i]) && !math.IsNaN(bv) && (columns[i].better > 0 && r[i] >= bv || columns[i].better < 0 && r[i] <= bv) {
				mark = "*"
				atLeast[k]++
			}
			if by == "" {
				by = "-"
			}
			line += fmt.Sprintf("  %s %s %-*s", cell(i, r[i], mark), cell(i, bv, " "), byWidth, by)
		}
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
	if judged == 0 {
		fmt.Fprintf(w, "  (no scenario has %s)\n", policy)
		return
	}
	var parts []string
	for k, i := range standingColumns {
		parts = append(parts, fmt.Sprintf("%s %d", columns[i].name, atLeast[k]))
	}
	fmt.Fprintf(w, "%s at least as good as the best baseline, of %d scenarios: %s\n", policy, judged, strings.Join(parts, ", "))
}
