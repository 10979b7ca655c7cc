// Package fleetsim is a fleet of LLM engines in virtual time, for measuring routers: discrete
// events on one heap (arrivals, engine steps, telemetry readings, restarts), engines modelled
// on vLLM's scheduler (package examples/llmsim/engine), clients in open or closed loop, and
// routers that see what a real router sees: the engines' ids, their own counts of requests in
// flight, the engines' readings every telemetry interval, and each answer's usage (prompt and
// cached tokens) and first-token time. The scorecard runs every scenario, seed and router and
// reports the figures of docs/simulator.md.
//
// Everything is deterministic: a run reads no clock and draws from seeded generators, so the
// same scenario, seed and router give the same numbers on every machine.
package fleetsim
