package main

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"os"
	"strings"
	"time"
)

// writeReport writes a self-contained HTML page (inline CSS and SVG, no scripts) with the
// comparison's charts and tables.
func writeReport(path string, out *output) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	data := reportData{Out: out, Generated: time.Now().Format(time.RFC1123)}
	if len(out.Policies) > 0 {
		data.HitChart = template.HTML(hitChart(out.Policies))
		data.TTFTChart = template.HTML(ttftChart(out.Policies))
		data.LoadChart = template.HTML(loadChart(out.Policies, out.Addrs))
		var refs, infs []float64
		for _, p := range out.Policies {
			for _, r := range p.Runs {
				refs, infs = append(refs, r.ReferenceHitRatio), append(infs, r.InfiniteHitRatio)
			}
		}
		data.Reference, data.Infinite = mean(refs), mean(infs)
	}
	if err := reportTemplate.Execute(f, data); err != nil {
		return err
	}
	return f.Close()
}

type reportData struct {
	Out                            *output
	Generated                      string
	HitChart, TTFTChart, LoadChart template.HTML
	Reference, Infinite            float64
}

var reportTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"verdict":   verdict,
	"ms":        fmtMs,
	"msNaN":     fmtMsNaN,
	"span":      fmtSpan,
	"spanOf":    newSpan,
	"perWorker": fmtPerWorker,
	"f2":        func(x float64) string { return fmt.Sprintf("%.2f", x) },
	"f3":        func(x float64) string { return fmt.Sprintf("%.3f", x) },
	"f0":        func(x float64) string { return fmt.Sprintf("%.0f", x) },
	"heat": func(x, lo, hi float64) template.CSS {
		t := 0.0
		if hi > lo {
			t = (x - lo) / (hi - lo)
		}
		return template.CSS(fmt.Sprintf("background: hsl(140, 55%%, %.0f%%)", 95-35*t))
	},
	"sweepRange": sweepRange,
	"join":       strings.Join,
}).Parse(reportHTML))

// sweepRange returns the least and greatest mean hit ratio of the sweep.
func sweepRange(points []*sweepPoint) [2]float64 {
	r := [2]float64{math.Inf(1), math.Inf(-1)}
	for _, p := range points {
		h := p.Result.Summary.HitRatio.Mean
		r[0], r[1] = min(r[0], h), max(r[1], h)
	}
	return r
}

