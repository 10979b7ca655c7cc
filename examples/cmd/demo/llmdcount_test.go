package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/replay"
	"github.com/kvroute/caddy-kvroute/examples/workload"
	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
)

// TestLlmdOwnCount asks llm-d's simulator itself what it counts: each call of the chat workload
// and of the Mooncake trace is sent to one llm-d-inference-sim, and the growth of its prompt-token
// total is compared with llmdPrompt's count (the emulation the demo's reference and
// llmdCharsPerToken use) call by call; the chars per token is kvroute's routing text over the
// engine's total. This is how the demo knows what kv_cache_aware should learn on an llmd fleet.
func TestLlmdOwnCount(t *testing.T) {
	bin := os.Getenv("KVROUTE_LLMD_BIN")
	if bin == "" {
		if dir, err := findDir(llmdDir); err == nil {
			bin = filepath.Join(dir, llmdBinName)
		}
	}
	if _, err := os.Stat(bin); bin == "" || err != nil {
		t.Skip("no llm-d-inference-sim binary (examples/llmdsim/bin or KVROUTE_LLMD_BIN)")
	}
	ctx := context.Background()
	cfg := &config{workers: 1, blocks: 1 << 16, speed: 1000, kind: "mooncake", llmdBin: bin, slowFactor: 1}
	f, err := startLLMDFleet(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	url := "http://" + f.addrs[0]
	client := llmdClient(4)
	total := func() float64 {
		r := readWorker(t, url)
		if !r.Counters.Known.Has(telemetry.HasPromptTokens) {
			t.Fatalf("llm-d exports no prompt-token total: %v", r.Counters.Known)
		}
		return r.Counters.PromptTokens
	}
	// llm-d writes its prompt-token total once a request has finished: a first request makes it.
	warm, _ := json.Marshal(map[string]any{"model": workload.DefaultChat.Model, "prompt": "warm up", "max_tokens": 1})
	resp, err := client.Post(url+"/v1/completions", "application/json", bytes.NewReader(warm))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	workloads := map[string]workload.Workload{"chat": workload.ChatWorkload(workload.DefaultChat).Limit(4)}
	reqs, err := workload.Mooncake()
	if err != nil {
		t.Fatal(err)
	}
	workloads["mooncake"] = workload.MooncakeWorkload(reqs, workload.MooncakeConfig{Model: workload.DefaultChat.Model, MaxTokens: 1}).Limit(12)
	for name, w := range workloads {
		var chars, counted, emulated float64
		calls := 0
		for _, s := range w.Sessions {
			for _, c := range s.Calls {
				c = c.Resolve()
				c.MaxTokens = 1
				body, err := c.Body(false)
				if err != nil {
					t.Fatal(err)
				}
				before := total()
				resp, err := client.Post(url+c.API.Path(), "application/json", bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				var usage struct {
					Usage struct {
						PromptTokens int `json:"prompt_tokens"`
					} `json:"usage"`
				}
				json.NewDecoder(resp.Body).Decode(&usage)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s call %d: %s", name, calls, resp.Status)
				}
				want := float64(llmdPrompt(c, 16).Tokens)
				// llm-d updates its counters on a goroutine of its own after the answer: wait
				// for the total to move (a bound; a wrong count still fails below).
				got := total() - before
				for deadline := time.Now().Add(3 * time.Second); got == 0 && time.Now().Before(deadline); {
					time.Sleep(10 * time.Millisecond)
					got = total() - before
				}
				if got != want || float64(usage.Usage.PromptTokens) != got {
					t.Errorf("%s call %d: llm-d counted %v prompt tokens (usage %d), the emulation %v", name, calls, got, usage.Usage.PromptTokens, want)
				}
				chars += float64(llmreq.Parse(body, false).Runes)
				counted += got
				emulated += want
				calls++
			}
		}
		t.Logf("%s: %d calls, %.0f chars of routing text, llm-d counted %.0f prompt tokens (emulation %.0f): %.3f chars per token",
			name, calls, chars, counted, emulated, chars/counted)
	}
}

// TestSimOwnCount is TestLlmdOwnCount for our simulator: what a worker counts for each call
// equals what fleetCharsPerToken assumes (llmsim's tokens of replay.SimText), and the chars per
// token it makes of kvroute's routing text.
func TestSimOwnCount(t *testing.T) {
	cfg := &config{workers: 1, blocks: 1 << 16, speed: 1000, slowFactor: 1}
	f, err := startSimFleet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := workload.ChatWorkload(workload.DefaultChat).Limit(4)
	b := &bench{fleet: f, workload: w}
	var chars, counted float64
	for _, s := range w.Sessions {
		for _, c := range s.Calls {
			c = c.Resolve()
			c.MaxTokens = 1
			body, err := c.Body(false)
			if err != nil {
				t.Fatal(err)
			}
			before := f.Workers[0].Stats().PromptTokens
			resp, err := http.Post(f.Workers[0].URL+c.API.Path(), "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			got := float64(f.Workers[0].Stats().PromptTokens - before)
			if want := float64(llmsim.NewPrompt(replay.SimText(c), f.BlockTokens()).Tokens); got != want {
				t.Errorf("call: the worker counted %v prompt tokens, the emulation %v", got, want)
			}
			chars += float64(llmreq.Parse(body, false).Runes)
			counted += got
		}
	}
	own := b.fleetCharsPerToken()
	t.Logf("chat: %.0f chars of routing text, the worker counted %.0f tokens: %.3f chars per token (fleetCharsPerToken %.3f)", chars, counted, chars/counted, own)
	if d := chars/counted - own; d > 1e-9 || d < -1e-9 {
		t.Errorf("fleetCharsPerToken %v, the worker's count %v", own, chars/counted)
	}
}
