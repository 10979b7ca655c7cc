// Package tree is kvroute's approximate radix tree of the prompts the router has sent: per
// model, which upstreams ("tenants", keyed by dial address) were sent which prefix, and when.
// The kv_cache_aware policy matches a request's text against it to find the upstreams most
// likely to hold the prompt's prefix in their KV cache, and records every decision in it.
//
// # Semantics
//
// The tree follows SGLang's cache-aware router tree: it is char-level (runes, "chars" in
// kvroute's words), multi-tenant, keeps a last-access stamp per (node, tenant), keeps
// per-tenant char counts up to date on every change, and evicts least recently used leaves.
// Where this package differs:
//
//   - Tree.Match reports, in one walk, the input's length and every tenant on the matched
//     path with the leading runes it holds, longest first, then most recently used. The
//     caller picks the first acceptable one (kvroute ranks them among its candidates),
//     instead of being handed one arbitrary tenant of the deepest node that may be down.
//   - Ties are broken by recency, never by map order: every insert stamps its whole path with
//     a tick of the forest's clock. Matching is not use and stamps nothing.
//   - Limits.MaxChars bounds the chars stored across all trees of a Forest, each node counted
//     once however many tenants share it (SGLang's max_tree_size is per tenant, so its real
//     bound is the number of upstreams times it). Limits.TenantMaxChars bounds one tenant's
//     share (an upstream's KV capacity) and evicts only that tenant's leaves.
//   - The bound holds between eviction cycles: crossing MaxChars on insert starts a pass in
//     the background down to 90% of MaxChars, and an insert that would take the forest past
//     MaxChars+10% evicts first, or stores only the prefix that fits.
//   - Invalid UTF-8 is fine: each byte of an invalid or truncated encoding is one rune, as
//     utf8.RuneCountInString counts.
//
// # Concurrency and memory
//
// Match and MatchTenant take no lock and never wait: nodes are published read-copy-update
// style (immutable text, child and tenant lists replaced rather than changed in place, atomic
// stamps). Insert, tenant removal and eviction serialize on a per-tree mutex. An eviction pass
// reads the trees as Match does, removes leaves in batches of 32 under the mutex, and yields
// the processor after every millisecond of work unless an insert waits for it; so matching
// goes on during a pass and even inserts wait at most one batch. Match allocates nothing once
// its Match value has grown to the number of tenants.
//
// A node stores its own copy of its text (never a slice of the caller's prompt, and both halves
// of a split are copied, so evicting one frees its bytes), its rune count, the first rune as a
// packed key, and small copy-on-write lists of children and (tenant id, stamp) pairs. Tenant
// names are interned to small ids per forest; a removed tenant's id is reused only after a
// minute, so that a match in flight never reports it under another name.
//
// Benchmarks and their figures: docs/benchmarks.md in the repository.
package tree
