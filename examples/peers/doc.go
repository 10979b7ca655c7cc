// Package peers holds two benchmark-only Caddy load-balancing policies that reproduce what
// kvroute is compared with, so that a benchmark drives every contender through the same Caddy,
// the same request parsing and the same upstreams:
//
//   - sglang_cache_aware (SGLangCacheAware): SGLang router's cache_aware policy, a per-model
//     approximate char-level radix tree with per-tenant LRU eviction, switching to shortest
//     queue when the load is imbalanced;
//   - prefix_hash (PrefixHash): stateless rendezvous hashing of the first chars of the prompt
//     with a bounded-load escape, like SGLang's prefix_hash policy.
//
// Both read the routing text with the project's own extraction (package
// github.com/kvroute/caddy-kvroute/kvroute/llmreq), so the comparison is about the routing
// algorithm, not about what text each router sees. Both count the requests they send to each
// upstream themselves, as SGLang's router does, because Caddy's NumRequests only moves after
// Select returns.
//
// The kvroute plugin never imports this package; only the demo's Caddy is built with it.
package peers
