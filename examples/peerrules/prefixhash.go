package peerrules

import (
	"hash/fnv"
	"slices"
)

// Defaults of SGLang's prefix_hash policy (sgl-model-gateway src/policies/prefix_hash.rs,
// PrefixHashConfig, and the --prefix-token-count / --prefix-hash-load-factor flags of
// src/main.rs): the first 256 tokens, load factor 1.25. 256 tokens are about 1000 chars at the
// project's chars/4 estimate.
const (
	DefaultPrefixChars = 1000
	DefaultLoadFactor  = 1.25
)

// The bounded-load prefix hash routes by a stateless hash of the prompt's first chars: the
// available upstreams are ranked by rendezvous (highest random weight) hashing of the first
// prefix_chars chars of the routing text (Rendezvous), and the request goes to the first of them
// whose in-flight count is at most load_factor × (mean in-flight over the available upstreams
// + 1); when none is, to the first (BoundedLoad).
//
// This is the idea behind SGLang's prefix_hash policy and LiteLLM's prompt-prefix affinity.
// Two differences from SGLang: it hashes chars, not token ids (the router has no tokenizer),
// and it walks the rendezvous order instead of jumping to the least loaded upstream when the
// first choice is overloaded, so that an overloaded prefix spills to a stable second choice.
// Rendezvous hashing moves only the prefixes of an upstream that leaves or joins.

// Hash64 is a 64-bit string hash (the Caddy policy uses xxhash; FNV1a is the stdlib's).
type Hash64 func(string) uint64

// FNV1a returns the 64-bit FNV-1a hash of s.
func FNV1a(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// Rendezvous returns the indexes of ids by decreasing weight for key: each id's weight is a
// hash of key and the id, so every key has its own stable order of upstreams.
func Rendezvous(ids []string, key uint64, hash Hash64) []int {
	type ranked struct {
		i int
		w uint64
	}
	rs := make([]ranked, len(ids))
	for i, id := range ids {
		rs[i] = ranked{i, mix64(key ^ hash(id))}
	}
	slices.SortStableFunc(rs, func(a, b ranked) int {
		switch {
		case a.w > b.w:
			return -1
		case a.w < b.w:
			return 1
		}
		return 0
	})
	out := make([]int, len(rs))
	for i, r := range rs {
		out[i] = r.i
	}
	return out
}

// BoundedLoad returns the position in order of the first upstream whose in-flight count
// (loads, in the same order) is at most factor × (mean + 1); 0 when none is.
func BoundedLoad(loads []int, factor float64) int {
	total := 0
	for _, l := range loads {
		total += l
	}
	limit := factor * (float64(total)/float64(len(loads)) + 1)
	for i, l := range loads {
		if float64(l) <= limit {
			return i
		}
	}
	return 0
}

// mix64 is the SplitMix64 finalizer: it spreads a combined key over all 64 bits.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// PrefixChars returns the first n chars of s.
func PrefixChars(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}