const reportHTML = `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>kvroute demo report</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.8em 0; }
th, td { padding: 3px 9px; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { background: #f4f4f4; }
code { background: #f4f4f4; padding: 1px 4px; }
.note { color: #555; font-size: 0.92em; }
svg text { font: 12px system-ui, sans-serif; fill: #222; }
</style></head><body>
<h1>kvroute demo: load-balancing policies for LLM prefix caches</h1>
<p class="note">Generated {{.Generated}} by <code>examples/cmd/demo</code>.
Fleet: {{.Out.Params.Workers}} × {{.Out.Params.Fleet}} workers, {{.Out.Params.BlocksPerWorker}} KV blocks each.
Workload: {{.Out.Params.Workload}}{{if .Out.Params.Conversations}} ({{.Out.Params.Conversations}} conversations × {{.Out.Params.Turns}} turns, {{.Out.Params.SystemPrompts}} system prompts){{end}}, {{.Out.Params.Loop}}{{if .Out.Params.SessionHeader}}, with X-Session-ID{{else}}, no session header{{end}}.
Runs per policy: {{.Out.Params.Repeats}}.{{if .Out.Params.KVOptions}} kv_cache_aware options: <code>{{join .Out.Params.KVOptions "; "}}</code>.{{end}}
Wall time {{f0 .Out.WallSeconds}} s.</p>
{{with verdict .Out.Policies}}<p><strong>{{.}}</strong></p>{{end}}

{{with .Out.Walkthrough}}
<h2>Walkthrough: kv_cache_aware</h2>
<table><tr><th>request</th><th>worker</th><th>prompt tokens</th><th>cached tokens</th><th>answer, ms</th></tr>
{{range .}}<tr><td>{{.What}}</td><td>{{if .Error}}{{.Error}}{{else}}{{.Worker}}{{end}}</td><td>{{.PromptTokens}}</td><td>{{.CachedTokens}}</td><td>{{f0 .Ms}}</td></tr>
{{end}}</table>
{{end}}

{{if .Out.Policies}}
<h2>Prefix cache hit ratio</h2>
{{.HitChart}}
<p class="note">Σ cached / Σ prompt tokens, as the workers reported them. Reference ({{f3 .Reference}}): the same prompts in the order sent through one LRU with the whole fleet's capacity. Infinite ({{f3 .Infinite}}): an unlimited cache.</p>
<h2>Time to first token, p99 (p50 inside)</h2>
{{.TTFTChart}}
<h2>Requests per upstream</h2>
{{.LoadChart}}
<p class="note">Dashed: an even share. Caddy names the upstream it dialed in a response header, so the counts come from the proxy.</p>
<h2>Table</h2>
<table><tr><th>policy</th><th>hit ratio</th><th>hit / ref</th><th>TTFT p50</th><th>TTFT p99</th><th>latency p50</th><th>latency p99</th><th>per worker</th><th>imbalance</th><th>errors</th>{{if .Out.Params.Energy}}<th>J/request</th>{{end}}</tr>
{{range .Out.Policies}}<tr><td>{{.Label}}</td>{{with .Summary}}<td>{{span .HitRatio 3}}</td><td>{{f2 .HitOverReference}}</td><td>{{ms .TTFTP50Ms}}</td><td>{{ms .TTFTP99Ms}}</td><td>{{ms .LatencyP50Ms}}</td><td>{{ms .LatencyP99Ms}}</td><td>{{perWorker .}}</td><td>{{span .Imbalance 2}}</td><td>{{.Errors}}</td>{{end}}{{if .Joules}}<td>{{span (spanOf .Joules) 1}}</td>{{end}}</tr>
{{end}}</table>
{{range .Out.Notes}}<p class="note">{{.}}</p>{{end}}
{{end}}

{{range .Out.Flow}}
<h2>Flow control: {{.Scenario}}</h2>
<p class="note">{{.Requests}} requests ({{join .Classes " + "}}), open loop: {{index .Classes 0}} at {{f2 .FirstClassRPS}} requests/s of the fleet's {{f2 .CapacityRPS}}. Medians over the runs; a 429 is shed, out of the TTFT; goodput: answered with a TTFT within {{ms .SLOMs}}.</p>
<table><tr><th>policy, class</th><th>hit ratio</th><th>TTFT p50</th><th>TTFT p99</th><th>requests/s</th><th>goodput/s</th><th>answered</th><th>shed</th><th>errors</th></tr>
{{range .Rows}}<tr><td>{{.Name}}</td>{{with .F}}<td>{{f3 .HitRatio}}</td><td>{{msNaN .TTFTP50Ms}}</td><td>{{msNaN .TTFTP99Ms}}</td><td>{{f2 .Throughput}}</td><td>{{f2 .Goodput}}</td><td>{{.Answered}}/{{.Requests}}</td><td>{{.Shed}}</td><td>{{.Errors}}</td>{{end}}</tr>
{{end}}</table>
{{end}}
{{with .Out.FlowTargets}}
<h2>Issue 35's targets</h2>
<table><tr><th>target</th><th>policy</th><th>value</th><th>met</th><th>figures</th></tr>
{{range .}}<tr><td>{{.Name}}</td><td>{{.Policy}}</td><td>{{f3 .Value}}</td><td>{{if .Met}}met{{else}}<b>missed</b>{{end}}</td><td style="text-align:left">{{.Detail}}</td></tr>
{{end}}</table>
{{end}}

{{with .Out.Sweep}}{{$r := sweepRange .}}
<h2>Sweep of kv_cache_aware</h2>
<table><tr><th>cache_threshold</th><th>balance_abs_threshold</th><th>on_imbalance</th><th>hit ratio</th><th>hit / ref</th><th>TTFT p50</th><th>TTFT p99</th><th>latency p99</th><th>imbalance</th><th>errors</th></tr>
{{range .}}<tr><td>{{.CacheThreshold}}</td><td>{{.BalanceAbsThreshold}}</td><td>{{.OnImbalance}}</td>{{with .Result.Summary}}<td style="{{heat .HitRatio.Mean (index $r 0) (index $r 1)}}">{{span .HitRatio 3}}</td><td>{{f2 .HitOverReference}}</td><td>{{ms .TTFTP50Ms}}</td><td>{{ms .TTFTP99Ms}}</td><td>{{ms .LatencyP99Ms}}</td><td>{{span .Imbalance 2}}</td><td>{{.Errors}}</td>{{end}}</tr>
{{end}}</table>
{{end}}

{{with .Out.Overhead}}
<h2>Proxy overhead</h2>
<table><tr><th>Caddy config</th><th>requests/s</th></tr>
{{range .Configs}}<tr><td>{{.Name}}</td><td>{{f0 .Mean}}</td></tr>
{{end}}</table>
<p>kv_cache_aware + matcher / round_robin: <b>{{f3 .Ratio}}</b> (target ≥ {{f2 .TargetRatio}}); the matcher alone: {{f3 .MatcherRatio}}.
{{.Clients}} keep-alive clients, {{.BodyBytes}}-byte chat bodies, {{.Upstreams}} upstreams answering at once, rounds of {{f0 .SecondsPerRun}} s per config in rotating order.</p>
{{end}}
</body></html>
`

