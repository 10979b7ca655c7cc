// Package decide is kvroute's routing decision as pure functions over a snapshot: the same code
// runs in Caddy (kvroute's Select gathers a snapshot from its shared state, calls Decide and
// records the choice) and in a fleet simulator in virtual time, which builds snapshots itself.
//
// A snapshot is the time (passed in: the package reads no clock), the request's facts (prompt
// chars and estimated tokens, max_tokens, whether it names a LoRA adapter) and each
// candidate's (its load, the prefix it holds, the prefill queued there, what its engine
// reported and taught, its energy profile, whether the request's session is bound to it).
// Decide returns the chosen candidate, the path (why) and what it did with the session, and
// fills every candidate's predicted cost. Both decisions are here: Thresholds (SGLang's
// cache-aware steps: session in the balance band, imbalance, prefix above cache_threshold,
// fallback placement) and Cost (one ranking by predicted time to first token). The rules are
// described in kvroute's docs/design.md ("The decision") and docs/decision.md.
//
// The package imports only the standard library and energy. It takes no locks, starts no
// goroutine, does no I/O and allocates nothing per decision for up to 16 candidates: the
// caller owns the candidate slice and may reuse it. Ties are broken at random
// (energy.Ranking), from Options.Rand: a seeded source makes a run repeat exactly.
//
// What the decision learns is estimated here too, fed with observations by the caller
// (kvroute's telemetry and llm_feedback; a simulator in virtual time): Speed (a median of the
// latest samples: prefill speed from the engine's totals and from single answers, decode
// speed), CharsPerToken (a model's, from the totals of the intervals), Slots (batch slots and
// mean output) and Outside (whether an engine runs traffic its router does not count). DefaultOptions are kvroute's defaults, DefaultRule its default decision.
//
// Step 1 (which upstreams are candidates) is the caller's, but for the leaving out of
// upstreams held down, saturated (max_concurrency) or tried by an earlier attempt: Filter.
package decide
