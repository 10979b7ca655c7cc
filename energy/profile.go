package energy

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"unicode/utf8"
)

// Accelerator is the kind of hardware an upstream runs on.
type Accelerator string

// The accelerators a Profile may name.
const (
	GPU              Accelerator = "gpu"
	CPU              Accelerator = "cpu"
	TPU              Accelerator = "tpu"
	NPU              Accelerator = "npu"
	OtherAccelerator Accelerator = "other"
)

// ParseAccelerator returns the accelerator named s. Names are lower case,
// as Caddy's other keywords are.
func ParseAccelerator(s string) (Accelerator, error) {
	switch a := Accelerator(s); a {
	case GPU, CPU, TPU, NPU, OtherAccelerator:
		return a, nil
	}
	return "", fmt.Errorf("unknown accelerator %q (want gpu, cpu, tpu, npu or other)", s)
}

// Profile is what the operator knows about one upstream. Every field is
// optional; a zero value means unknown. Accelerator, Zone,
// ContinuousBatching and PagedKV are descriptive: they are reported, not
// used in placement.
type Profile struct {
	Accelerator Accelerator `json:"accelerator,omitempty"`
	// Models are globs (see MatchModel) of the model names the upstream serves;
	// empty means any model.
	Models []string `json:"models,omitempty"`
	// MaxConcurrency is how many requests the upstream takes at once.
	MaxConcurrency int `json:"max_concurrency,omitempty"`
	// EnergyPerToken is the energy of generating one token.
	EnergyPerToken Joules `json:"energy_per_token,omitempty"`
	// PrefillEnergyPerToken is the energy of prefilling one prompt token;
	// zero means the same as EnergyPerToken.
	PrefillEnergyPerToken Joules `json:"prefill_energy_per_token,omitempty"`
	// CarbonIntensity is the grid's carbon intensity in gCO2e/kWh.
	CarbonIntensity float64 `json:"carbon_intensity,omitempty"`
	// Zone names the grid zone or site, e.g. "EU-FR".
	Zone string `json:"zone,omitempty"`
	// KVCapacity is how many tokens the upstream's KV cache holds.
	KVCapacity int64 `json:"kv_capacity,omitempty"`
	// PrefillTokensPerSecond is the upstream's prefill speed (uncached prompt tokens per
	// second) until kvroute learns it from the engine's own totals.
	PrefillTokensPerSecond float64 `json:"prefill_tokens_per_second,omitempty"`
	// MetricsURL is where the upstream's engine serves its Prometheus metrics (http or
	// https), when it is not the upstream's own address with the configured path (an engine
	// behind a sidecar, a Unix socket).
	MetricsURL         string `json:"metrics_url,omitempty"`
	ContinuousBatching bool   `json:"continuous_batching,omitempty"`
	PagedKV            bool   `json:"paged_kv,omitempty"`
}

// Validate reports the first invalid field, named as in JSON. A nil
// profile is valid: nothing is known.
func (p *Profile) Validate() error {
	if p == nil {
		return nil
	}
	if p.Accelerator != "" {
		if _, err := ParseAccelerator(string(p.Accelerator)); err != nil {
			return fmt.Errorf("accelerator: %w", err)
		}
	}
	for i, m := range p.Models {
		if err := ValidateModelPattern(m); err != nil {
			return fmt.Errorf("models[%d]: %w", i, err)
		}
	}
	if p.MaxConcurrency < 0 {
		return fmt.Errorf("max_concurrency: must be >= 1, got %d", p.MaxConcurrency)
	}
	if err := validateJoules(p.EnergyPerToken); err != nil {
		return fmt.Errorf("energy_per_token: %w", err)
	}
	if err := validateJoules(p.PrefillEnergyPerToken); err != nil {
		return fmt.Errorf("prefill_energy_per_token: %w", err)
	}
	if ci := p.CarbonIntensity; ci < 0 || math.IsNaN(ci) || math.IsInf(ci, 0) {
		return fmt.Errorf("carbon_intensity: must be a finite number of gCO2e/kWh >= 0, got %v", ci)
	}
	if v := p.PrefillTokensPerSecond; v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("prefill_tokens_per_second: must be a finite number of tokens per second > 0, got %v", v)
	}
	if p.KVCapacity < 0 {
		return fmt.Errorf("kv_capacity: must be >= 1 token, got %d", p.KVCapacity)
	}
	if p.MetricsURL != "" {
		if err := ValidateMetricsURL(p.MetricsURL); err != nil {
			return fmt.Errorf("metrics_url: %w", err)
		}
	}
	return nil
}

