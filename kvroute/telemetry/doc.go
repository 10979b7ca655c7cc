// Package telemetry reads inference engines' own metrics endpoints: how many requests each runs
// and queues, how full and how large its KV cache is, and whether it can be reached at all. It
// understands vLLM, SGLang, llama.cpp and TGI, and knows nothing of routing: kvroute feeds what
// it reads into its shared state.
//
// Parse turns one Prometheus text page into a Reading. It keeps only the lines of the families
// it understands and hands those to prometheus/common's text parser, so that a vLLM page of
// tens of KB of histograms costs one pass over its bytes. The families are, as running, waiting,
// KV usage (0 to 1) and KV capacity (tokens):
//
//   - vLLM: vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc (else
//     the older vllm:gpu_cache_usage_perc), and the labels of vllm:cache_config_info:
//     kv_cache_size_tokens, else block_size × num_gpu_blocks;
//   - SGLang, with the "sglang:" prefix or, since v0.5.4, "sglang_": num_running_reqs,
//     num_queue_reqs, token_usage, and max_total_num_tokens, else the labels of
//     cache_config_info page_size × num_pages, else the page_size and num_pages gauges;
//   - llama.cpp: llamacpp:requests_processing, llamacpp:requests_deferred,
//     llamacpp:kv_cache_usage_ratio (older servers), and n_ctx of GET /props (ParseProps; the
//     Scraper reads it);
//   - TGI: tgi_batch_current_size, tgi_queue_size; no usage or capacity.
//
// Beside these gauges, a Reading carries the engine's cumulative totals (Counters): prompt
// tokens, prompt tokens computed rather than found in a cache, prefix-cache queries and hits,
// generated tokens, prefill and decode seconds, the time-to-first-token histogram and the
// process start time (see Counters for each engine's families). Diff of two readings gives an
// interval's figures (Delta) and says whether the engine restarted between them (a total back
// by more than a wobble, or a new start time); the Scraper diffs each target's consecutive
// readings and publishes the result in Snapshot.Delta, with Restarts and Anomalies counted.
//
// Series of one family that differ only in a rank label (tp_rank, pp_rank, ...) are one engine
// seen from each rank and count once; series that differ otherwise (vLLM's engine label under
// data parallelism, SGLang's dp_rank) are engines behind one port and add up. A model label
// (model_name, model) splits the figures per model in Reading.Models; the top-level figures
// are the upstream's whole load, every model together.
//
// Bad input changes nothing but counts (a histogram without buckets, with decreasing buckets or
// with buckets above its count is dropped like an invalid value; a total that went back a
// little, a family gone, another model or an absurd rate leaves that delta out and is counted
// in Snapshot.Anomalies): a value that is NaN, infinite, negative, a usage above
// 1 or a capacity below 1 is dropped and counted in Reading.Ignored; a page larger than its
// bound, not UTF-8, not Prometheus text or without any understood family is an error.
//
// A Scraper runs one goroutine per Target (an upstream's metrics URL), every Interval with
// backoff after failures, and publishes each target's latest Snapshot behind an atomic pointer,
// so that a request's decision reads it without a lock and never waits on a scrape. Each
// attempt has an Outcome: only OutcomeRefused (no connection could be made) says the upstream
// is down; a 404 (or llama.cpp's 501 without --metrics) is OutcomeNotFound (no telemetry)
// and a timeout OutcomeStale (the last reading ages). Probe is the cheap connection attempt for upstreams with no metrics endpoint. The
// package registers no Prometheus metrics: Snapshot.Counts and the figures are there for the
// caller to export.
package telemetry
