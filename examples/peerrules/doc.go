// Package peerrules holds the routing rules of the algorithms kvroute is compared with, as pure
// code over plain values (upstream ids, in-flight counts, availability): SGLang router's
// cache_aware policy with its approximate radix tree (CacheAware, Tree), and the bounded-load
// prefix hash (Rendezvous, BoundedLoad). The benchmark-only Caddy policies of examples/peers and
// the fleet simulator of examples/fleetsim both run them, so that what the demo measures in real
// time and what the simulator measures in virtual time is the same algorithm.
//
// The package reads no clock and starts nothing: the caller decides when to evict.
package peerrules
