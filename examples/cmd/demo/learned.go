package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/replay"
	"github.com/kvroute/caddy-kvroute/examples/workload"
	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
)

// learnedReport reads what kv_cache_aware learned from the engines' totals during a run (its
// GET /kvroute/ and its metrics) and describes it on one line: the chars per token it learned
// against the engines' own count over the whole run (the routing chars it sent over the prompt
// tokens they counted), the tree bound that allows per worker, the prefill speeds, the engines'
// own hit ratio against the router's prediction, and restarts.
func learnedReport(admin int, addrs []string) (string, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://localhost:%d/kvroute/", admin))
	if err != nil {
		return "", err
	}
	var st struct {
		CharsPerToken map[string]float64 `json:"chars_per_token"`
		Upstreams     map[string]struct {
			TreeBoundChars   int64 `json:"tree_bound_chars"`
			KVCapacityTokens int64 `json:"kv_capacity_tokens"`
			Learned          struct {
				Prefill  float64 `json:"prefill_tokens_per_second"`
				Learned  bool    `json:"prefill_learned"`
				Restarts uint64  `json:"restarts"`
				Exports  string  `json:"exports"`
			} `json:"learned"`
		} `json:"upstreams"`
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil {
		return "", err
	}
	resp, err = client.Get(fmt.Sprintf("http://localhost:%d/metrics", admin))
	if err != nil {
		return "", err
	}
	totals := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, name := range []string{"routed_chars_total", "predicted_cached_chars_total", "engine_prompt_tokens_total",
			"engine_cache_queries_total", "engine_cache_hits_total"} {
			if strings.HasPrefix(line, "caddy_kvroute_"+name+"{") {
				f := strings.Fields(line)
				if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
					totals[name] += v
				}
			}
		}
	}
	resp.Body.Close()
	var b strings.Builder
	var models []string
	for m, c := range st.CharsPerToken {
		models = append(models, fmt.Sprintf("%s %.2f", m, c))
	}
	slices.Sort(models)
	if len(models) == 0 {
		models = []string{"none (4 used)"}
	}
	fmt.Fprintf(&b, "learned chars/token: %s", strings.Join(models, ", "))
	if p := totals["engine_prompt_tokens_total"]; p > 0 {
		fmt.Fprintf(&b, "; engines' own count over the run %.2f", totals["routed_chars_total"]/p)
	}
	var bounds, speeds []string
	var restarts uint64
	exports := ""
	for _, a := range addrs { // in fleet order, as the other lines
		u, ok := st.Upstreams[a]
		if !ok {
			continue
		}
		bounds = append(bounds, fmt.Sprintf("%d", u.TreeBoundChars))
		s := fmt.Sprintf("%.0f", u.Learned.Prefill)
		if !u.Learned.Learned {
			s += " (prior)"
		}
		speeds = append(speeds, s)
		restarts += u.Learned.Restarts
		exports = u.Learned.Exports
	}
	if exports == "" {
		exports = "nothing (no /metrics read)"
	}
	fmt.Fprintf(&b, "\n  tree bound per worker (chars): %s; prefill tokens/s: %s; engines export: %s; restarts: %d",
		strings.Join(bounds, " "), strings.Join(speeds, " "), exports, restarts)
	if q := totals["engine_cache_queries_total"]; q > 0 && totals["routed_chars_total"] > 0 {
		fmt.Fprintf(&b, "\n  engines' own hit ratio %.3f, router's predicted %.3f",
			totals["engine_cache_hits_total"]/q, totals["predicted_cached_chars_total"]/totals["routed_chars_total"])
	}
	return b.String(), nil
}

// llmdCharsPerToken is llm-d's simulator's own chars per token on a workload: the routing text
// kvroute extracts from each call's body over the tokens the simulator's dummy tokenizer counts
// for it, over every call. It is what kv_cache_aware should learn on an llmd fleet.
func llmdCharsPerToken(w workload.Workload, blockTokens int) float64 {
	return engineCharsPerToken(w, func(c workload.Call) llmsim.Prompt { return llmdPrompt(c, blockTokens) })
}

// engineCharsPerToken is a fleet's own chars per token on a workload: kvroute's routing text of
// every call over the prompt tokens prompt says the engine counts for it.
func engineCharsPerToken(w workload.Workload, prompt func(workload.Call) llmsim.Prompt) float64 {
	var chars, tokens float64
	for _, s := range w.Sessions {
		for _, c := range s.Calls {
			c = c.Resolve()
			body, err := c.Body(false)
			if err != nil {
				continue
			}
			chars += float64(llmreq.Parse(body, false).Runes)
			tokens += float64(prompt(c).Tokens)
		}
	}
	if tokens == 0 {
		return 0
	}
	return chars / tokens
}

// workloadChars are the routing text's chars over every call of the workload, as kvroute
// extracts them.
func (b *bench) workloadChars() float64 {
	var chars float64
	for _, s := range b.workload.Sessions {
		for _, c := range s.Calls {
			if body, err := c.Resolve().Body(false); err == nil {
				chars += float64(llmreq.Parse(body, false).Runes)
			}
		}
	}
	return chars
}

// fleetCharsPerToken is the fleet's own chars per token on the workload (llmd: its dummy
// tokenizer's; sim: llmsim's 4 chars per token of the text it renders).
func (b *bench) fleetCharsPerToken() float64 {
	if b.ownChars == 0 {
		prompt := b.fleet.Prompt()
		if prompt == nil {
			bt := b.fleet.BlockTokens()
			prompt = func(c workload.Call) llmsim.Prompt { return llmsim.NewPrompt(replay.SimText(c), bt) }
		}
		b.ownChars = engineCharsPerToken(b.workload, prompt)
	}
	return b.ownChars
}
