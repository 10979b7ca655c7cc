package clustertest

import (
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/workload"
	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
)

// chatTexts are routing texts of the demo's chat workload, role and content of each message in
// order, as the routing text joins them.
func chatTexts() []string {
	w := workload.ChatWorkload(workload.DefaultChat)
	var out []string
	for _, s := range w.Sessions {
		for _, c := range s.Calls {
			var sb strings.Builder
			for _, m := range c.Messages {
				sb.WriteString(m.Role)
				sb.WriteString(": ")
				sb.WriteString(m.Content)
				sb.WriteString("\n")
			}
			out = append(out, sb.String())
		}
	}
	return out
}

// mooncakeTexts are the first prompts of the Mooncake trace (up to ~60k chars each).
func mooncakeTexts(b *testing.B, n int) []string {
	reqs, err := workload.Mooncake()
	if err != nil {
		b.Fatal(err)
	}
	var out []string
	for _, r := range reqs[:min(n, len(reqs))] {
		out = append(out, r.Prompt())
	}
	return out
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkWire publishes decisions end to end between two nodes on a real NATS server and
// reports the bytes on the wire per decision, the text's compression ratio and the CPU of the
// whole process (sender, receiver and the embedded NATS server) per 1,000 decisions.
func BenchmarkWire(b *testing.B) {
	for _, wl := range []struct {
		name  string
		texts func(*testing.B) []string
	}{
		{"chat", func(*testing.B) []string { return chatTexts() }},
		{"mooncake", func(b *testing.B) []string { return mooncakeTexts(b, 1000) }},
	} {
		b.Run(wl.name, func(b *testing.B) {
			texts := wl.texts(b)
			s := startNATS(b, nil)
			cfg := config(s.url())
			cfg.QueueLen = 1 << 16
			cfg.QueueBytes = 1 << 30
			a, c := join(b, cfg), join(b, cfg)
			connected(b, a, c)
			var chars int
			for _, t := range texts {
				chars += len(t)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			st0 := a.Stats()
			got0 := c.st.numDecisions()
			for i := 0; i < b.N; i++ {
				a.PublishDecision("llama", "10.0.0.1:8000", texts[i%len(texts)])
				if i%256 == 255 {
					// Keep within the queue: this measures the wire, not the drops.
					for c.st.numDecisions()-got0 < i-2048 {
						time.Sleep(time.Millisecond)
					}
				}
			}
			eventually(b, 60*time.Second, "peer did not receive all", func() bool { return c.st.numDecisions()-got0 == b.N })
			b.StopTimer()
			cpu := cpuTime() - cpu0
			st := a.Stats()
			if st.Dropped() != 0 {
				b.Fatalf("dropped %d: %+v", st.Dropped(), st)
			}
			text := float64(st.TextBytes - st0.TextBytes)
			b.ReportMetric(float64(st.SentBytes-st0.SentBytes)/float64(b.N), "wireB/decision")
			b.ReportMetric(text/float64(b.N), "textB/decision")
			b.ReportMetric(text/float64(st.WireTextBytes-st0.WireTextBytes), "compression")
			b.ReportMetric(cpu.Seconds()*1000/float64(b.N)*1000, "cpu-ms/1k-decisions")
			c.st.mu.Lock()
			c.st.decisions = nil
			c.st.mu.Unlock()
		})
	}
}

// BenchmarkPublishDecision is the caller's cost of PublishDecision with a node connected and
// its flusher draining the queue. Calls are paced as requests are (about 20k/s from each of
// two goroutines), so that the queue has room, as it has in service: an unpaced loop measures
// only the full-queue path (BenchmarkPublishDecisionQueue in package cluster). caller-ns/op
// is the time spent inside PublishDecision.
func BenchmarkPublishDecision(b *testing.B) {
	s := startNATS(b, nil)
	a := join(b, config(s.url()))
	connected(b, a)
	text := chatTexts()[100]
	var inside atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism(1)
	b.RunParallel(func(pb *testing.PB) {
		var d time.Duration
		for pb.Next() {
			t0 := time.Now()
			a.PublishDecision("llama", "10.0.0.1:8000", text)
			d += time.Since(t0)
			time.Sleep(50 * time.Microsecond) // the rest of the request
		}
		inside.Add(int64(d))
	})
	b.StopTimer()
	st := a.Stats()
	b.ReportMetric(float64(inside.Load())/float64(b.N), "caller-ns/op")
	b.ReportMetric(float64(st.DroppedQueue)/float64(b.N), "dropped/op")
}

var _ cluster.Handler = (*state)(nil)

// BenchmarkCatchUp is how long a replica that joins late takes to receive a peer's full
// catch-up log (16 MiB by default) of Mooncake decisions.
func BenchmarkCatchUp(b *testing.B) {
	texts := mooncakeTexts(b, 2000)
	s := startNATS(b, nil)
	cfg := config(s.url())
	cfg.QueueLen = 1 << 16
	cfg.QueueBytes = 1 << 30
	a := join(b, cfg)
	connected(b, a)
	chars := 0
	for _, t := range texts {
		a.PublishDecision("llama", "10.0.0.1:8000", t)
		chars += len(t)
	}
	eventually(b, 60*time.Second, "a did not publish all", func() bool {
		st := a.Stats()
		return st.TextBytes >= uint64(chars)
	})
	time.Sleep(100 * time.Millisecond) // the last batch into the log
	entries := a.Stats().LogEntries
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		c := join(b, cfg)
		eventually(b, 60*time.Second, "late joiner did not catch up", func() bool { return c.st.numDecisions() >= entries })
		b.ReportMetric(time.Since(start).Seconds(), "s/catch-up")
		b.ReportMetric(float64(entries), "records")
		b.ReportMetric(float64(a.Stats().LogBytes)/(1<<20), "log-MiB")
		c.Close()
	}
}
