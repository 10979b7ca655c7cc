package telemetry_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
)

func ExampleParse() {
	page := `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama-3.1-8b"} 3
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama-3.1-8b"} 7
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama-3.1-8b"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="65536"} 1
`
	r, err := telemetry.Parse(strings.NewReader(page), 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s: %d running, %d waiting, KV %.0f%% of %d tokens (%s)\n",
		r.Engine, r.Running, r.Waiting, 100*r.KVUsage, r.KVCapacityTokens, r.Known)
	// Output: vllm: 3 running, 7 waiting, KV 25% of 1048576 tokens (running,waiting,kv_usage,kv_capacity)
}

func ExampleScraper() {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "tgi_batch_current_size 4\ntgi_queue_size 2\n")
	}))
	defer engine.Close()

	s := telemetry.NewScraper(telemetry.Options{Interval: 10 * time.Millisecond})
	defer s.Stop()
	if err := s.Add(telemetry.Target{Key: "10.0.0.1:8000", URL: engine.URL + "/metrics"}); err != nil {
		fmt.Println(err)
		return
	}
	// The decision path reads the latest snapshot without waiting on a scrape.
	for s.Snapshot("10.0.0.1:8000") == nil {
		time.Sleep(time.Millisecond)
	}
	snap := s.Snapshot("10.0.0.1:8000")
	fmt.Println(snap.Outcome, snap.Reading.Engine, snap.Reading.Running, snap.Reading.Waiting)
	// Output: ok tgi 4 2
}
