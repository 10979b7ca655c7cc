package telemetry

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// DefaultMaxBytes bounds a metrics page. A vLLM page is tens of KB (its histograms make most
// of it); a page above 4 MiB is not an engine's.
const DefaultMaxBytes = 4 << 20

// The errors Parse returns; a Scraper counts each under its own Outcome.
var (
	ErrTooLarge = errors.New("metrics page larger than the limit")
	ErrGarbled  = errors.New("garbled metrics page")
	ErrNoEngine = errors.New("no vLLM, SGLang, llama.cpp or TGI metrics on the page")
	ErrInvalid  = errors.New("every figure the engine reported was invalid")
)

// maxSamples bounds the samples of understood families kept from one page, so that a page
// repeating one family's series many times costs the parser no more than a real page.
const maxSamples = 1024

// Bounds beyond which a figure is not an engine's: no engine runs a billion requests, and
// 10^13 tokens of KV cache would be petabytes.
const (
	maxCount    = 1e9
	maxCapacity = 1e13
)

// figure is what a family means.
type figure uint8

const (
	figRunning figure = iota
	figWaiting
	figUsage
	figUsageOld     // vLLM's gpu_cache_usage_perc: used when kv_cache_usage_perc is absent
	figCapacity     // the sample's value is the capacity in tokens
	figCapacityInfo // a cache_config_info: the capacity is in its labels
	figPageSize     // SGLang's page_size and num_pages gauges (v0.5.11): capacity is their product
	figNumPages
	figLoRAInfo // vLLM's lora_requests_info: the adapters are in its labels (lora.go)
	numFigures
)

// A family is a gauge of one figure, or (counter not cNone) a total of Counters.
type family struct {
	engine  Engine
	figure  figure
	counter counterKind
}

// families are the metric families Parse reads; every other line of a page is skipped before
// the text parser sees it. SGLang renamed its families from "sglang:" to "sglang_" in v0.5.4;
// both are read.
var families = func() map[string]family {
	m := map[string]family{
		// vLLM (vllm/v1/metrics/loggers.py; gpu_cache_usage_perc before v0.10)
		"vllm:num_requests_running": {engine: EngineVLLM, figure: figRunning},
		"vllm:num_requests_waiting": {engine: EngineVLLM, figure: figWaiting},
		"vllm:kv_cache_usage_perc":  {engine: EngineVLLM, figure: figUsage},
		"vllm:gpu_cache_usage_perc": {engine: EngineVLLM, figure: figUsageOld},
		"vllm:cache_config_info":    {engine: EngineVLLM, figure: figCapacityInfo},
		"vllm:lora_requests_info":   {engine: EngineVLLM, figure: figLoRAInfo},
		// llama.cpp server (tools/server/README.md; kv_cache_usage_ratio was removed in 2025,
		// and its KV size is n_ctx of /props, see ParseProps)
		"llamacpp:requests_processing":  {engine: EngineLlamaCpp, figure: figRunning},
		"llamacpp:requests_deferred":    {engine: EngineLlamaCpp, figure: figWaiting},
		"llamacpp:kv_cache_usage_ratio": {engine: EngineLlamaCpp, figure: figUsage},
		// TGI (docs/source/reference/metrics.md)
		"tgi_batch_current_size": {engine: EngineTGI, figure: figRunning},
		"tgi_queue_size":         {engine: EngineTGI, figure: figWaiting},
	}
	for _, prefix := range []string{"sglang:", "sglang_"} {
		m[prefix+"num_running_reqs"] = family{engine: EngineSGLang, figure: figRunning}
		m[prefix+"num_queue_reqs"] = family{engine: EngineSGLang, figure: figWaiting}
		m[prefix+"token_usage"] = family{engine: EngineSGLang, figure: figUsage}
		m[prefix+"max_total_num_tokens"] = family{engine: EngineSGLang, figure: figCapacity}
		m[prefix+"cache_config_info"] = family{engine: EngineSGLang, figure: figCapacityInfo}
		m[prefix+"page_size"] = family{engine: EngineSGLang, figure: figPageSize}
		m[prefix+"num_pages"] = family{engine: EngineSGLang, figure: figNumPages}
	}
	return m
}()

// familyLen[n] says whether some family's name is n bytes long: most lines of a vLLM page
// (its histograms' buckets) are told apart by their name's length alone, before the map.
var familyLen = func() (l [64]bool) {
	for name := range families {
		l[len(name)] = true
	}
	for name, f := range counterFamilies {
		l[len(name)] = true
		if isHistogram(f.counter) {
			for _, suf := range histogramSuffixes {
				l[len(name)+len(suf)] = true
			}
		}
	}
	return l
}()

