package llmsim

import (
	"bufio"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// histogramBounds are vLLM's request-latency buckets (seconds), shared by the three histograms.
var histogramBounds = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
	1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}

// histogram is a Prometheus histogram over histogramBounds, updated with atomics. A reading
// taken while an observation is being added may see its bucket before its count: scrapers
// diff readings a second apart, where one observation in flight is noise.
type histogram struct {
	buckets [23]atomic.Uint64 // per bucket (not cumulative); the last is +Inf
	sumNs   atomic.Int64
}

func (h *histogram) observe(d time.Duration) {
	s := d.Seconds()
	i := len(histogramBounds)
	for j, b := range histogramBounds {
		if s <= b {
			i = j
			break
		}
	}
	h.buckets[i].Add(1)
	h.sumNs.Add(int64(d))
}

func (h *histogram) reset() {
	for i := range h.buckets {
		h.buckets[i].Store(0)
	}
	h.sumNs.Store(0)
}

// write writes the histogram in the text format, le labels after labels' own.
func (h *histogram) write(bw *bufio.Writer, name, help, labels string) {
	fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	inner := strings.TrimSuffix(strings.TrimPrefix(labels, "{"), "}")
	cum := uint64(0)
	for i := range h.buckets {
		cum += h.buckets[i].Load()
		le := "+Inf"
		if i < len(histogramBounds) {
			le = strconv.FormatFloat(histogramBounds[i], 'f', -1, 64)
		}
		fmt.Fprintf(bw, "%s_bucket{%s,le=\"%s\"} %d\n", name, inner, le, cum)
	}
	fmt.Fprintf(bw, "%s_sum%s %s\n%s_count%s %d\n", name, labels,
		strconv.FormatFloat(time.Duration(h.sumNs.Load()).Seconds(), 'f', -1, 64), name, labels, cum)
}

// serveMetrics writes the Prometheus text format (version 0.0.4) with vLLM's metric names, so
// that anything scraping vLLM can scrape the simulator. Counters carry the _total suffix in
// their exposed name, as vLLM's prometheus_client does. vllm:cache_config_info carries the KV
// cache size as vLLM does, block_size × num_gpu_blocks tokens (left out when the cache is
// unlimited: vLLM's is never). A scrape counts in none of the counters: tests that count the
// requests a worker served must not count the router's telemetry.
//
// The figures are the engine's (engine.Reading): running and waiting requests, the KV cache's
// blocks in use by running requests over its capacity, prompt tokens looked up in the prefix
// cache (vLLM's prompt_tokens_total counts them all, cached or not) and found there, tokens
// generated; the histograms are the engine's times, prefill from admission to the first token
// and decode from the first token to the last, and TTFT from the HTTP request's arrival.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	rd := s.eng.reading()
	running, waiting, usage := rd.Running, rd.Waiting, min(1, rd.KVUsage)
	vllm := fmt.Sprintf(`{engine="0",model_name="%s"}`, labelValue(s.cfg.Model))
	sim := fmt.Sprintf(`{model_name="%s",worker="%s"}`, labelValue(s.cfg.Model), labelValue(s.cfg.Name))

	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	bw := bufio.NewWriter(w)
	metric := func(name, typ, help, labels string, v float64) {
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s %s\n%s%s %s\n", name, help, name, typ, name, labels,
			strconv.FormatFloat(v, 'f', -1, 64))
	}
	metric("vllm:num_requests_running", "gauge",
		"Number of requests in model execution batches.", vllm, float64(running))
	metric("vllm:num_requests_waiting", "gauge",
		"Number of requests waiting to be processed.", vllm, float64(waiting))
	metric("vllm:kv_cache_usage_perc", "gauge",
		"KV-cache usage. 1 means 100 percent usage.", vllm, usage)
	if s.cfg.CapacityBlocks > 0 {
		metric("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
			fmt.Sprintf(`{block_size="%d",engine="0",num_gpu_blocks="%d"}`, s.cfg.BlockTokens, s.cfg.CapacityBlocks), 1)
	}
	metric("vllm:prefix_cache_queries_total", "counter",
		"Prefix cache queries, in terms of number of queried tokens.", vllm, float64(rd.PrefixQueries))
	metric("vllm:prefix_cache_hits_total", "counter",
		"Prefix cache hits, in terms of number of cached tokens.", vllm, float64(rd.PrefixHits))
	metric("vllm:prompt_tokens_total", "counter",
		"Number of prefill tokens processed.", vllm, float64(rd.PrefixQueries))
	metric("vllm:generation_tokens_total", "counter",
		"Number of generation tokens processed.", vllm, float64(rd.GenerationTokens))
	s.eng.prefillTime.write(bw, "vllm:request_prefill_time_seconds",
		"Histogram of time spent in PREFILL phase for request.", vllm)
	s.eng.decodeTime.write(bw, "vllm:request_decode_time_seconds",
		"Histogram of time spent in DECODE phase for request.", vllm)
	s.eng.ttft.write(bw, "vllm:time_to_first_token_seconds",
		"Histogram of time to first token in seconds.", vllm)
	// As Go's and Python's process collectors write it: seconds, with the fraction.
	metric("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.", "",
		math.Round(float64(s.startNanos.Load())/1e6)/1e3)
	metric("kvsim_requests_total", "counter",
		"Requests served to the end by the simulated worker.", sim, float64(s.requests.Load()))
	metric("kvsim_cache_blocks", "gauge",
		"KV cache blocks held by the simulated prefix cache.", sim, float64(rd.CachedBlocks))
	metric("kvsim_cache_capacity_blocks", "gauge",
		"Capacity of the simulated prefix cache in blocks (0: unlimited).", sim, float64(max(0, s.cfg.CapacityBlocks)))
	metric("kvsim_cache_evictions_total", "counter",
		"KV cache blocks evicted from the simulated prefix cache.", sim, float64(rd.Evictions))
	bw.Flush()
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func labelValue(s string) string { return labelEscaper.Replace(s) }
