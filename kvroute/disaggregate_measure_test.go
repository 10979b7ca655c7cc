package kvroute

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/replay"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// TestDisaggregateMeasure replays the start of the Mooncake trace through Caddy on 4 simulated
// workers: aggregated (4 whole workers) against P/D (2 prefill + 2 decode, split auto and
// split always), the modes alternating within each repeat. Off unless KVROUTE_PD_MEASURE
// gives the number of trace requests; KVROUTE_PD_REPEATS the repeats (default 3).
func TestDisaggregateMeasure(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KVROUTE_PD_MEASURE"))
	if n <= 0 {
		t.Skip("KVROUTE_PD_MEASURE not set")
	}
	repeats := 3
	if r, _ := strconv.Atoi(os.Getenv("KVROUTE_PD_REPEATS")); r > 0 {
		repeats = r
	}
	path := workload.FindTrace(workload.TraceFile)
	reqs, err := workload.LoadMooncake(path)
	if err != nil {
		t.Skipf("no Mooncake trace: %v", err)
	}
	reqs = reqs[:min(n, len(reqs))]
	w := workload.MooncakeWorkload(reqs, workload.MooncakeConfig{Model: llmsim.DefaultModel, MaxTokens: 64})
	leakCheck(t)
	const speed = 10
	blocks := workload.MooncakeFleetBlocks / 4
	sim := func(name, role string, tr *llmsim.Transfers) *llmsim.Worker {
		wk, err := llmsim.StartWorker("127.0.0.1:0", llmsim.Config{Name: name, Role: role, Transfers: tr, Speed: speed, CapacityBlocks: blocks})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { wk.Close() })
		return wk
	}
	type mode struct{ name, split string }
	modes := []mode{{"aggregated", ""}, {"pd_auto", "auto"}, {"pd_always", "always"}}
	type fig struct{ p50, p99, rps, hit, errs, split, short []float64 }
	figs := map[string]*fig{}
	for rep := 0; rep < repeats; rep++ {
		order := slices.Clone(modes)
		if rep%2 == 1 {
			slices.Reverse(order)
		}
		for _, m := range order {
			tr := llmsim.NewTransfers()
			var cfg string
			if m.split == "" {
				var addrs []string
				for i := 0; i < 4; i++ {
					addrs = append(addrs, sim(fmt.Sprintf("w%d", i), llmsim.RoleAggregated, nil).Addr)
				}
				cfg = feedbackConfig(strings.Join(addrs, " "), "")
			} else {
				p := []string{sim("p0", llmsim.RolePrefill, tr).Addr, sim("p1", llmsim.RolePrefill, tr).Addr}
				d := []string{sim("d0", llmsim.RoleDecode, tr).Addr, sim("d1", llmsim.RoleDecode, tr).Addr}
				cfg = pdConfig(strings.Join(p, " "), strings.Join(d, " "), "split "+m.split, "")
			}
			load(t, cfg)
			split0, short0 := disaggCounts[disaggSplit].Load(), disaggCounts[disaggShort].Load()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			tp := &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
			res, err := replay.Run(ctx, w, replay.Options{BaseURL: baseURL, OpenLoop: true, TimeScale: 0.1, Workers: 4, Client: &http.Client{Transport: tp}})
			cancel()
			tp.CloseIdleConnections()
			if err != nil {
				t.Fatal(err)
			}
			f := figs[m.name]
			if f == nil {
				f = new(fig)
				figs[m.name] = f
			}
			f.p50 = append(f.p50, res.TTFTP50Ms)
			f.p99 = append(f.p99, res.TTFTP99Ms)
			f.rps = append(f.rps, res.RequestsPerSecond)
			f.hit = append(f.hit, res.HitRatio)
			f.errs = append(f.errs, float64(res.Errors))
			f.split = append(f.split, float64(disaggCounts[disaggSplit].Load()-split0))
			f.short = append(f.short, float64(disaggCounts[disaggShort].Load()-short0))
			load(t, idleConfig)
		}
	}
	med := func(v []float64) string {
		s := slices.Clone(v)
		slices.Sort(s)
		return fmt.Sprintf("%.4g [%.4g–%.4g]", s[len(s)/2], s[0], s[len(s)-1])
	}
	t.Logf("Mooncake, first %d requests, open loop time-scale 0.1, max_tokens 64; llmsim speed %d, %d blocks/worker, prefill 50µs/token, decode 2ms/token, transfer 5µs/token; %d repeats, median [min–max]",
		len(reqs), speed, blocks, repeats)
	for _, m := range modes {
		f := figs[m.name]
		t.Logf("%-10s TTFT p50 %s ms  p99 %s ms  req/s %s  hit %s  errors %s  split %s  short %s",
			m.name, med(f.p50), med(f.p99), med(f.rps), med(f.hit), med(f.errs), med(f.split), med(f.short))
	}
}