// known reports whether a line about name belongs to an understood family: a gauge, a total,
// or a sample of a known histogram.
func known(name []byte) bool {
	if _, ok := families[string(name)]; ok {
		return true
	}
	if _, ok := counterFamilies[string(name)]; ok {
		return true
	}
	_, ok := histogramPart(string(name))
	return ok
}

// engines in the order that breaks a tie when a page carries several engines' families.
var engines = [...]Engine{EngineVLLM, EngineSGLang, EngineLlamaCpp, EngineTGI}

// modelLabels name the label that says which model a series is about.
var modelLabels = []string{"model_name", "model"}

// rankLabels name the ranks of one model-parallel group: the series that differ only in them
// describe one engine seen from each of its ranks (SGLang labels every series with tp_rank,
// pp_rank, moe_ep_rank), so they are one figure, not a sum. Series that differ in anything
// else (vLLM's engine label under data parallelism, SGLang's dp_rank) are separate engines
// behind one port, and add up.
var rankLabels = []string{"tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank", "attn_cp_rank", "cp_rank"}

// Parse reads a Prometheus text page (at most limit bytes; limit <= 0 means DefaultMaxBytes) and
// returns what it says of the engine. The errors are ErrTooLarge, ErrGarbled (wrapped with the
// parser's message), ErrNoEngine and ErrInvalid (with the Reading, whose Ignored tells how many
// samples were dropped); a Reading with some invalid samples and some valid ones is no error.
func Parse(r io.Reader, limit int64) (Reading, error) {
	if limit <= 0 {
		limit = DefaultMaxBytes
	}
	page, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return Reading{}, fmt.Errorf("reading metrics page: %w", err)
	}
	if int64(len(page)) > limit {
		return Reading{}, fmt.Errorf("%w (%d bytes)", ErrTooLarge, limit)
	}
	var p parser
	return p.parse(page)
}

// parser holds the buffer of kept lines, reused from one page to the next by a scrape loop.
type parser struct {
	kept []byte
}

func (p *parser) parse(page []byte) (Reading, error) {
	if !utf8.Valid(page) {
		return Reading{}, fmt.Errorf("%w: not UTF-8", ErrGarbled)
	}
	ignored := p.keep(page)
	if len(p.kept) == 0 {
		return Reading{Ignored: ignored}, ErrNoEngine
	}
	// prometheus/common v0.71 (Caddy's) wants its parser from NewTextParser: the zero value's
	// unset validation scheme panics on the first name. UTF-8 validation accepts every name the
	// engines write (vLLM's colons included) and those of newer exporters.
	tp := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := tp.TextToMetricFamilies(bytes.NewReader(p.kept))
	if err != nil {
		return Reading{}, fmt.Errorf("%w: %v", ErrGarbled, err)
	}
	r := interpret(fams)
	r.Ignored += ignored
	if r.Known == 0 && r.Counters.Known&^HasStartTime == 0 && r.LoRA == nil {
		if r.Engine == EngineUnknown {
			return r, ErrNoEngine
		}
		return r, ErrInvalid
	}
	return r, nil
}

// keep copies into p.kept the lines of page that belong to the understood families: their
// HELP and TYPE comments and their samples, at most maxSamples samples. It returns the count
// of samples dropped beyond that bound. Skipping the rest before parsing matters: the text
// parser builds every histogram of a vLLM page, which costs far more than finding the five
// lines routing needs.
func (p *parser) keep(page []byte) (dropped int) {
	p.kept = p.kept[:0]
	samples, loraSamples := 0, 0
	for len(page) > 0 {
		line := page
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i], page[i+1:]
		} else {
			page = nil
		}
		name, sample := lineName(line)
		if len(name) == 0 || len(name) >= len(familyLen) || !familyLen[len(name)] {
			continue
		}
		if !known(name) {
			continue
		}
		switch {
		case sample && string(name) == loraFamily:
			// A series per label set, and the engine never drops one: a long-running engine
			// serving many adapters writes many, which must not crowd out the load figures.
			if loraSamples == maxLoRASeries {
				dropped++
				continue
			}
			loraSamples++
		case sample:
			if samples == maxSamples {
				dropped++
				continue
			}
			samples++
		}
		p.kept = append(p.kept, line...)
		p.kept = append(p.kept, '\n')
	}
	return dropped
}

// lineName returns the metric name a line is about: a sample's name (sample true), or the name
// of a HELP or TYPE comment. Other comments, blank lines and the quoted-name syntax of UTF-8
// names (which no understood engine uses) give nil.
func lineName(line []byte) (name []byte, sample bool) {
	line = bytes.TrimLeft(line, " \t")
	if len(line) == 0 {
		return nil, false
	}
	if line[0] != '#' {
		return line[:nameEnd(line)], true // a name without a value is the parser's to reject
	}
	line = bytes.TrimLeft(line[1:], " \t")
	rest, ok := bytes.CutPrefix(line, []byte("HELP"))
	if !ok {
		if rest, ok = bytes.CutPrefix(line, []byte("TYPE")); !ok {
			return nil, false
		}
	}
	if len(rest) == 0 || (rest[0] != ' ' && rest[0] != '\t') {
		return nil, false
	}
	rest = bytes.TrimLeft(rest, " \t")
	return rest[:nameEnd(rest)], false
}

