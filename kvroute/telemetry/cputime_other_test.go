//go:build !unix

package telemetry

import "time"

// cpuTime is not measured here: BenchmarkScrape reports a cpu-ns/op of 0.
func cpuTime() time.Duration { return 0 }
