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
//     caller picks the first acceptable one (Match.Best), instead of being handed one
//     arbitrary tenant of the deepest node that may be down.
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
// # Performance
//
// Medians of
//
//	go test -run '^$' -bench . -benchmem -count 10 ./tree/ > /tmp/tree-bench.txt
//	benchstat /tmp/tree-bench.txt
//
// on a shared 2-core AMD EPYC VM (GOMAXPROCS 2, Go 1.26; other jobs kept the load average
// between 5 and 11, hence the spreads). Prompts are half one of eight system prompts, half
// text of their own; "stored" matches a prompt inserted before, "new" one that shares only its
// system prompt.
//
//	Match, 4 KiB prompt, 1M chars stored       720 ns ±14% stored, 1.05 µs ±20% new, 0 allocs
//	Match, 4 KiB prompt, 64M chars stored     1.04 µs ±10% stored, 1.28 µs ±11% new, 0 allocs
//	Match, 64 KiB prompt, 1M chars stored      2.9 µs ±11% stored, 13.2 µs ±23% new, 0 allocs
//	Match, 64 KiB prompt, 64M chars stored    17.4 µs ±32% stored, 20.5 µs ±23% new, 0 allocs
//	Match, 4 KiB, 64M, 2 goroutines            964 ns/op ±52% (throughput), 0 allocs
//	Match+Insert (routing), 2 goroutines       887 ns/op ±128%, 0 allocs
//	Insert, 4 KiB, system prompt cached       1.96 µs ±65%, 3.4 KiB, 10 allocs
//	Insert, 4 KiB, stored before              1.21 µs ±34%, 0 allocs
//	Insert, 64 KiB, system prompt cached      25.8 µs ±24%, 48 KiB, 10 allocs
//	Insert, 64 KiB, stored before             11.4 µs ±61%, 0 allocs
//	Mooncake trace, 3,993 prompts             85.3M chars in 5,825 nodes, 1.05 B/char of heap,
//	                                          built in 282 ms ±42%
//	Eviction pass, 64M chars down to 40M      27.7 ms ±35% alone; 464 ms ±40% against two
//	(26.8M chars, ~13k leaves freed)          goroutines matching flat out, which kept 0.90
//	                                          ±20% of their idle throughput (idle 1.54M/s)
//
// Targets: Match of 4 KiB at most 3 µs with no allocation at 1M and 64M chars; Insert of
// 4 KiB sharing a cached prefix at most 5 µs; at most 2.5 B of heap per char on the trace;
// matching during a pass at least half as fast as idle. All met. The heap figure is for
// ASCII; text costs its UTF-8 size (about 3 B per char for CJK) plus the same small overhead.
package tree
