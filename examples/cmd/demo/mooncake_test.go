package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/replay"
)

// TestMooncakeClosedLoop: -workload mooncake stays open loop by default, and -open=false
// replays the trace closed loop: -concurrency clients, each sending the trace's next request
// when its previous answer ends, whatever the trace's timestamps. The trace's requests are an
// hour apart (six minutes at the default time scale), so an open-loop replay would send one
// and wait; closed loop sends all eight at once through a real loopback worker, never more
// than -concurrency in flight (counted by a proxy in front of the worker: a client's next
// request starts after its previous answer, and so after the proxy's handler, ended).
func TestMooncakeClosedLoop(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "trace.jsonl")
	var lines []string
	for i := range 8 {
		lines = append(lines, fmt.Sprintf(`{"timestamp": %d, "input_length": 1024, "output_length": 4, "hash_ids": [%d, %d]}`, i*3600_000, 100+i%3, 200+i))
	}
	if err := os.WriteFile(trace, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	open, err := parseFlags([]string{"-caddy", "x", "-workload", "mooncake", "-trace", trace})
	if err != nil {
		t.Fatal(err)
	}
	if o := open.replayOptions("http://x", 1, 16); !o.OpenLoop || open.loopDescription() != "open loop, time scale 0.1" {
		t.Errorf("mooncake without -open: open loop %v (%s), want the open-loop default", o.OpenLoop, open.loopDescription())
	}
	cfg, err := parseFlags([]string{"-caddy", "x", "-workload", "mooncake", "-trace", trace, "-open=false", "-concurrency", "2", "-workers", "1", "-max-num-seqs", "4"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.openLoop || cfg.loopDescription() != "closed loop, 2 clients" {
		t.Fatalf("mooncake with -open=false: open loop %v (%s), want closed loop, 2 clients", cfg.openLoop, cfg.loopDescription())
	}
	w, err := cfg.workload()
	if err != nil {
		t.Fatal(err)
	}
	f, err := startSimFleet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	target, _ := url.Parse(f.Workers[0].URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	var inFlight, most atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		rp.ServeHTTP(rw, r)
	}))
	defer proxy.Close()
	// An open-loop replay would still be waiting for the second request's time (six minutes)
	// when this ends.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := replay.Run(ctx, w, cfg.replayOptions(proxy.URL, cfg.blocks, 16))
	if err != nil {
		t.Fatal(err)
	}
	if res.Interrupted || res.Requests != 8 || res.Errors != 0 || res.Mode != "closed" {
		t.Errorf("closed-loop replay: mode %q, %d requests sent, %d errors, interrupted %v; want closed, 8, 0, false", res.Mode, res.Requests, res.Errors, res.Interrupted)
	}
	if m := most.Load(); m > 2 || m < 1 {
		t.Errorf("%d requests in flight at most, want 1-2 (2 closed-loop clients)", m)
	}
}

// TestMooncakeFreshClone: -workload mooncake without -trace reads the trace the repository
// ships, from a working directory with nothing of the project's around it and no
// KVROUTE_WORKLOADS.
func TestMooncakeFreshClone(t *testing.T) {
	t.Setenv("KVROUTE_WORKLOADS", "")
	os.Unsetenv("KVROUTE_WORKLOADS")
	t.Chdir(t.TempDir())
	cfg, err := parseFlags([]string{"-caddy", "x", "-workload", "mooncake", "-limit", "5"})
	if err != nil {
		t.Fatal(err)
	}
	w, err := cfg.workload()
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Sessions) != 5 || w.Sessions[0].Calls[0].Trace == nil || w.Sessions[0].Calls[0].Trace.InputLength != 40160 {
		t.Fatalf("%d sessions, want the trace's first 5", len(w.Sessions))
	}
}
