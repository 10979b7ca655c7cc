package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// step is one request of the walkthrough and where kv_cache_aware sent it.
type step struct {
	What         string `json:"what"`
	Worker       string `json:"worker"` // w0, w1, ... (the upstream's index in the fleet)
	PromptTokens int    `json:"prompt_tokens"`
	CachedTokens int    `json:"cached_tokens"`
	// Ms is the whole answer's time (the walkthrough's requests are not streamed): where an
	// engine reports no cached tokens (Ollama), its cache shows only there.
	Ms    float64 `json:"ms"`
	Error string  `json:"error,omitempty"`
}

// walkthrough sends, through kv_cache_aware on an empty fleet, the first turns of a
// conversation, then unrelated prompts, then the conversation's next turns, one at a time,
// and prints where each went and what it hit: the conversation stays on its worker and hits
// its own history; the unrelated prompts are spread by load.
func (b *bench) walkthrough(ctx context.Context) ([]step, error) {
	kv := allPolicies(b.cfg.kvOptions)[0]
	if err := b.fleet.Fresh(ctx); err != nil {
		return nil, err
	}
	caddy, err := b.startCaddy(ctx, kv)
	if err != nil {
		return nil, err
	}
	defer caddy.Stop()

	conv := workload.ChatWorkload(workload.ChatConfig{Conversations: 1, Turns: 5, SystemPrompts: 1, Seed: 7}).Sessions[0].Calls
	type item struct {
		what string
		call workload.Call
	}
	var items []item
	for t := range 3 {
		items = append(items, item{fmt.Sprintf("conversation A, turn %d", t+1), conv[t]})
	}
	for k := range 3 {
		other := workload.ChatWorkload(workload.ChatConfig{Conversations: 1, Turns: 1, SystemPrompts: 1, Seed: 100 + uint64(k)})
		items = append(items, item{fmt.Sprintf("unrelated prompt %d", k+1), other.Sessions[0].Calls[0]})
	}
	for t := 3; t < len(conv); t++ {
		items = append(items, item{fmt.Sprintf("conversation A, turn %d", t+1), conv[t]})
	}

	client := b.fleet.Client(4)
	if client == nil {
		client = &http.Client{}
	}
	client.Timeout = time.Minute
	fmt.Printf("Walkthrough: kv_cache_aware on an empty fleet (%s), one request at a time\n", workerLegend(b.fleet.Addrs()))
	reportsCached := b.cfg.fleet != "ollama"
	if !reportsCached {
		fmt.Printf("  %s reports no cached tokens (its answers' usage has none): a prefix it holds shows as a shorter time,\n"+
			"  the turns of conversation A against their first, not as cached tokens.\n", engineName(b.fleet))
	}
	fmt.Printf("  %-26s %8s  %-6s %8s %8s\n", "request", "prompt", "worker", "cached", "ms")
	var steps []step
	for _, it := range items {
		st := b.send(ctx, client, caddy.URL, it.call)
		st.What = it.what
		steps = append(steps, st)
		if st.Error != "" {
			fmt.Printf("  %-26s error: %s\n", st.What, st.Error)
			continue
		}
		cached := fmt.Sprint(st.CachedTokens)
		if !reportsCached {
			cached = "-"
		}
		fmt.Printf("  %-26s %8d  %-6s %8s %8.0f\n", st.What, st.PromptTokens, st.Worker, cached, st.Ms)
	}
	if reportsCached {
		fmt.Println("  (tokens as the worker counts them; cached = its prefix cache hit; ms = the whole answer)")
	} else {
		fmt.Println("  (tokens as the worker counts them; ms = the whole answer, prefill and its few output tokens)")
	}
	return steps, ctx.Err()
}

// send posts one non-streamed call and reads the serving worker and the usage.
func (b *bench) send(ctx context.Context, client *http.Client, base string, c workload.Call) step {
	body, err := c.Body(false)
	if err != nil {
		return step{Error: err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+c.API.Path(), bytes.NewReader(body))
	if err != nil {
		return step{Error: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range c.Headers {
		req.Header.Set(k, v)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return step{Error: err.Error()}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	ms := float64(time.Since(start)) / float64(time.Millisecond)
	if resp.StatusCode != http.StatusOK {
		return step{Error: fmt.Sprintf("HTTP %d: %.200s", resp.StatusCode, raw)}
	}
	var out struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return step{Error: fmt.Sprintf("bad response: %v", err)}
	}
	st := step{Worker: workerName(b.fleet.Addrs(), resp.Header.Get(workerHeader)), PromptTokens: out.Usage.PromptTokens, Ms: ms}
	if out.Usage.Details != nil {
		st.CachedTokens = out.Usage.Details.CachedTokens
	}
	return st
}

// engineName is the fleet's engine without its settings ("Ollama v0.6.5").
func engineName(f fleet) string {
	name, _, _ := strings.Cut(f.Kind(), " (")
	return name
}

// workerName maps an upstream address to its short name w0, w1, ... ("?" plus the value when
// it is not in the fleet).
func workerName(addrs []string, addr string) string {
	if i := slices.Index(addrs, addr); i >= 0 {
		return fmt.Sprintf("w%d", i)
	}
	return "?" + addr
}

// workerLegend lists the short names of the workers with their addresses.
func workerLegend(addrs []string) string {
	var b bytes.Buffer
	for i, a := range addrs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "w%d=%s", i, a)
	}
	return b.String()
}
