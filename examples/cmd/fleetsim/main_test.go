package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/caddy-kvroute/examples/fleetsim"
)

// freshClone runs the command as a new user's clone would: no KVROUTE_WORKLOADS, and a working
// directory with nothing of the project's around it (no workloads directory beside it or
// above it), so that the command finds what it needs in the repository alone.
func freshClone(t *testing.T) {
	t.Helper()
	t.Setenv("KVROUTE_WORKLOADS", "")
	os.Unsetenv("KVROUTE_WORKLOADS") // restored by t.Setenv's cleanup
	t.Chdir(t.TempDir())
}

// card runs the card command with args and returns scorecard.json's scenarios.
func card(t *testing.T, dir string, args ...string) []map[string]any {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(append([]string{"-out", dir}, args...), &stdout, &stderr); code != 0 {
		t.Fatalf("fleetsim %s: exit %d\n%s", strings.Join(args, " "), code, stderr.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "scorecard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Scenarios []map[string]any `json:"scenarios"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c.Scenarios
}

// TestCardFreshClone: the Mooncake scenarios run from a fresh clone (the trace is the
// repository's own), and the card holds their figures.
func TestCardFreshClone(t *testing.T) {
	freshClone(t)
	dir := filepath.Join(t.TempDir(), "card")
	got := map[string]bool{}
	for _, s := range card(t, dir, "-scenarios", "^(chat-50|mooncake-80)$", "-seeds", "1", "-requests", "150") {
		if p, _ := s["policies"].(map[string]any); p["kv_cache_aware"] != nil {
			got[s["name"].(string)] = true
		}
	}
	if !got["chat-50"] || !got["mooncake-80"] {
		t.Fatalf("the card has kv_cache_aware's figures for %v, want chat-50 and mooncake-80", got)
	}
}

// TestCardMissingTraceStopsFirst: a KVROUTE_WORKLOADS without the trace stops the card before
// its first run, naming the file, and writes no card.
func TestCardMissingTraceStopsFirst(t *testing.T) {
	freshClone(t)
	empty := t.TempDir()
	t.Setenv("KVROUTE_WORKLOADS", empty)
	dir := filepath.Join(t.TempDir(), "card")
	var stdout, stderr bytes.Buffer
	code := run([]string{"-out", dir, "-scenarios", "^(chat-50|mooncake-80)$", "-seeds", "1", "-requests", "150", "-parallel", "1"}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), filepath.Join(empty, "mooncake_synthetic_trace.jsonl")) || strings.Contains(stderr.String(), " done") {
		t.Fatalf("exit %d, want 1 with the missing file named before any run:\n%s", code, stderr.String())
	}
	for _, name := range []string{"scorecard.json", "scorecard.partial.json"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			t.Errorf("%s written with no run finished", name)
		}
	}
}

// fullCard is a card of every scenario, short (one seed, 300 requests each), written once by
// the command from a fresh clone's layout for the tests that read one: the JSON shape the
// default card has (the flow scenarios' classes included).
var fullCard = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "fleetsim-card-")
	if err != nil {
		return "", err
	}
	fullCardDir = dir
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-out", dir, "-seeds", "1", "-requests", "300"}, &stdout, &stderr); code != 0 {
		return "", fmt.Errorf("the full card: exit %d\n%s", code, stderr.String())
	}
	return dir, nil
})

// fullCardDir is where fullCard wrote, once a test asked for it.
var fullCardDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if fullCardDir != "" {
		os.RemoveAll(fullCardDir)
	}
	os.Exit(code)
}

// TestCompareFullCard: -compare judges a card of every scenario, the flow scenarios (whose
// figures have classes) included, and prints both the issue-34 targets and the flow targets.
func TestCompareFullCard(t *testing.T) {
	dir, err := fullCard()
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-compare", dir}, &stdout, &stderr); code != 0 {
		t.Fatalf("-compare %s: exit %d\n%s", dir, code, stderr.String())
	}
	n := len(fleetsim.Scenarios())
	for _, want := range []string{fmt.Sprintf("targets (%d scenarios)", n), "tenants_flood", "flow-control targets", "light_ttft_p99"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("-compare's output lacks %q:\n%s", want, stdout.String())
		}
	}
	// A card compared with itself: every ratio of the change is 1.
	stdout.Reset()
	if code := run([]string{"-compare", dir + "," + dir}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "== change") {
		t.Fatalf("-compare BEFORE,AFTER: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}

// TestCardPrinted: the command prints the card as medians over the seeds: by default a legend
// and one line per scenario with where kv_cache_aware stands, a screen's worth for the whole
// card (every run stays in scorecard.json, and -table runs prints them).
func TestCardPrinted(t *testing.T) {
	dir, err := fullCard()
	if err != nil {
		t.Fatal(err)
	}
	show := func(args ...string) string {
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"-show", dir}, args...), &stdout, &stderr); code != 0 {
			t.Fatalf("-show %v: exit %d\n%s", args, code, stderr.String())
		}
		return stdout.String()
	}
	scenarios := len(fleetsim.Scenarios())
	summary := show()
	for _, want := range []string{"Columns (each the median over the scenario's seeds", "imbal ", "qwait_p99 ", "Where kv_cache_aware stands",
		fmt.Sprintf("kv_cache_aware at least as good as the best baseline, of %d scenarios", scenarios), "flow-control targets"} {
		if !strings.Contains(summary, want) {
			t.Errorf("the summary lacks %q:\n%s", want, summary)
		}
	}
	// The legend, a line per scenario, the flow targets: a screen or two, not a line per run.
	if n := strings.Count(summary, "\n"); n > scenarios+60 {
		t.Errorf("the summary is %d lines for %d scenarios:\n%s", n, scenarios, summary)
	}
	medians := show("-table", "medians")
	if n := strings.Count(medians, "\n  kv_cache_aware "); n != scenarios {
		t.Errorf("-table medians: %d kv_cache_aware rows, want one per scenario (%d)", n, scenarios)
	}
	runs := show("-table", "runs")
	if n := len(regexp.MustCompile(`(?m)^\S+ +1 +\d+ kv_cache_aware `).FindAllString(runs, -1)); n != scenarios {
		t.Errorf("-table runs: %d kv_cache_aware rows, want one per run (%d)", n, scenarios)
	}
}