// Chart geometry shared by the horizontal bar charts.
const (
	chartWidth  = 900
	labelWidth  = 230
	barHeight   = 22
	barGap      = 8
	chartMargin = 30
)

var palette = []string{"#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5", "#9c6b4e", "#9498a0"}

// hitChart draws the hit ratio per policy on a 0-1 scale, with min-max whiskers and lines for
// the reference and the infinite cache.
func hitChart(results []*policyResult) string {
	plot := float64(chartWidth - labelWidth - 60)
	x := func(v float64) float64 { return labelWidth + v*plot }
	h := chartMargin*2 + len(results)*(barHeight+barGap)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" role="img" aria-label="hit ratio per policy">`, chartWidth, h)
	axis(&b, x, h, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}, "%.1f")
	var ref, inf []float64
	for i, r := range results {
		s := r.Summary
		y := chartMargin + i*(barHeight+barGap)
		label(&b, y, r.Label)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>`, x(0), y, s.HitRatio.Mean*plot, barHeight, palette[i%len(palette)])
		if s.HitRatio.Max > s.HitRatio.Min {
			my := y + barHeight/2
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#222"/>`, x(s.HitRatio.Min), x(s.HitRatio.Max), my, my)
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%.3f</text>`, x(s.HitRatio.Mean)+6, y+barHeight-6, s.HitRatio.Mean)
		for _, run := range r.Runs {
			ref, inf = append(ref, run.ReferenceHitRatio), append(inf, run.InfiniteHitRatio)
		}
	}
	for _, l := range refLines(mean(ref), mean(inf), x) {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#c00" stroke-dasharray="5 4"/>`, x(l.v), x(l.v), chartMargin-8, h-chartMargin+4)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="%s" style="fill:#c00">%s</text>`, x(l.v), chartMargin-12, l.anchor, l.text)
	}
	b.WriteString("</svg>")
	return b.String()
}

// refLabelWidth is the room a reference line's label takes ("reference 0.85" at the chart's
// font size, with a margin), in the chart's pixels.
const refLabelWidth = 110

// refLine is a dashed line of the hit-ratio chart and its label.
type refLine struct {
	v            float64
	text, anchor string
}

// refLines are the hit-ratio chart's lines for the reference LRU and the infinite cache: one
// line and label when they read the same (the fleet's cache holds the whole workload), else a
// label each, centred on its line, or set off to either side when centred labels would
// overlap (the reference's to the left of its line, the infinite's to the right).
func refLines(ref, inf float64, x func(float64) float64) []refLine {
	r, i := fmt.Sprintf("%.2f", ref), fmt.Sprintf("%.2f", inf)
	if r == i {
		return []refLine{{ref, "reference = infinite " + r, "middle"}}
	}
	lines := []refLine{{ref, "reference " + r, "middle"}, {inf, "infinite " + i, "middle"}}
	if math.Abs(x(inf)-x(ref)) < refLabelWidth {
		left, right := 0, 1
		if inf < ref {
			left, right = 1, 0
		}
		lines[left].anchor, lines[right].anchor = "end", "start"
	}
	return lines
}

// ttftChart draws p99 TTFT per policy, with p50 as an inner bar.
func ttftChart(results []*policyResult) string {
	top := 1.0
	for _, r := range results {
		top = max(top, r.Summary.TTFTP99Ms)
	}
	step := niceStep(top / 5)
	top = math.Ceil(top/step) * step
	plot := float64(chartWidth - labelWidth - 150)
	x := func(v float64) float64 { return labelWidth + v/top*plot }
	h := chartMargin*2 + len(results)*(barHeight+barGap)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" role="img" aria-label="p99 time to first token per policy">`, chartWidth, h)
	var ticks []float64
	for v := 0.0; v <= top+step/2; v += step {
		ticks = append(ticks, v)
	}
	axisFunc(&b, x, h, ticks, fmtMs)
	for i, r := range results {
		s := r.Summary
		y := chartMargin + i*(barHeight+barGap)
		label(&b, y, r.Label)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" fill-opacity="0.55"/>`, x(0), y, x(s.TTFTP99Ms)-x(0), barHeight, palette[i%len(palette)])
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>`, x(0), y+6, x(s.TTFTP50Ms)-x(0), barHeight-12, palette[i%len(palette)])
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s (p50 %s)</text>`, x(s.TTFTP99Ms)+6, y+barHeight-6, fmtMs(s.TTFTP99Ms), fmtMs(s.TTFTP50Ms))
	}
	b.WriteString("</svg>")
	return b.String()
}

