package telemetry

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// BenchmarkParse parses the real vLLM page (24.8 KB, 15 histograms) as a scrape loop does,
// reusing its buffer.
func BenchmarkParse(b *testing.B) {
	page := fixture(b, "vllm_v1_qwen3.txt")
	var p parser
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.parse(page); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseWholePage is the reference for BenchmarkParse: the same page through the text
// parser without skipping the families routing does not need.
func BenchmarkParseWholePage(b *testing.B) {
	page := fixture(b, "vllm_v1_qwen3.txt")
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		tp := expfmt.NewTextParser(model.UTF8Validation)
		if _, err := tp.TextToMetricFamilies(bytes.NewReader(page)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScrape is one whole scrape of the real vLLM page over loopback HTTP: request,
// response, bounded read and parse. cpu-ns/op is the process's CPU time (user + system) per
// scrape, the test server's share included, so it is an upper bound of what a scrape costs the
// router: 100 upstreams at the default 1s interval cost 100 × cpu-ns/op per second of one core.
func BenchmarkScrape(b *testing.B) {
	page := fixture(b, "vllm_v1_qwen3.txt")
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.Write(page)
	}))
	defer ts.Close()
	s := NewScraper(Options{Timeout: 5 * time.Second})
	defer s.Stop()
	tg := &target{Target: Target{Key: "w", URL: ts.URL + "/metrics"}}
	ctx := context.Background()
	b.ReportAllocs()
	start := cpuTime()
	for b.Loop() {
		if _, outcome, err := s.fetch(ctx, tg); outcome != OutcomeOK {
			b.Fatal(outcome, err)
		}
	}
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkSnapshot is what the decision path pays to read a target's latest figures.
func BenchmarkSnapshot(b *testing.B) {
	s := NewScraper(Options{Interval: time.Hour})
	defer s.Stop()
	for _, k := range []string{"a", "b", "c", "d"} {
		if err := s.Add(Target{Key: k, URL: "http://127.0.0.1:1/metrics"}); err != nil {
			b.Fatal(err)
		}
		(*s.targets.Load())[k].snap.Store(&Snapshot{Key: k, Reading: Reading{Figures: Figures{Running: 1}}})
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if s.Snapshot("c").Reading.Running != 1 {
				b.Error("lost the reading")
			}
		}
	})
}
