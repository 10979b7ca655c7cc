package energy

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestParseJoules(t *testing.T) {
	tests := []struct {
		in      string
		want    float64
		wantErr string // substring of the error; "" means no error
	}{
		{in: "150uJ", want: 150e-6},
		{in: "150\u00b5J", want: 150e-6}, // micro sign
		{in: "150\u03bcJ", want: 150e-6}, // Greek mu
		{in: "0.5mJ", want: 0.5e-3},
		{in: "2J", want: 2},
		{in: "10nJ", want: 10e-9},
		{in: " 20 uJ ", want: 20e-6},
		{in: "1.5e2uJ", want: 150e-6},
		{in: "1E-3J", want: 1e-3},
		{in: ".5J", want: 0.5},
		{in: "0.1uJ", want: 1e-7},
		{in: "150", wantErr: "missing unit"},
		{in: "1e5", wantErr: "missing unit"},
		{in: "", wantErr: "empty"},
		{in: "   ", wantErr: "empty"},
		{in: "uJ", wantErr: "missing number"},
		{in: "0uJ", wantErr: "greater than zero"},
		{in: "0J", wantErr: "greater than zero"},
		{in: "-150uJ", wantErr: "greater than zero"},
		{in: "1e-400J", wantErr: "greater than zero"},
		{in: "1e400J", wantErr: "out of range"},
		{in: "NaNJ", wantErr: "missing number"},
		{in: "NaN", wantErr: "missing number"},
		{in: "InfJ", wantErr: "missing number"},
		{in: "+Inf uJ", wantErr: "missing number"},
		{in: "0x1p-2J", wantErr: "not a decimal number"},
		{in: "150MJ", wantErr: `unknown unit "MJ"`},
		{in: "150uj", wantErr: `unknown unit "uj"`},
		{in: "150kJ", wantErr: `unknown unit "kJ"`},
		{in: "150 u J", wantErr: "unknown unit"},
		{in: "1 5uJ", wantErr: "not a decimal number"},
		{in: "1.2.3uJ", wantErr: "not a decimal number"},
		{in: "1e2e3J", wantErr: "not a decimal number"},
		{in: "e5J", wantErr: "not a decimal number"},
		{in: "1e9999999J", wantErr: "out of range"},
		{in: strings.Repeat("1", 100) + "uJ", wantErr: "longer than"},
	}
	for _, tt := range tests {
		got, err := ParseJoules(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseJoules(%q) = %v, %v; want error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || float64(got) != tt.want {
			t.Errorf("ParseJoules(%q) = %v (%g), %v; want %g", tt.in, got, float64(got), err, tt.want)
		}
	}
}

func TestJoulesString(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{"150uJ", "150µJ"},
		{"0.15mJ", "150µJ"},
		{"0.5mJ", "500µJ"},
		{"2.5mJ", "2.5mJ"},
		{"3J", "3J"},
		{"1500J", "1500J"},
		{"10nJ", "10nJ"},
		{"0.001nJ", "0.001nJ"},
		{"1e30J", "1e30J"},
		{"0.1uJ", "100nJ"},
		{"123.456789012345678uJ", "123.456789012346µJ"},
	}
	for _, tt := range tests {
		j, err := ParseJoules(tt.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := j.String(); got != tt.want {
			t.Errorf("ParseJoules(%q).String() = %q, want %q", tt.in, got, tt.want)
		}
	}
	for j, want := range map[Joules]string{0: "0J", -150e-6: "-150µJ"} {
		if got := j.String(); got != want {
			t.Errorf("Joules(%g).String() = %q, want %q", float64(j), got, want)
		}
	}
}

func TestJoulesJSON(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want float64
	}{
		{`"150uJ"`, 150e-6},
		{`"150µJ"`, 150e-6},
		{`"150\u03bcJ"`, 150e-6},
		{`"0.5mJ"`, 0.5e-3},
		{`0.00015`, 150e-6},
		{`2`, 2},
		{`0`, 0},
		{` 1e-6 `, 1e-6},
	} {
		var j Joules
		if err := json.Unmarshal([]byte(tt.in), &j); err != nil || float64(j) != tt.want {
			t.Errorf("Unmarshal(%s) = %g, %v; want %g", tt.in, float64(j), err, tt.want)
		}
	}
	for _, in := range []string{`"150"`, `"0uJ"`, `-1`, `true`, `"abc"`, `{}`} {
		var j Joules
		if err := json.Unmarshal([]byte(in), &j); err == nil {
			t.Errorf("Unmarshal(%s) = %v, want error", in, j)
		}
	}
	j := Joules(7)
	if err := json.Unmarshal([]byte(`null`), &j); err != nil || j != 7 {
		t.Errorf("Unmarshal(null) = %v, %v; want the value unchanged", j, err)
	}

	b, err := json.Marshal(Joules(150e-6))
	if err != nil || string(b) != `"150uJ"` {
		t.Errorf("Marshal(150µJ) = %s, %v; want \"150uJ\"", b, err)
	}
	for _, bad := range []float64{math.NaN(), math.Inf(1)} {
		if _, err := json.Marshal(Joules(bad)); err == nil {
			t.Errorf("Marshal(%v) succeeded, want error", bad)
		}
	}
}

// TestJoulesRoundTrip checks that MarshalJSON prints exactly the value it
// was given, and String nearly, for awkward floats too.
func TestJoulesRoundTrip(t *testing.T) {
	for _, v := range []float64{150e-6, 1.0 / 3, 0.1 + 0.2, 123.456e-9, 9.999999e-4, 1e-15, 5e300, math.SmallestNonzeroFloat64, math.MaxFloat64} {
		j := Joules(v)
		if err := stringRoundTrips(j); err != nil {
			t.Error(err)
		}
		b, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		var jj Joules
		if err := json.Unmarshal(b, &jj); err != nil || jj != j {
			t.Errorf("JSON round trip of %g via %s = %g, %v", v, b, float64(jj), err)
		}
	}
}

// stringRoundTrips checks that j.String() parses back to j up to its 15
// significant digits. Near the largest float, rounding to 15 digits
// overflows; no energy is that large.
func stringRoundTrips(j Joules) error {
	if j > 1e307 {
		return nil
	}
	back, err := ParseJoules(j.String())
	if err != nil {
		return fmt.Errorf("String of %g = %q: %v", float64(j), j.String(), err)
	}
	if d := math.Abs(float64(back-j)) / float64(j); d > 1e-14 {
		return fmt.Errorf("String of %g = %q parses to %g", float64(j), j.String(), float64(back))
	}
	return nil
}

func FuzzParseJoules(f *testing.F) {
	for _, s := range []string{"150uJ", "150µJ", "150μJ", "0.5mJ", "2J", "10nJ", "1e-3 J", "-1uJ", "NaNJ", "0x1p2J", "1e400J", "", "J"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		j, err := ParseJoules(s)
		if err != nil {
			return
		}
		if v := float64(j); !(v > 0) || math.IsInf(v, 0) {
			t.Fatalf("ParseJoules(%q) = %g: accepted a value that is not positive and finite", s, v)
		}
		if err := stringRoundTrips(j); err != nil {
			t.Fatalf("ParseJoules(%q): %v", s, err)
		}
		b, err := json.Marshal(j)
		if err != nil {
			t.Fatalf("Marshal(%g): %v", float64(j), err)
		}
		var jj Joules
		if err := json.Unmarshal(b, &jj); err != nil || jj != j {
			t.Fatalf("JSON round trip of %g via %s = %g, %v", float64(j), b, float64(jj), err)
		}
	})
}
