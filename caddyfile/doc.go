// Package caddyfile holds the Caddyfile parsing helpers of kvroute's
// blocks: one-argument options (sizes with SI or binary suffixes, numbers,
// durations, energies) and the `upstream <host:port> { ... }` block that
// describes an upstream's energy.Profile.
//
// Every helper reads from a *caddyfile.Dispenser positioned on the option
// name and returns errors made by the dispenser, so that they carry the
// file and line, and name the option:
//
//	max_tree_size: invalid size "64Q" (want a count with an optional suffix such as 2k, 64Mi or 4MiB), at Caddyfile:12
package caddyfile
