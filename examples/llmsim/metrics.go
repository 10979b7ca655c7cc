package llmsim

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
)

// counters are a worker's monotonic counters (zeroed by Reset) and its running KV blocks.
type counters struct {
	requests         atomic.Uint64
	promptTokens     atomic.Uint64 // = vLLM's prefix cache queries, in tokens
	cachedTokens     atomic.Uint64 // = vLLM's prefix cache hits, in tokens
	generationTokens atomic.Uint64
	runningBlocks    atomic.Int64 // KV blocks held by running requests: not reset
}

func (c *counters) reset() {
	c.requests.Store(0)
	c.promptTokens.Store(0)
	c.cachedTokens.Store(0)
	c.generationTokens.Store(0)
}

// serveMetrics writes the Prometheus text format (version 0.0.4) with vLLM's metric names, so
// that anything scraping vLLM can scrape the simulator. Counters carry the _total suffix in
// their exposed name, as vLLM's prometheus_client does. vllm:cache_config_info carries the KV
// cache size as vLLM does, block_size × num_gpu_blocks tokens (left out when the cache is
// unlimited: vLLM's is never). A scrape counts in none of the counters: tests that count the
// requests a worker served must not count the router's telemetry.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	running, waiting := s.slots.counts()
	usage := 0.0
	if s.cfg.CapacityBlocks > 0 {
		usage = min(1, float64(s.m.runningBlocks.Load())/float64(s.cfg.CapacityBlocks))
	}
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
		"Prefix cache queries, in terms of number of queried tokens.", vllm, float64(s.m.promptTokens.Load()))
	metric("vllm:prefix_cache_hits_total", "counter",
		"Prefix cache hits, in terms of number of cached tokens.", vllm, float64(s.m.cachedTokens.Load()))
	metric("vllm:prompt_tokens_total", "counter",
		"Number of prefill tokens processed.", vllm, float64(s.m.promptTokens.Load()))
	metric("vllm:generation_tokens_total", "counter",
		"Number of generation tokens processed.", vllm, float64(s.m.generationTokens.Load()))
	metric("kvsim_requests_total", "counter",
		"Requests served to the end by the simulated worker.", sim, float64(s.m.requests.Load()))
	metric("kvsim_cache_blocks", "gauge",
		"KV cache blocks held by the simulated prefix cache.", sim, float64(s.cache.Len()))
	metric("kvsim_cache_capacity_blocks", "gauge",
		"Capacity of the simulated prefix cache in blocks (0: unlimited).", sim, float64(max(0, s.cfg.CapacityBlocks)))
	metric("kvsim_cache_evictions_total", "counter",
		"KV cache blocks evicted from the simulated prefix cache.", sim, float64(s.cache.Evictions()))
	bw.Flush()
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func labelValue(s string) string { return labelEscaper.Replace(s) }
