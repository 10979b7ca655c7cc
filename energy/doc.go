// Package energy describes what an upstream model server is (its
// accelerator, the models it serves, its concurrency and KV-cache capacity,
// what a token costs it in joules and in grid carbon) and places requests
// that have no cache affinity on the cheapest, least busy upstream.
//
// A [Profile] holds what the operator knows about one upstream; every
// field is optional and its zero value means unknown. A [Placer] ranks
// [Candidate] upstreams with one [Strategy]: joule and carbon rank by
// projected cost, treating an unannotated upstream as the mean of the
// annotated ones and breaking ties by [Busyness]; least_busy ranks by
// busyness alone. Remaining ties are broken uniformly at random, so that
// equal upstreams share the work instead of the first one taking it all.
//
// The package uses the standard library only, so that it can be tested
// and reused without Caddy.
package energy