// loadChart draws, for each policy, one vertical bar per upstream (mean requests per run),
// with a dashed line at an even share.
func loadChart(results []*policyResult, addrs []string) string {
	n := max(1, len(addrs))
	top := 1.0
	for _, r := range results {
		for _, c := range r.Summary.PerWorker {
			top = max(top, c)
		}
	}
	step := niceStep(top / 4)
	top = math.Ceil(top/step) * step
	const plotH, left, groupGap = 220, 50, 18
	groupW := (chartWidth - left - 10) / max(1, len(results))
	barW := float64(groupW-groupGap) / float64(n)
	y := func(v float64) float64 { return chartMargin + plotH - v/top*plotH }
	h := chartMargin + plotH + 60 + 20
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" role="img" aria-label="requests per upstream per policy">`, chartWidth, h)
	for v := 0.0; v <= top+step/2; v += step {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/>`, left, chartWidth-10, y(v), y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%.0f</text>`, left-6, y(v)+4, v)
	}
	for i, r := range results {
		gx := float64(left + i*groupW + groupGap/2)
		total := 0.0
		for j, c := range r.Summary.PerWorker {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>w%d %s: %.0f</title></rect>`,
				gx+float64(j)*barW, y(c), barW-1, y(0)-y(c), palette[j%len(palette)], j, html.EscapeString(addrAt(addrs, j)), c)
			total += c
		}
		even := total / float64(n)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#222" stroke-dasharray="4 3"/>`, gx, gx+barW*float64(n), y(even), y(even))
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, gx+barW*float64(n)/2, chartMargin+plotH+18, html.EscapeString(shortLabel(r.Policy)))
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" style="fill:#666">max/mean %.2f</text>`, gx+barW*float64(n)/2, chartMargin+plotH+34, r.Summary.Imbalance.Mean)
	}
	for j := range n {
		lx := left + j*200
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">w%d %s</text>`,
			lx, h-18, palette[j%len(palette)], lx+16, h-8, j, html.EscapeString(addrAt(addrs, j)))
	}
	b.WriteString("</svg>")
	return b.String()
}

func addrAt(addrs []string, i int) string {
	if i < len(addrs) {
		return addrs[i]
	}
	return ""
}

// shortLabel keeps chart labels from overlapping.
func shortLabel(s string) string {
	if len(s) > 18 {
		return s[:17] + "…"
	}
	return s
}

func label(b *strings.Builder, y int, text string) {
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, labelWidth-8, y+barHeight-6, html.EscapeString(text))
}

func axis(b *strings.Builder, x func(float64) float64, h int, ticks []float64, format string) {
	axisFunc(b, x, h, ticks, func(v float64) string { return fmt.Sprintf(format, v) })
}

func axisFunc(b *strings.Builder, x func(float64) float64, h int, ticks []float64, format func(float64) string) {
	for _, t := range ticks {
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#eee"/>`, x(t), x(t), chartMargin-4, h-chartMargin+4)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle" style="fill:#666">%s</text>`, x(t), h-chartMargin+18, format(t))
	}
}

// niceStep rounds a raw axis step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}
