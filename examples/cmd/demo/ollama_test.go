package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvroute/caddy-kvroute/examples/replay"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// TestCapTokens: the Ollama fleet's client caps answers with a last max_tokens, which wins over
// the workload's.
func TestCapTokens(t *testing.T) {
	var got []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
	}))
	defer srv.Close()
	client := (&ollamaFleet{}).Client(1)
	resp, err := client.Post(srv.URL, "application/json", strings.NewReader(`{"model":"m","max_tokens":200,"messages":[]}`+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var req struct {
		MaxTokens int `json:"max_tokens"`
	}
	if err := json.Unmarshal(got, &req); err != nil || req.MaxTokens != ollamaMaxTokens {
		t.Fatalf("the engine got %s: max_tokens %d (%v), want %d", got, req.MaxTokens, err, ollamaMaxTokens)
	}
}

// TestOllamaDefaults: -fleet ollama alone runs a few minutes of work (the workload and policies
// of docs/benchmarks.md's run on Ollama, 3 interleaved rounds); each flag given wins.
func TestOllamaDefaults(t *testing.T) {
	cfg, err := parseFlags([]string{"-caddy", "x", "-fleet", "ollama"})
	if err != nil {
		t.Fatal(err)
	}
	w, err := cfg.workload()
	if err != nil {
		t.Fatal(err)
	}
	if w.Calls() != 48 || cfg.concurrency != 4 || cfg.repeats != 3 || !cfg.interleave || len(cfg.defaultPolicies) != 4 {
		t.Errorf("defaults: %d calls, %d clients, %d repeats, interleave %v, policies %v", w.Calls(), cfg.concurrency, cfg.repeats, cfg.interleave, cfg.defaultPolicies)
	}
	cfg, err = parseFlags([]string{"-caddy", "x", "-fleet", "ollama", "-turns", "6", "-repeats", "1", "-policies", "kv_cache_aware"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.chat.Turns != 6 || cfg.chat.Conversations != 12 || cfg.repeats != 1 || cfg.defaultPolicies != nil {
		t.Errorf("given flags: turns %d, conversations %d, repeats %d, default policies %v", cfg.chat.Turns, cfg.chat.Conversations, cfg.repeats, cfg.defaultPolicies)
	}
	sim, err := parseFlags([]string{"-caddy", "x"})
	if err != nil {
		t.Fatal(err)
	}
	if sim.chat != workload.DefaultChat || sim.repeats != 1 || sim.defaultPolicies != nil {
		t.Errorf("the sim fleet's defaults changed: %+v, repeats %d", sim.chat, sim.repeats)
	}
}

// TestOwnCountOllama: a real engine's own chars per token is what its answers reported over the
// run (the routing chars over their prompt tokens), not the demo's model of a tokenizer.
func TestOwnCountOllama(t *testing.T) {
	w := workload.ChatWorkload(workload.ChatConfig{Conversations: 2, Turns: 2, SystemPrompts: 1, Seed: 1})
	b := &bench{cfg: &config{fleet: "ollama"}, fleet: &ollamaFleet{kind: "Ollama"}, workload: w}
	chars := b.workloadChars()
	line := b.ownCountLine(&replay.Result{PromptTokens: int64(chars / 3.5)})
	if !strings.Contains(line, "Ollama's own count over this run: 3.50") {
		t.Errorf("line %q, want 3.50 chars per token from the answers' prompt tokens", line)
	}
	if line := b.ownCountLine(&replay.Result{}); !strings.Contains(line, "not known") {
		t.Errorf("without prompt tokens: %q", line)
	}
}
