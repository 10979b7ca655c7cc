package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/replay"
)

// Issue 22's measure: kv_cache_aware with and without llm_feedback in the same invocation
// (-compare-feedback), under -side-load or -restart-at, where the tree's model of what each
// engine holds goes stale.

// feedbackSuffix tells the llm_feedback twin apart in the tables.
const feedbackSuffix = " (llm_feedback)"

// withFeedback adds, after each kv_cache_aware policy on one Caddy, the same policy with
// `llm_feedback @llm` in its site (-compare-feedback).
func withFeedback(policies []policy) []policy {
	if slices.ContainsFunc(policies, func(p policy) bool { return p.Feedback }) {
		return policies // the twins are there already
	}
	var out []policy
	for _, p := range policies {
		out = append(out, p)
		if p.Module == "kv_cache_aware" && p.Replicas == 0 {
			fb := p
			fb.Block = slices.Clone(p.Block)
			fb.Feedback = true
			fb.Suffix += feedbackSuffix
			out = append(out, fb)
		}
	}
	return out
}

// feedbackStatus is the part of an upstream's `feedback` block in GET /kvroute/ the demo
// reads; feedbackTotals adds them up over the upstreams.
type feedbackStatus struct {
	Answers    uint64  `json:"answers"`
	WithUsage  uint64  `json:"with_usage"`
	WithCached uint64  `json:"with_cached_tokens"`
	Predicted  float64 `json:"predicted_cached_tokens"`
	Reported   float64 `json:"reported_cached_tokens"`
	GivenUp    float64 `json:"balance_given_up_tokens"`
	Misses     uint64  `json:"tree_misses"`
	Trimmed    int64   `json:"tree_trimmed_chars"`
}

// feedbackTotals sums llm_feedback's figures over every upstream (nil: none watched).
func (st *kvStatus) feedbackTotals() *feedbackStatus {
	var t *feedbackStatus
	for _, u := range st.Upstreams {
		f := u.Feedback
		if f == nil {
			continue
		}
		if t == nil {
			t = &feedbackStatus{}
		}
		t.Answers += f.Answers
		t.WithUsage += f.WithUsage
		t.WithCached += f.WithCached
		t.Predicted += f.Predicted
		t.Reported += f.Reported
		t.GivenUp += f.GivenUp
		t.Misses += f.Misses
		t.Trimmed += f.Trimmed
	}
	return t
}

// honesty is reported over predicted cached tokens (NaN: nothing predicted).
func (f *feedbackStatus) honesty() float64 {
	if f == nil || f.Predicted <= 0 {
		return math.NaN()
	}
	return f.Reported / f.Predicted
}

func (f *feedbackStatus) String() string {
	if f == nil {
		return "llm_feedback: no answer credited"
	}
	return fmt.Sprintf("llm_feedback: %d answers (%d with usage, %d with cached tokens); cached tokens predicted %.0f, reported %.0f (reported/predicted %.3f); tree misses %d, %d chars trimmed; %.0f tokens given up for balance",
		f.Answers, f.WithUsage, f.WithCached, f.Predicted, f.Reported, f.honesty(), f.Misses, f.Trimmed, f.GivenUp)
}

// predictedHit is the hit ratio kv_cache_aware's trees predicted for what they routed (Σ
// predicted cached chars over Σ routed chars, its Prometheus counters): kept with or without
// llm_feedback, so the tree's honesty (predicted over the hit ratio the answers reported to the
// client) compares like with like. Chars over chars against tokens over tokens: the unit
// cancels in each ratio.
func predictedHit(ctx context.Context, admin int) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://localhost:%d/metrics", admin), nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var routed, predicted float64
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 64<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var sum *float64
		switch {
		case strings.HasPrefix(line, "caddy_kvroute_routed_chars_total{"):
			sum = &routed
		case strings.HasPrefix(line, "caddy_kvroute_predicted_cached_chars_total{"):
			sum = &predicted
		default:
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			*sum += v
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if routed <= 0 {
		return 0, fmt.Errorf("no routed chars counted")
	}
	return predicted / routed, nil
}

// feedbackRatios prints, for each kv_cache_aware policy and its llm_feedback twin
// (-compare-feedback), what the twin's tree predicted against what the answers reported, and
// the per-repeat ratios with/without: their median and min-max.
func feedbackRatios(w io.Writer, results []*policyResult, extras map[*replay.Result]*runExtras) {
	for i := 0; i+1 < len(results); i++ {
		off, on := results[i], results[i+1]
		if !strings.HasSuffix(on.Label, feedbackSuffix) || strings.HasSuffix(off.Label, feedbackSuffix) {
			continue
		}
		var pred, rep, hon []float64
		for _, r := range on.Runs {
			if e := extras[r]; e != nil && e.feedback != nil {
				pred = append(pred, e.feedback.Predicted)
				rep = append(rep, e.feedback.Reported)
				if h := e.feedback.honesty(); !math.IsNaN(h) {
					hon = append(hon, h)
				}
			}
		}
		if len(pred) > 0 {
			fmt.Fprintf(w, "\n%s, over %d runs (median, min-max):\n", on.Label, len(pred))
			m, lo, hi := medianSpan(pred)
			fmt.Fprintf(w, "  %-28s %.0f (%.0f-%.0f)\n", "cached tokens predicted", m, lo, hi)
			m, lo, hi = medianSpan(rep)
			fmt.Fprintf(w, "  %-28s %.0f (%.0f-%.0f)\n", "cached tokens reported", m, lo, hi)
			if len(hon) > 0 {
				m, lo, hi = medianSpan(hon)
				fmt.Fprintf(w, "  %-28s %.3f (%.3f-%.3f)\n", "reported / predicted", m, lo, hi)
			}
		}
		for _, pr := range []*policyResult{off, on} {
			var h []float64
			for _, r := range pr.Runs {
				if e := extras[r]; e != nil && e.predictedHit > 0 && r.HitRatio > 0 {
					h = append(h, e.predictedHit/r.HitRatio)
				}
			}
			if len(h) > 0 {
				m, lo, hi := medianSpan(h)
				fmt.Fprintf(w, "%s: the trees' predicted hit ratio over the answers' reported one, %d runs: %.3f (%.3f-%.3f)\n", pr.Label, len(h), m, lo, hi)
			}
		}
		n := min(len(on.Runs), len(off.Runs))
		// The trees' honesty goes after the four figures every comparison prints, before the
		// restart's.
		figs := slices.Insert(pairFigures(on, extras), 4, pairFigure{"predicted/reported hit", func(r *replay.Result) float64 {
			if extras[r].predictedHit <= 0 || r.HitRatio <= 0 {
				return math.NaN()
			}
			return extras[r].predictedHit / r.HitRatio
		}})
		fmt.Fprintf(w, "\nwith / without llm_feedback, same-run ratios over %d repeats (median, min-max):\n", n)
		printPairRatios(w, on.Runs[:n], off.Runs[:n], figs, extras, true)
	}
}