// nameEnd is the length of the metric name b starts with: up to a brace, a blank or a tab.
// (A loop over the few bytes of a name is cheaper than bytes.IndexAny's set.)
func nameEnd(b []byte) int {
	for i, c := range b {
		if c == '{' || c == ' ' || c == '\t' {
			return i
		}
	}
	return len(b)
}

// slot is one figure of one engine (a data-parallel rank) of one model.
type slot struct {
	figure figure
	model  string
	engine string // the labels that tell data-parallel engines apart
}

// interpret turns the parsed families into a Reading: it picks the engine whose families the
// page carries most of, validates every sample, folds the ranks of one engine into one value
// (their maximum) and adds up data-parallel engines.
func interpret(fams map[string]*dto.MetricFamily) Reading {
	var count [len(engines)]int
	for name := range fams {
		f, ok := families[name]
		if !ok {
			f, ok = counterFamilies[name]
		}
		if ok && f.engine != EngineUnknown {
			count[slices.Index(engines[:], f.engine)]++
		}
	}
	best := 0
	for i := range engines {
		if count[i] > count[best] {
			best = i
		}
	}
	r := Reading{}
	if count[best] == 0 {
		return r
	}
	r.Engine = engines[best]
	var ignored int
	r.Counters, ignored = interpretCounters(fams, r.Engine)
	r.Ignored += ignored

	values := map[slot]float64{}
	for name, mf := range fams {
		f, ok := families[name]
		if !ok || f.engine != r.Engine {
			continue
		}
		if f.figure == figLoRAInfo {
			var bad int
			r.LoRA, bad = loraInfo(mf)
			r.Ignored += bad
			continue
		}
		for _, m := range mf.GetMetric() {
			v, ok := sampleValue(f.figure, m)
			if !ok {
				r.Ignored++
				continue
			}
			s := slot{figure: f.figure, model: modelOf(m), engine: engineKey(m)}
			if old, seen := values[s]; !seen || v > old {
				values[s] = v
			}
		}
	}
	// SGLang's page gauges give the capacity of the engine whose series carry them.
	for s, pages := range values {
		if s.figure != figNumPages {
			continue
		}
		size, ok := values[slot{figure: figPageSize, model: s.model, engine: s.engine}]
		info := slot{figure: figCapacityInfo, model: s.model, engine: s.engine}
		if _, known := values[info]; ok && !known {
			if c := size * pages; c >= 1 && c <= maxCapacity {
				values[info] = c
			} else {
				r.Ignored++
			}
		}
	}
	for s := range values {
		if s.figure == figPageSize || s.figure == figNumPages {
			delete(values, s)
		}
	}
	if len(values) == 0 {
		return r
	}

	// Sum the engines of each model, then the models; usage is a mean at both levels.
	type sums struct {
		total [numFigures]float64
		n     [numFigures]int
	}
	perModel := map[string]*sums{}
	for s, v := range values {
		m := perModel[s.model]
		if m == nil {
			m = &sums{}
			perModel[s.model] = m
		}
		m.total[s.figure] += v
		m.n[s.figure]++
	}
	// Series without a model label (vLLM's cache_config_info has none) describe the whole
	// server: with one model, they are that model's.
	if unlabelled := perModel[""]; unlabelled != nil && len(perModel) == 2 {
		delete(perModel, "")
		for _, m := range perModel {
			for f := range numFigures {
				m.total[f] += unlabelled.total[f]
				m.n[f] += unlabelled.n[f]
			}
		}
	}
	var all sums
	labelled := false
	for name, m := range perModel {
		labelled = labelled || name != ""
		figs := figuresOf(m.total, m.n)
		r.Models = append(r.Models, ModelFigures{Model: name, Figures: figs})
		addFigures(&all.total, &all.n, figs)
	}
	r.Figures = figuresOf(all.total, all.n)
	if !labelled {
		r.Models = nil
	} else {
		slices.SortFunc(r.Models, func(a, b ModelFigures) int { return strings.Compare(a.Model, b.Model) })
		if len(r.Models) > MaxModels {
			r.Models = r.Models[:MaxModels]
		}
	}
	return r
}