// ValidateMetricsURL accepts an absolute http or https URL with a host: a metrics endpoint
// the router can read.
func ValidateMetricsURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("bad URL %q: %v", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("bad URL %q: want http:// or https:// and a host", s)
	}
	return nil
}

func validateJoules(j Joules) error {
	if v := float64(j); v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("must be a finite energy > 0, got %v", j)
	}
	return nil
}

// Serves reports whether the upstream serves model. An upstream without
// a model list serves every model, and a request without a model may go
// to any upstream.
func (p *Profile) Serves(model string) bool {
	if p == nil || len(p.Models) == 0 || model == "" {
		return true
	}
	return MatchModel(p.Models, model)
}

// PrefillEnergy is the energy of prefilling one prompt token:
// PrefillEnergyPerToken when known, else EnergyPerToken (0 when neither is).
func (p *Profile) PrefillEnergy() Joules {
	if p == nil {
		return 0
	}
	if known(float64(p.PrefillEnergyPerToken)) {
		return p.PrefillEnergyPerToken
	}
	if known(float64(p.EnergyPerToken)) {
		return p.EnergyPerToken
	}
	return 0
}

// SavedJoules estimates the energy a prefix cache hit saved: the prefill
// tokens it avoided times the upstream's prefill energy per token. It is 0
// when the energy is unknown.
func SavedJoules(p *Profile, prefillTokensAvoided int64) Joules {
	if prefillTokensAvoided <= 0 {
		return 0
	}
	return p.PrefillEnergy() * Joules(prefillTokensAvoided)
}

// MatchModel reports whether model matches one of the glob patterns. In a pattern, '*'
// matches any run of characters ('/' included: model names are not paths, so "*llama*"
// matches "meta-llama/Llama-3.1-8B"), '?' matches one character, and every other character
// matches itself.
func MatchModel(patterns []string, model string) bool {
	for _, pat := range patterns {
		if globMatch(pat, model) {
			return true
		}
	}
	return false
}

// ValidateModelPattern reports whether pattern is a usable model glob.
func ValidateModelPattern(pattern string) error {
	if pattern == "" {
		return errors.New("empty model pattern")
	}
	if !utf8.ValidString(pattern) {
		return fmt.Errorf("bad model pattern %q: not valid UTF-8", pattern)
	}
	return nil
}

// globMatch matches s against pat ('*' any run, '?' one rune) in time O(len(pat)×len(s)) at
// worst, without recursion: on a mismatch it backtracks to the last '*' only.
func globMatch(pat, s string) bool {
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		if p < len(pat) {
			switch c := pat[p]; {
			case c == '*':
				star, mark = p, i
				p++
				continue
			case c == '?':
				_, n := utf8.DecodeRuneInString(s[i:])
				p, i = p+1, i+n
				continue
			case c == s[i]:
				p, i = p+1, i+1
				continue
			}
		}
		if star < 0 {
			return false
		}
		_, n := utf8.DecodeRuneInString(s[mark:])
		mark += n
		p, i = star+1, mark
	}
	for p < len(pat) && pat[p] == '*' {
		p++
	}
	return p == len(pat)
}

// known reports whether an optional quantity was given: positive and
// finite. Zero is the "unknown" of every Profile field.
func known(v float64) bool { return v > 0 && !math.IsInf(v, 1) }
