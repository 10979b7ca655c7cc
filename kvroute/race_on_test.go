//go:build race

package kvroute

// raceEnabled scales the flood tests down under the race detector, which slows every decision
// about tenfold: see flood_test.go.
const raceEnabled = true
