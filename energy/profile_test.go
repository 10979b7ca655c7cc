package energy

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
)

func mustJoules(t testing.TB, s string) Joules {
	t.Helper()
	j, err := ParseJoules(s)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func TestParseAccelerator(t *testing.T) {
	for _, s := range []string{"gpu", "cpu", "tpu", "npu", "other"} {
		if a, err := ParseAccelerator(s); err != nil || string(a) != s {
			t.Errorf("ParseAccelerator(%q) = %q, %v", s, a, err)
		}
	}
	for _, s := range []string{"", "GPU", "fpga", " gpu"} {
		if _, err := ParseAccelerator(s); err == nil {
			t.Errorf("ParseAccelerator(%q) succeeded, want error", s)
		}
	}
}

func TestProfileJSONRoundTrip(t *testing.T) {
	p := Profile{
		Accelerator:           GPU,
		Models:                []string{"llama-3.1-8b", "qwen*"},
		MaxConcurrency:        64,
		EnergyPerToken:        mustJoules(t, "150uJ"),
		PrefillEnergyPerToken: mustJoules(t, "20uJ"),
		CarbonIntensity:       56,
		Zone:                  "EU-FR",
		KVCapacity:            2_000_000,
		ContinuousBatching:    true,
		PagedKV:               true,
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"accelerator":"gpu","models":["llama-3.1-8b","qwen*"],"max_concurrency":64,` +
		`"energy_per_token":"150uJ","prefill_energy_per_token":"20uJ","carbon_intensity":56,` +
		`"zone":"EU-FR","kv_capacity":2000000,"continuous_batching":true,"paged_kv":true}`
	if string(b) != want {
		t.Errorf("Marshal =\n%s\nwant\n%s", b, want)
	}
	var back Profile
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, p) {
		t.Errorf("round trip = %+v, want %+v", back, p)
	}

	// Unknown fields are left out entirely.
	if b, _ := json.Marshal(Profile{}); string(b) != "{}" {
		t.Errorf("Marshal(Profile{}) = %s, want {}", b)
	}
	// A bare number is joules.
	var q Profile
	if err := json.Unmarshal([]byte(`{"energy_per_token":0.00015}`), &q); err != nil || q.EnergyPerToken != mustJoules(t, "150uJ") {
		t.Errorf("bare number: %v, %v", q.EnergyPerToken, err)
	}
}

func TestProfileValidate(t *testing.T) {
	tests := []struct {
		name    string
		p       Profile
		wantErr string
	}{
		{name: "empty", p: Profile{}},
		{name: "full", p: Profile{Accelerator: TPU, Models: []string{"a/*", "b?"}, MaxConcurrency: 1, EnergyPerToken: 1e-4, CarbonIntensity: 0.5, KVCapacity: 1}},
		{name: "accelerator", p: Profile{Accelerator: "fpga"}, wantErr: `accelerator: unknown accelerator "fpga"`},
		{name: "empty glob", p: Profile{Models: []string{"a", ""}}, wantErr: "models[1]: empty model pattern"},
		{name: "empty glob", p: Profile{Models: []string{""}}, wantErr: `models[0]: empty model pattern`},
		{name: "max_concurrency", p: Profile{MaxConcurrency: -1}, wantErr: "max_concurrency: must be >= 1"},
		{name: "energy negative", p: Profile{EnergyPerToken: -1e-6}, wantErr: "energy_per_token: must be"},
		{name: "energy NaN", p: Profile{EnergyPerToken: Joules(math.NaN())}, wantErr: "energy_per_token: must be"},
		{name: "prefill Inf", p: Profile{PrefillEnergyPerToken: Joules(math.Inf(1))}, wantErr: "prefill_energy_per_token: must be"},
		{name: "carbon negative", p: Profile{CarbonIntensity: -3}, wantErr: "carbon_intensity: must be"},
		{name: "carbon NaN", p: Profile{CarbonIntensity: math.NaN()}, wantErr: "carbon_intensity: must be"},
		{name: "kv_capacity", p: Profile{KVCapacity: -5}, wantErr: "kv_capacity: must be >= 1"},
		{name: "prefill_tokens_per_second", p: Profile{PrefillTokensPerSecond: -1}, wantErr: "prefill_tokens_per_second: must be"},
	}
	for _, tt := range tests {
		err := tt.p.Validate()
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("%s: Validate() = %v, want nil", tt.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: Validate() = %v, want error containing %q", tt.name, err, tt.wantErr)
		}
	}
	if err := (*Profile)(nil).Validate(); err != nil {
		t.Errorf("nil profile: %v", err)
	}
}

func TestProfileServes(t *testing.T) {
	p := &Profile{Models: []string{"llama-3.1-8b", "qwen*", "meta-llama/*", "mistral-?b"}}
	tests := []struct {
		model string
		want  bool
	}{
		{"llama-3.1-8b", true},
		{"llama-3.1-70b", false},
		{"qwen2.5-7b", true},
		{"qwen", true},
		{"Qwen2.5-7b", false}, // globs are case-sensitive, like model ids
		{"meta-llama/Llama-3.1-8B", true},
		{"meta-llama/x/y", true}, // '*' crosses '/': model names are not paths
		{"org/qwen-7b", false},
		{"mistral-7b", true},
		{"mistral-22b", false},
		{"", true}, // a request without a model may go anywhere
	}
	for _, tt := range tests {
		if got := p.Serves(tt.model); got != tt.want {
			t.Errorf("Serves(%q) = %v, want %v", tt.model, got, tt.want)
		}
	}
	q := &Profile{Models: []string{"*llama*", "a*b*c", "*"}}
	for _, m := range []string{"meta-llama/Llama-3.1-8B", "axxbyyc", "anything"} {
		if !q.Serves(m) {
			t.Errorf("%v should serve %q", q.Models, m)
		}
	}
	if (&Profile{Models: []string{"a*b*c"}}).Serves("axxbyy") {
		t.Errorf("a*b*c served axxbyy")
	}
	if !(*Profile)(nil).Serves("x") || !(&Profile{}).Serves("x") {
		t.Error("a profile without models must serve every model")
	}
}

func TestPrefillEnergyAndSavedJoules(t *testing.T) {
	decode, prefill := mustJoules(t, "150uJ"), mustJoules(t, "20uJ")
	both := &Profile{EnergyPerToken: decode, PrefillEnergyPerToken: prefill}
	onlyDecode := &Profile{EnergyPerToken: decode}
	tests := []struct {
		p      *Profile
		tokens int64
		want   Joules
	}{
		{both, 1000, prefill * 1000},
		{onlyDecode, 1000, decode * 1000},
		{&Profile{}, 1000, 0},
		{nil, 1000, 0},
		{both, 0, 0},
		{both, -5, 0},
	}
	for i, tt := range tests {
		if got := SavedJoules(tt.p, tt.tokens); got != tt.want {
			t.Errorf("%d: SavedJoules = %v, want %v", i, got, tt.want)
		}
	}
	if got := onlyDecode.PrefillEnergy(); got != decode {
		t.Errorf("PrefillEnergy without prefill = %v, want %v", got, decode)
	}
}
