package kvroute

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
)

// A request split by llm_disaggregate is one request of its client: its tenant is charged
// once, and settled at what its answer (the decode leg's) shows used, not at that plus the
// prefill leg's (issue 40, item 7). With flow_control in both pools, and in the prefill pool
// only; protocols vllm and sglang, on the repository's simulated engines in P/D mode.
func TestFairSplitRequestChargedOnce(t *testing.T) {
	const flowBlock = `flow_control {
				tenant {http.request.header.X-Tenant}
			}`
	for _, c := range []struct {
		name        string
		sglang      bool
		prefillOnly bool
	}{
		{"vllm/both", false, false},
		{"vllm/prefill-only", false, true},
		{"sglang/both", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			leakCheck(t)
			tr := llmsim.NewTransfers()
			var prefill, decode, opts string
			if c.sglang {
				p, d, o := sglangFleet(t, tr, llmsim.Config{Speed: 50, MinEventInterval: -1})
				prefill, decode, opts = addrs(p), addrs(d), o
			} else {
				start := func(name, role string) *llmsim.Worker {
					w, err := llmsim.StartWorker("127.0.0.1:0", llmsim.Config{Name: name, Role: role, Transfers: tr, Speed: 50, MinEventInterval: -1})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { w.Close() })
					return w
				}
				prefill, decode, opts = start("p0", llmsim.RolePrefill).Addr, start("d0", llmsim.RoleDecode).Addr, "split always"
			}
			decodeOpts := flowBlock
			if c.prefillOnly {
				decodeOpts = ""
			}
			cfg := pdConfig(prefill, decode, opts, decodeOpts)
			// The prefill pool's policy: the first lb_policy block, in llm_disaggregate's.
			cfg = strings.Replace(cfg, "telemetry off\n", "telemetry off\n\t\t\t"+flowBlock+"\n", 1)
			cfg = strings.ReplaceAll(cfg, `"m"`, `"`+llmsim.DefaultModel+`"`)
			startCaddy(t, cfg)
			split := disaggCounts[disaggSplit].Load()
			tenant := "pd-once-" + strings.ReplaceAll(c.name, "/", "-")
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":8,"stream":false}`,
				llmsim.DefaultModel, strings.Repeat("words to prefill ", 300))
			req, _ := http.NewRequest(http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Tenant", tenant)
			resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var ans struct {
				Usage struct {
					PromptTokens     float64 `json:"prompt_tokens"`
					CompletionTokens float64 `json:"completion_tokens"`
				} `json:"usage"`
			}
			err = json.NewDecoder(resp.Body).Decode(&ans)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || ans.Usage.PromptTokens == 0 {
				t.Fatalf("status %d, usage %+v, err %v", resp.StatusCode, ans.Usage, err)
			}
			waitFor(t, func() bool { return disaggCounts[disaggSplit].Load() > split }, "the request was split")
			want := ans.Usage.PromptTokens + DefaultOutputWeight*ans.Usage.CompletionTokens
			series := fmt.Sprintf(`caddy_kvroute_tenant_tokens_served{tenant=%q}`, tenant)
			// Settled when the request and its legs end, just after the client has its answer.
			var got float64
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if got = metricValue(t, series); got == want {
					break
				}
			}
			if got != want {
				t.Errorf("tenant charged %v tokens for one split request, want %v (its answer: %v prompt + 2 × %v completion tokens)",
					got, want, ans.Usage.PromptTokens, ans.Usage.CompletionTokens)
			}
		})
	}
}
