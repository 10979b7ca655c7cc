package caddyfile

import (
	"github.com/caddyserver/caddy/v2"

	"strings"
	"testing"
	"time"

	cf "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr string
	}{
		{in: "1000", want: 1000},
		{in: "0", want: 0},
		{in: "2k", want: 2000},
		{in: "2K", want: 2000},
		{in: "2M", want: 2_000_000},
		{in: "64M", want: 64_000_000},
		{in: "64Mi", want: 64 << 20},
		{in: "64mi", want: 64 << 20},
		{in: "4MiB", want: 4 << 20},
		{in: "4MB", want: 4_000_000},
		{in: "4 MiB", want: 4 << 20},
		{in: "1.5k", want: 1500},
		{in: "1,000", want: 1000},
		{in: "8Ei", want: 0, wantErr: "too large"},
		{in: "9223372036854775807", want: 9223372036854775807},
		{in: "9223372036854775808", wantErr: "too large"},
		{in: "99999999999999999999999", wantErr: "too large"},
		{in: "", wantErr: "empty"},
		{in: "-1", wantErr: "must start with a digit"},
		{in: "k", wantErr: "must start with a digit"},
		{in: "1.5", wantErr: "not a whole number"},
		{in: "1.5B", wantErr: "not a whole number"},
		{in: "64Q", wantErr: "want a count"},
		{in: "64 chars", wantErr: "want a count"},
		{in: "1e6", wantErr: "want a count"},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseSize(%q) = %d, %v; want error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"120s", 120 * time.Second, true},
		{"30m", 30 * time.Minute, true},
		{"1h30m", 90 * time.Minute, true},
		{"1d", 24 * time.Hour, true},
		{"1.5d", 36 * time.Hour, true},
		{"1d12h", 36 * time.Hour, true},
		{"-1d", -24 * time.Hour, true},
		{"0", 0, true},
		{"d", 0, false},
		{"+d", 0, false},
		{"1e3d", 0, false},
		{"10", 0, false},
		{"1x", 0, false},
		{"99999999999d", 0, false},
		{strings.Repeat("1", 2000) + "s", 0, false},
	}
	for _, tt := range tests {
		got, err := caddy.ParseDuration(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("caddy.ParseDuration(%q) = %v, %v; want %v (ok=%v)", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

// argCase feeds the text of one option line to an argument helper.
type argCase struct {
	in      string
	want    any
	wantErr string // substring; the error must also carry Testfile:<line> of the option
}

func runArgCases[T comparable](t *testing.T, name string, parse func(*cf.Dispenser) (T, error), cases []argCase) {
	t.Helper()
	for _, tt := range cases {
		d := cf.NewTestDispenser("\n" + tt.in) // the option is on line 2
		d.Next()
		got, err := parse(d)
		if tt.wantErr != "" {
			if err == nil {
				t.Errorf("%s(%q) = %v, want error containing %q", name, tt.in, got, tt.wantErr)
				continue
			}
			option := strings.Fields(tt.in)[0]
			for _, want := range []string{tt.wantErr, option + ":", "Testfile:2"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%s(%q) error %q does not contain %q", name, tt.in, err, want)
				}
			}
			continue
		}
		if err != nil || any(got) != tt.want {
			t.Errorf("%s(%q) = %v, %v; want %v", name, tt.in, got, err, tt.want)
		}
	}
}

func TestArgHelpers(t *testing.T) {
	runArgCases(t, "SizeArg", SizeArg, []argCase{
		{in: "max_tree_size 64Mi", want: int64(64 << 20)},
		{in: "max_body 4MiB", want: int64(4 << 20)},
		{in: "max_tree_size 64Q", wantErr: "invalid size"},
		{in: "max_tree_size", wantErr: "want 1 argument, got 0"},
		{in: "max_tree_size 1 2", wantErr: "want 1 argument, got 2"},
		{in: "max_tree_size 1 {\n\tx\n}", wantErr: "unexpected block"},
		{in: "max_tree_size 1 { }", wantErr: "unexpected block"},
		{in: "max_tree_size {\n}", wantErr: "want 1 argument, got 0"},
	})
	runArgCases(t, "IntArg", IntArg, []argCase{
		{in: "max_sessions 100000", want: 100000},
		{in: "max_sessions -3", want: -3},
		{in: "max_sessions 10k", wantErr: `invalid integer "10k"`},
		{in: "max_sessions 99999999999999999999", wantErr: "out of range"},
		{in: "max_sessions", wantErr: "want 1 argument"},
	})
	runArgCases(t, "FloatArg", FloatArg, []argCase{
		{in: "cache_threshold 0.3", want: 0.3},
		{in: "balance_rel_threshold 1.5", want: 1.5},
		{in: "cache_threshold NaN", wantErr: "invalid number"},
		{in: "cache_threshold +Inf", wantErr: "invalid number"},
		{in: "cache_threshold high", wantErr: "invalid number"},
		{in: "cache_threshold 0.3 0.4", wantErr: "want 1 argument, got 2"},
	})
	runArgCases(t, "DurationArg", DurationArg, []argCase{
		{in: "eviction_interval 120s", want: 120 * time.Second},
		{in: "session_ttl 1d", want: 24 * time.Hour},
		{in: "session_ttl 30", wantErr: `invalid duration "30"`},
		{in: "session_ttl", wantErr: "want 1 argument"},
	})
	runArgCases(t, "StringArg", StringArg, []argCase{
		{in: "session_header X-Session-ID", want: "X-Session-ID"},
		{in: `session_header "X Session"`, want: "X Session"},
		{in: `session_header ""`, wantErr: "empty value"},
		{in: "session_header a b", wantErr: "want 1 argument, got 2"},
	})
	runArgCases(t, "JoulesArg", JoulesArg, []argCase{
		{in: "energy_per_token 150uJ", want: mustJoules(t, "150uJ")},
		{in: "energy_per_token 150µJ", want: mustJoules(t, "150uJ")},
		{in: "energy_per_token 150", wantErr: "missing unit"},
		{in: "energy_per_token 0uJ", wantErr: "greater than zero"},
	})
}

func TestParseSizeErrorMessage(t *testing.T) {
	d := cf.NewTestDispenser("\n\nmax_tree_size 64Q")
	d.Next()
	_, err := SizeArg(d)
	const want = `max_tree_size: invalid size "64Q" (want a count with an optional suffix such as 2k, 64Mi or 4MiB), at Testfile:3`
	if err == nil || err.Error() != want {
		t.Errorf("SizeArg error = %v, want %s", err, want)
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"1000", "2k", "64Mi", "4MiB", "1.5k", "1,000", "-1", "8Ei", "1e6", "١٢"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err == nil && n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
	})
}
