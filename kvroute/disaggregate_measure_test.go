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
// split always; SGLang's protocol with kv_cache_aware or round_robin on the prefill pool), the
// modes alternating within each repeat. Off unless KVROUTE_PD_MEASURE gives the number of trace
// requests; KVROUTE_PD_REPEATS the repeats (default 3); KVROUTE_PD_MODES a comma-separated
// subset of the modes (default all).
func TestDisaggregateMeasure(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KVROUTE_PD_MEASURE"))
	if n <= 0 {
		t.Skip("KVROUTE_PD_MEASURE not set")
	}
	repeats := 3
	if r, _ := strconv.Atoi(os.Getenv("KVROUTE_PD_REPEATS")); r > 0 {
		repeats = r
	}
	reqs, err := workload.Mooncake()
	if err != nil {
		t.Fatal(err)
	}
	reqs = reqs[:min(n, len(reqs))]
	w := workload.MooncakeWorkload(reqs, workload.MooncakeConfig{Model: llmsim.DefaultModel, MaxTokens: 64})
	leakCheck(t)
	const speed = 10
	blocks := workload.MooncakeFleetBlocks / 4
	var prefills []*llmsim.Worker
	sim := func(name, role string, tr *llmsim.Transfers, protocol, boot string) *llmsim.Worker {
		wk, err := llmsim.StartWorker("127.0.0.1:0", llmsim.Config{Name: name, Role: role, Transfers: tr, Speed: speed, CapacityBlocks: blocks,
			Protocol: protocol, BootstrapAddr: boot})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { wk.Close() })
		if role == llmsim.RolePrefill {
			prefills = append(prefills, wk)
		}
		return wk
	}
	type mode struct{ name, split, protocol, prefillPolicy string }
	modes := []mode{{"aggregated", "", "", ""}, {"pd_auto", "auto", "", ""}, {"pd_always", "always", "", ""},
		{"sglang", "", llmsim.ProtocolSGLang, "kv_cache_aware"}, {"sglang_rr", "", llmsim.ProtocolSGLang, "round_robin"}}
	if only := os.Getenv("KVROUTE_PD_MODES"); only != "" {
		modes = slices.DeleteFunc(modes, func(m mode) bool { return !slices.Contains(strings.Split(only, ","), m.name) })
	}
	type fig struct{ p50, p99, rps, hit, errs, split, short, phit []float64 }
	figs := map[string]*fig{}
	for rep := 0; rep < repeats; rep++ {
		order := slices.Clone(modes)
		if rep%2 == 1 {
			slices.Reverse(order)
		}
		for _, m := range order {
			tr := llmsim.NewTransfers()
			prefills = prefills[:0]
			var cfg string
			switch {
			case m.protocol == llmsim.ProtocolSGLang:
				opts := "protocol sglang"
				var p []string
				for i := range 2 {
					boot := fmt.Sprintf("127.0.0.1:%d", 19401+i)
					p = append(p, sim(fmt.Sprintf("p%d", i), llmsim.RolePrefill, tr, m.protocol, boot).Addr)
					opts += fmt.Sprintf("\n\t\tbootstrap_port %s %d", p[i], 19401+i)
				}
				d := []string{sim("d0", llmsim.RoleDecode, tr, m.protocol, "").Addr, sim("d1", llmsim.RoleDecode, tr, m.protocol, "").Addr}
				cfg = pdConfig(strings.Join(p, " "), strings.Join(d, " "), opts, "")
				if m.prefillPolicy != "kv_cache_aware" {
					cfg = strings.Replace(cfg, "lb_policy kv_cache_aware {\n\t\t\ttelemetry off\n\t\t}", "lb_policy "+m.prefillPolicy, 1)
				}
			case m.split == "":
				var addrs []string
				for i := 0; i < 4; i++ {
					addrs = append(addrs, sim(fmt.Sprintf("w%d", i), llmsim.RoleAggregated, nil, "", "").Addr)
				}
				cfg = feedbackConfig(strings.Join(addrs, " "), "")
			default:
				p := []string{sim("p0", llmsim.RolePrefill, tr, "", "").Addr, sim("p1", llmsim.RolePrefill, tr, "", "").Addr}
				d := []string{sim("d0", llmsim.RoleDecode, tr, "", "").Addr, sim("d1", llmsim.RoleDecode, tr, "", "").Addr}
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
			// The prefill pool's hit ratio: prompt tokens its workers found cached.
			var cached, prompt uint64
			for _, wk := range prefills {
				st := wk.Stats()
				cached, prompt = cached+st.CachedTokens, prompt+st.PromptTokens
			}
			if prompt > 0 {
				f.phit = append(f.phit, float64(cached)/float64(prompt))
			}
			load(t, idleConfig)
		}
	}
	med := func(v []float64) string {
		s := slices.Clone(v)
		slices.Sort(s)
		return fmt.Sprintf("%.4g [%.4g–%.4g]", s[len(s)/2], s[0], s[len(s)-1])
	}
	t.Logf("Mooncake, first %d requests, open loop time-scale 0.1, max_tokens 64; llmsim speed %d, %d blocks/worker, prefill 50µs/token (1 prefill slot), decode 2ms/token, 8 slots, transfer 5µs/token, sglang bootstrap timeout 10s; %d repeats, median [min–max]",
		len(reqs), speed, blocks, repeats)
	for _, m := range modes {
		f := figs[m.name]
		phit := "–"
		if len(f.phit) > 0 {
			phit = med(f.phit)
		}
		t.Logf("%-10s TTFT p50 %s ms  p99 %s ms  req/s %s  hit %s  prefill-pool hit %s  errors %s  split %s  short %s",
			m.name, med(f.p50), med(f.p99), med(f.rps), med(f.hit), phit, med(f.errs), med(f.split), med(f.short))
	}
}
