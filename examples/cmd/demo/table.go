package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"unicode/utf8"
)

// table is a plain-text table: the first column left-aligned, the others right-aligned.
type table struct {
	header []string
	rows   [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

// write prints the table with two spaces between columns and a rule under the header.
func (t *table) write(w io.Writer) {
	widths := make([]int, len(t.header))
	for _, row := range append([][]string{t.header}, t.rows...) {
		for i, c := range row {
			if i < len(widths) {
				widths[i] = max(widths[i], utf8.RuneCountInString(c))
			}
		}
	}
	line := func(row []string) {
		var b strings.Builder
		for i, c := range row {
			if i >= len(widths) {
				break
			}
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			switch {
			case i == 0:
				b.WriteString(c + pad)
			default:
				b.WriteString("  " + pad + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	line(t.header)
	total := 0
	for _, n := range widths {
		total += n + 2
	}
	fmt.Fprintln(w, strings.Repeat("-", total-2))
	for _, row := range t.rows {
		line(row)
	}
}

// fmtMs formats milliseconds: "850ms", "1.25s", "12.3s".
func fmtMs(ms float64) string {
	switch {
	case ms < 1000:
		return fmt.Sprintf("%.0fms", ms)
	case ms < 10000:
		return fmt.Sprintf("%.2fs", ms/1000)
	default:
		return fmt.Sprintf("%.1fs", ms/1000)
	}
}

// fmtSpan formats a ratio with its range when the runs differ: "0.612 (0.598-0.620)".
func fmtSpan(s span, prec int) string {
	v := fmt.Sprintf("%.*f", prec, s.Mean)
	if s.Max-s.Min >= 0.5*pow10(-prec) {
		v += fmt.Sprintf(" (%.*f-%.*f)", prec, s.Min, prec, s.Max)
	}
	return v
}

func pow10(n int) float64 {
	p := 1.0
	for ; n > 0; n-- {
		p *= 10
	}
	for ; n < 0; n++ {
		p /= 10
	}
	return p
}

// fmtPerWorker formats requests per worker as "128/130/127/127" (means, rounded).
func fmtPerWorker(s summary) string {
	parts := make([]string, len(s.PerWorker))
	for i, n := range s.PerWorker {
		parts[i] = fmt.Sprintf("%.0f", n)
	}
	out := strings.Join(parts, "/")
	if s.Unattributed > 0 {
		out += fmt.Sprintf(" +%.0f?", s.Unattributed)
	}
	return out
}

// printComparison prints the comparison table with its footnotes.
func printComparison(w io.Writer, results []*policyResult, addrs []string, cfg *config) {
	t := &table{header: []string{"policy", "hit ratio", "hit/ref", "TTFT p50", "TTFT p99",
		"latency p50", "latency p99", "requests per worker", "imbalance", "errors"}}
	if cfg.energy != nil {
		t.header = append(t.header, "J/request")
	}
	var refs, infs []float64
	for _, r := range results {
		s := r.Summary
		t.add(r.Label, fmtSpan(s.HitRatio, 3), fmt.Sprintf("%.2f", s.HitOverReference),
			fmtMs(s.TTFTP50Ms), fmtMs(s.TTFTP99Ms), fmtMs(s.LatencyP50Ms), fmtMs(s.LatencyP99Ms),
			fmtPerWorker(s), fmtSpan(s.Imbalance, 2), fmt.Sprint(s.Errors))
		if cfg.energy != nil {
			row := &t.rows[len(t.rows)-1]
			*row = append(*row, fmtSpan(newSpan(r.Joules), 1))
		}
		for _, run := range r.Runs {
			refs = append(refs, run.ReferenceHitRatio)
			infs = append(infs, run.InfiniteHitRatio)
		}
	}
	ref, inf := newSpan(refs), newSpan(infs)
	title := fmt.Sprintf("Comparison: %s workload, %s, %d workers × %d blocks", cfg.kind, cfg.loopDescription(), cfg.workers, cfg.blocks)
	if cfg.repeats > 1 {
		title += fmt.Sprintf(", mean of %d runs (min-max)", cfg.repeats)
	}
	fmt.Fprintln(w, title)
	if v := verdict(results); v != "" {
		fmt.Fprintln(w, v)
	}
	if len(cfg.kvOptions) > 0 {
		fmt.Fprintf(w, "kv_cache_aware options: %s\n", strings.Join(cfg.kvOptions, "; "))
	}
	t.write(w)
	fmt.Fprintf(w, "reference (one LRU with the fleet's %d blocks, same prompts in the order sent): hit ratio %s\n",
		cfg.workers*cfg.blocks, fmtSpan(ref, 3))
	fmt.Fprintf(w, "infinite cache: hit ratio %s\n", fmtSpan(inf, 3))
	for _, n := range footnotes(results, cfg) {
		fmt.Fprintln(w, n)
	}
}

// footnotes returns the notes under the comparison table.
func footnotes(results []*policyResult, cfg *config) []string {
	notes := []string{
		"hit ratio: cached / prompt tokens as the workers reported them; hit/ref: hit ratio / reference, per run;",
		"imbalance: max / mean requests per worker (1 = even); workers in the order " + workerOrder(cfg.workers) + ".",
	}
	if cfg.slow > 0 {
		notes = append(notes, fmt.Sprintf("slow workers: %s, %g× the prefill and decode time of the others.", slowNames(cfg.workers, cfg.slow), cfg.slowFactor))
	}
	if cfg.energy != nil {
		var ws []string
		for i, e := range cfg.energy {
			ws = append(ws, fmt.Sprintf("w%d %s", i, e))
		}
		notes = append(notes, "J/request: each request charged at the worker that served it, (prompt - cached tokens) × its prefill energy + output tokens × its decode energy, per token prefill/decode: "+strings.Join(ws, ", ")+".")
	}
	if cfg.restartAt > 0 {
		notes = append(notes, fmt.Sprintf("w0 restarted with an empty cache %v into each run.", cfg.restartAt))
	}
	if cfg.fleet == "ollama" {
		notes = append(notes, "Ollama reports no cached tokens: the hit ratio reads 0 for every policy; compare the TTFT (the reference is our simulator's blocks, indicative only).")
	}
	for _, r := range results {
		if r.Policy != "header" {
			continue
		}
		if cfg.kind == "chat" && cfg.sessionHeader {
			notes = append(notes, "header X-Session-ID: every conversation sends its id, so Caddy hashes it to a worker (kv_cache_aware binds it as a session too).")
		} else {
			notes = append(notes, "header X-Session-ID: the requests carry no session header (-session-header off), so Caddy's header policy falls back to random.")
		}
	}
	if cfg.fleet == "llmd" {
		notes = append(notes, "llmd fleet: llm-d-inference-sim counts the tokens (its dummy tokenizer: words and punctuation); the reference replays the prompts through the same tokenization into one LRU.")
	}
	return notes
}

func workerOrder(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("w%d", i)
	}
	return strings.Join(names, "/")
}

// printEnergy prints, with -energy, each policy's joules per request and TTFT p99 over its
// runs as medians (min-max), and each against kv_cache_aware with decision cost's (kv_cost)
// when it ran: the trade the energy objective makes.
func printEnergy(w io.Writer, results []*policyResult, cfg *config) {
	if cfg.energy == nil {
		return
	}
	var ref *policyResult
	for _, r := range results {
		if r.Policy == "kv_cost" {
			ref = r
		}
	}
	t := &table{header: []string{"policy", "J/request", "TTFT p99 ms"}}
	if ref != nil {
		t.header = append(t.header, "J ÷ kv_cost", "p99 ÷ kv_cost")
	}
	p99s := func(r *policyResult) []float64 {
		xs := make([]float64, len(r.Runs))
		for i, run := range r.Runs {
			xs[i] = run.TTFTP99Ms
		}
		return xs
	}
	med := func(xs []float64, prec int) string {
		m, lo, hi := medianSpan(xs)
		return fmt.Sprintf("%.*f (%.*f-%.*f)", prec, m, prec, lo, prec, hi)
	}
	for _, r := range results {
		row := []string{r.Label, med(r.Joules, 1), med(p99s(r), 0)}
		if ref != nil {
			jr, _, _ := medianSpan(ref.Joules)
			pr, _, _ := medianSpan(p99s(ref))
			jm, _, _ := medianSpan(r.Joules)
			pm, _, _ := medianSpan(p99s(r))
			row = append(row, ratio(jm, jr, 3), ratio(pm, pr, 2))
		}
		t.add(row...)
	}
	fmt.Fprintf(w, "\nenergy, medians over the runs (min-max):\n")
	t.write(w)
}

// ratio is a/b with prec decimals, or "-" when b is not a positive figure (a reference run
// that reported no tokens spends 0 J).
func ratio(a, b float64, prec int) string {
	if !(b > 0) || math.IsNaN(a) {
		return "-"
	}
	return fmt.Sprintf("%.*f", prec, a/b)
}
