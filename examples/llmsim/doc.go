// Package llmsim is a simulated OpenAI-compatible LLM server for benchmarking routers.
//
// A Server answers /v1/chat/completions (plain and streamed as server-sent events),
// /v1/completions, /v1/models, /health, /metrics (Prometheus text with vLLM's metric names) and
// POST /reset. It does no inference: it models what makes routing matter.
//
//   - An engine: the fleet simulator's model of vLLM's scheduler (package engine), run on the
//     wall clock, so that the demo's workers and the simulator's engines are one model.
//     Continuous batching of at most Slots requests (max_num_seqs), the others waiting in
//     arrival order; steps with a token budget (MaxBatchTokens) that give each running decode a
//     token and the prefills the rest, a long prompt in chunks; a step lasts StepFixed +
//     PrefillPerToken × its prefill tokens + PerSeq × its sequences, divided by Speed. The time
//     to first token is the wait for admission plus the steps of the prefill; tokens are
//     streamed as the steps make them. A goroutine sleeps until each step's end; the server
//     burns no CPU while idle.
//   - The engine's automatic prefix cache, like vLLM's: the prompt is tokenized as one token per
//     4 chars (Unicode code points), cut into blocks of BlockTokens tokens, and each full block
//     is identified by a hash chained with its parent's. A request's cached tokens are the
//     leading blocks found when it is admitted; each block it computes is cached. The running
//     requests' blocks (prompt and output, reserved at admission) and the cached ones share
//     CapacityBlocks; unreferenced cached blocks are evicted least recently released first.
//     BlockCache and NewPrompt are exported so that a replayer can compute, offline and with
//     the same hashes, what one fleet-sized LRU would have hit.
//
// Responses carry usage.prompt_tokens_details.cached_tokens as vLLM reports it, and the headers
// X-Kvsim-Worker and X-Kvsim-Cached-Tokens so that a client behind a proxy can tell which
// worker served it and what it hit.
package llmsim
