package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvroute/caddy-kvroute/energy"
	"github.com/kvroute/caddy-kvroute/examples/replay"
)

// workerEnergy is one worker's energy per token, as -energy gives it: what an operator writes
// in its upstream block (prefill_energy_per_token, energy_per_token) and what the demo charges
// for the tokens the worker reports.
type workerEnergy struct {
	Prefill energy.Joules `json:"prefill_per_token"` // per uncached prompt token
	Decode  energy.Joules `json:"decode_per_token"`  // per output token
}

func (e workerEnergy) String() string { return e.Prefill.String() + "/" + e.Decode.String() }

// energyPresets are the accelerator classes -energy names, for an 8B model in vLLM at a
// decode batch of about 64, board power over tokens per second. H100 SXM (700 W): prefill
// about 28k tokens/s, decode about 4,700 tokens/s. A100 SXM (400 W): a third of the H100's
// dense bf16 throughput for prefill (10k tokens/s), 0.6 of its memory bandwidth for decode
// (2,000 tokens/s). Orders of magnitude, not a calibration: the older GPU spends about 1.6×
// the energy per prefilled token and 1.4× per output token, which is what the objective
// trades against latency.
var energyPresets = map[string]workerEnergy{
	"h100": {Prefill: 25e-3, Decode: 150e-3},
	"a100": {Prefill: 40e-3, Decode: 210e-3},
}

// parseEnergy parses -energy: a comma list of one entry per worker, in order, or one entry for
// all; an entry is a preset (h100, a100), PREFILL/DECODE or one energy for both, each with a
// unit (J, mJ, uJ). Empty: no annotation.
func parseEnergy(s string, workers int) ([]workerEnergy, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) != 1 && len(parts) != workers {
		return nil, fmt.Errorf("-energy: %d entries for %d workers (want one per worker, or one for all)", len(parts), workers)
	}
	out := make([]workerEnergy, 0, workers)
	for _, p := range parts {
		e, err := parseWorkerEnergy(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("-energy: %w", err)
		}
		out = append(out, e)
	}
	for len(out) < workers {
		out = append(out, out[0])
	}
	return out, nil
}

func parseWorkerEnergy(s string) (workerEnergy, error) {
	if e, ok := energyPresets[strings.ToLower(s)]; ok {
		return e, nil
	}
	if s == "" {
		return workerEnergy{}, errors.New("empty entry (want h100, a100, PREFILL/DECODE such as 25mJ/150mJ, or one energy for both)")
	}
	pre, dec, split := strings.Cut(s, "/")
	p, err := energy.ParseJoules(pre)
	if err != nil {
		return workerEnergy{}, err
	}
	d := p
	if split {
		if d, err = energy.ParseJoules(dec); err != nil {
			return workerEnergy{}, err
		}
	}
	return workerEnergy{Prefill: p, Decode: d}, nil
}

// upstreamLines annotates every worker of kv_cache_aware, one upstream block each: its prefix
// cache size in tokens (tokens > 0), as an operator would from the "GPU KV cache size: N
// tokens" line vLLM logs at start, so that the policy bounds what its tree believes each
// upstream holds (1.5 × kv_capacity × 4 chars) and a prefix the worker has long evicted stops
// attracting requests; and its energy per token (en, in the workers' order; nil: none).
func upstreamLines(addrs []string, tokens int, en []workerEnergy) []string {
	lines := make([]string, 0, len(addrs))
	for i, a := range addrs {
		var b strings.Builder
		if tokens > 0 {
			fmt.Fprintf(&b, "\t\t\t\tkv_capacity %d\n", tokens)
		}
		if i < len(en) {
			fmt.Fprintf(&b, "\t\t\t\tprefill_energy_per_token %s\n\t\t\t\tenergy_per_token %s\n", joulesArg(en[i].Prefill), joulesArg(en[i].Decode))
		}
		if b.Len() > 0 {
			lines = append(lines, fmt.Sprintf("upstream %s {\n%s\t\t\t}", a, b.String()))
		}
	}
	return lines
}

// joulesArg writes j as the Caddyfile takes it: in µJ with the ASCII unit, exact for
// what -energy parses (energy.Joules.String would print the micro sign).
func joulesArg(j energy.Joules) string {
	return strings.Replace(j.String(), "\u00b5J", "uJ", 1)
}

// joulesPerRequest is what the run's successful requests cost in energy, each charged at the
// worker that served it (the worker header): its uncached prompt tokens at that worker's
// prefill energy plus its output tokens at its decode energy, as the worker reported them.
// Requests no worker claimed are charged at the fleet's mean; unattributed counts them.
func joulesPerRequest(recs []replay.Record, addrs []string, en []workerEnergy) (perRequest float64, unattributed int) {
	index := make(map[string]int, len(addrs))
	for i, a := range addrs {
		index[a] = i
	}
	var mean workerEnergy
	for _, e := range en {
		mean.Prefill += e.Prefill / energy.Joules(len(en))
		mean.Decode += e.Decode / energy.Joules(len(en))
	}
	var total float64
	n := 0
	for _, r := range recs {
		if r.Error != "" {
			continue
		}
		e := mean
		if i, ok := index[r.Worker]; ok && i < len(en) {
			e = en[i]
		} else {
			unattributed++
		}
		uncached := max(0, r.PromptTokens-r.CachedTokens)
		total += float64(uncached)*float64(e.Prefill) + float64(r.CompletionTokens)*float64(e.Decode)
		n++
	}
	if n == 0 {
		return 0, unattributed
	}
	return total / float64(n), unattributed
}