// figuresOf makes Figures of per-figure totals and counts: counts and capacity are sums, usage
// the mean (vLLM's newer kv_cache_usage_perc preferred over its older name).
func figuresOf(total [numFigures]float64, n [numFigures]int) Figures {
	var f Figures
	if n[figRunning] > 0 {
		f.Running, f.Known = int64(math.Round(total[figRunning])), f.Known|HasRunning
	}
	if n[figWaiting] > 0 {
		f.Waiting, f.Known = int64(math.Round(total[figWaiting])), f.Known|HasWaiting
	}
	switch {
	case n[figUsage] > 0:
		f.KVUsage, f.Known = total[figUsage]/float64(n[figUsage]), f.Known|HasKVUsage
	case n[figUsageOld] > 0:
		f.KVUsage, f.Known = total[figUsageOld]/float64(n[figUsageOld]), f.Known|HasKVUsage
	}
	// An engine giving its capacity as a number (SGLang's max_total_num_tokens) and in its
	// cache_config_info says the same thing twice: the number wins.
	switch {
	case n[figCapacity] > 0:
		f.KVCapacityTokens, f.Known = int64(total[figCapacity]), f.Known|HasKVCapacity
	case n[figCapacityInfo] > 0:
		f.KVCapacityTokens, f.Known = int64(total[figCapacityInfo]), f.Known|HasKVCapacity
	}
	return f
}

// addFigures adds one model's figures into the upstream's totals.
func addFigures(total *[numFigures]float64, n *[numFigures]int, f Figures) {
	if f.Known.Has(HasRunning) {
		total[figRunning] += float64(f.Running)
		n[figRunning]++
	}
	if f.Known.Has(HasWaiting) {
		total[figWaiting] += float64(f.Waiting)
		n[figWaiting]++
	}
	if f.Known.Has(HasKVUsage) {
		total[figUsage] += f.KVUsage
		n[figUsage]++
	}
	if f.Known.Has(HasKVCapacity) {
		total[figCapacity] += float64(f.KVCapacityTokens)
		n[figCapacity]++
	}
}

// sampleValue returns a sample's figure, or false when it is not a valid one.
func sampleValue(fig figure, m *dto.Metric) (float64, bool) {
	if fig == figCapacityInfo {
		return capacityFromLabels(m)
	}
	var v float64
	switch {
	case m.Gauge != nil:
		v = m.Gauge.GetValue()
	case m.Untyped != nil:
		v = m.Untyped.GetValue()
	case m.Counter != nil:
		v = m.Counter.GetValue()
	default:
		return 0, false // a histogram or summary under a gauge's name
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false
	}
	switch fig {
	case figRunning, figWaiting:
		return v, v <= maxCount
	case figUsage, figUsageOld:
		// Rounding can put a full cache a hair above 1; more than that is not a fraction.
		return min(v, 1), v <= 1+1e-6
	case figCapacity, figPageSize, figNumPages:
		return math.Floor(v), v >= 1 && v <= maxCapacity
	}
	return 0, false
}

// capacityFromLabels reads a cache_config_info: vLLM's kv_cache_size_tokens when the engine
// gives it (newer vLLM; it is exact for hybrid models, whose blocks are not all alike), else
// vLLM's block_size × num_gpu_blocks, else SGLang's page_size × num_pages. During vLLM's
// start-up num_gpu_blocks is "None": no capacity yet.
func capacityFromLabels(m *dto.Metric) (float64, bool) {
	if v, ok := positiveInt(label(m, "kv_cache_size_tokens")); ok {
		return v, true
	}
	for _, pair := range [][2]string{{"block_size", "num_gpu_blocks"}, {"page_size", "num_pages"}} {
		size, ok1 := positiveInt(label(m, pair[0]))
		count, ok2 := positiveInt(label(m, pair[1]))
		if ok1 && ok2 && size*count <= maxCapacity {
			return size * count, true
		}
	}
	return 0, false
}

// positiveInt parses a label value as an integer in [1, maxCapacity]. vLLM writes some integer
// settings as floats ("4294967296.0"), so a float with no fraction is accepted too.
func positiveInt(s string) (float64, bool) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || v < 1 || v > maxCapacity || v != math.Trunc(v) {
		return 0, false
	}
	return v, true
}

func label(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

func modelOf(m *dto.Metric) string {
	for _, name := range modelLabels {
		if v := label(m, name); v != "" {
			return v
		}
	}
	return ""
}

// engineKey joins the labels that are neither a model label nor a rank label, sorted, so that
// the series of one engine share a key whatever order the page writes the labels in.
func engineKey(m *dto.Metric) string {
	var parts []string
	for _, lp := range m.GetLabel() {
		n := lp.GetName()
		if slices.Contains(modelLabels, n) || slices.Contains(rankLabels, n) {
			continue
		}
		parts = append(parts, n+"\x00"+lp.GetValue())
	}
	if len(parts) == 0 {
		return ""
	}
	slices.Sort(parts)
	return strings.Join(parts, "\x01")
}
