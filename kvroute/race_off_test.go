//go:build !race

package kvroute

// raceEnabled scales the flood tests down under the race detector: see flood_test.go.
const raceEnabled = false
