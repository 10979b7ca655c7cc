// Package llmsim is a simulated OpenAI-compatible LLM server for benchmarking routers.
//
// A Server answers /v1/chat/completions (plain and streamed as server-sent events),
// /v1/completions, /v1/models, /health, /metrics (Prometheus text with vLLM's metric names) and
// POST /reset. It does no inference: it models what makes routing matter.
//
//   - An automatic prefix cache like vLLM's. The prompt is tokenized as one token per 4 chars
//     (Unicode code points), cut into blocks of BlockTokens tokens, and each full block is
//     identified by a hash chained with its parent's. A request's cached tokens are the leading
//     blocks found in an LRU of CapacityBlocks blocks; after prefill every block of the prompt is
//     inserted or touched. BlockCache and NewPrompt are exported so that a replayer can compute,
//     offline and with the same code, what an ideal fleet would have hit.
//   - A fixed number of batch slots with a FIFO queue in front of them.
//   - Time: prefill costs PrefillPerToken per uncached prompt token, decode DecodePerToken per
//     output token after the first, both divided by Speed. Prefills share the worker's compute
//     (one at a time by default, FIFO), decodes run in parallel in the slots, so a worker
//     sent too much uncached work queues it as a real one does. The time to first token is
//     the wait for a slot and for the prefill compute plus the prefill. The server sleeps; it
//     burns no CPU.
//
// Responses carry usage.prompt_tokens_details.cached_tokens as vLLM reports it, and the headers
// X-Kvsim-Worker and X-Kvsim-Cached-Tokens so that a client behind a proxy can tell which
// worker served it and what it hit.
package llmsim
