// Package kvroute holds the Caddy modules of kvroute:
//
//   - http.reverse_proxy.selection_policies.kv_cache_aware (KVCacheAware): the load-balancing
//     policy that sends each LLM request to the upstream most likely to hold its prompt prefix in
//     KV cache, keeps sessions on their upstream, falls back to the least busy upstream when load
//     is imbalanced, and places cold requests where they cost the fewest joules;
//   - http.matchers.llm_prompt (LLMPrompt): a request matcher that reads the body (bounded),
//     extracts model, routing text and session, and restores the body byte for byte;
//   - admin.api.kvroute (Admin): the /kvroute/ admin endpoints.
//
// All kv_cache_aware policies of a process share one state (prefix trees per model, session
// bindings, in-flight counts), held in a caddy.UsagePool so that config reloads keep what the
// upstreams hold in cache. The decision is documented on KVCacheAware.Select.
package kvroute
