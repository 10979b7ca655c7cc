package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/caddy-kvroute/examples/replay"
)

func TestTable(t *testing.T) {
	tb := &table{header: []string{"policy", "hit ratio", "errors"}}
	tb.add("kv_cache_aware", "0.562", "0")
	tb.add("header X-Session-ID", "0.2", "12")
	var b bytes.Buffer
	tb.write(&b)
	want := "" +
		"policy               hit ratio  errors\n" +
		"--------------------------------------\n" +
		"kv_cache_aware           0.562       0\n" +
		"header X-Session-ID        0.2      12\n"
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestFormat(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{fmtMs(41.4), "41ms"},
		{fmtMs(1250), "1.25s"},
		{fmtMs(12345), "12.3s"},
		{fmtSpan(span{Mean: 0.5, Min: 0.5, Max: 0.5}, 3), "0.500"},
		{fmtSpan(span{Mean: 0.5, Min: 0.48, Max: 0.52}, 3), "0.500 (0.480-0.520)"},
		{fmtSpan(span{Mean: 1.1, Min: 1.1, Max: 1.104}, 2), "1.10"},
		{fmtPerWorker(summary{PerWorker: []float64{128, 96.4}, Unattributed: 2}), "128/96 +2?"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	addrs := []string{"127.0.0.1:1", "127.0.0.1:2"}
	runs := []*replay.Result{
		{Requests: 10, HitRatio: 0.4, ReferenceHitRatio: 0.5, Imbalance: 1.2, TTFTP99Ms: 100,
			PerWorker: map[string]int{"127.0.0.1:1": 6, "127.0.0.1:2": 4}},
		{Requests: 10, HitRatio: 0.6, ReferenceHitRatio: 0.5, Imbalance: 1.0, TTFTP99Ms: 200, Errors: 1,
			PerWorker: map[string]int{"127.0.0.1:1": 4, "127.0.0.1:2": 5}},
	}
	s := summarize(runs, addrs)
	if s.HitRatio != (span{Mean: 0.5, Min: 0.4, Max: 0.6}) || s.HitOverReference != 1 || s.TTFTP99Ms != 150 ||
		s.PerWorker[0] != 5 || s.PerWorker[1] != 4.5 || s.Errors != 1 || s.Requests != 10 {
		t.Errorf("summary = %+v", s)
	}
}

func TestWithIgnoreEOS(t *testing.T) {
	for in, want := range map[string]string{
		`{"model":"m","max_tokens":3}` + "\n": `{"ignore_eos":true,"model":"m","max_tokens":3}` + "\n",
		`{}`:                                  `{}`,
		`[1]`:                                 `[1]`,
		``:                                    ``,
	} {
		if got := string(withIgnoreEOS([]byte(in))); got != want {
			t.Errorf("withIgnoreEOS(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestReport renders the report from a small result and checks that it is self-contained.
func TestReport(t *testing.T) {
	addrs := []string{"127.0.0.1:1", "127.0.0.1:2"}
	run := &replay.Result{Requests: 10, HitRatio: 0.5, ReferenceHitRatio: 0.45, InfiniteHitRatio: 0.8,
		TTFTP50Ms: 40, TTFTP99Ms: 300, PerWorker: map[string]int{"127.0.0.1:1": 6, "127.0.0.1:2": 4}, Imbalance: 1.2}
	out := &output{
		Params: params{Workers: 2, Fleet: "sim", Workload: "chat", Repeats: 1},
		Addrs:  addrs,
		Policies: []*policyResult{{Policy: "kv_cache_aware", Label: "kv_cache_aware", Runs: []*replay.Result{run},
			Summary: summarize([]*replay.Result{run}, addrs)}},
		Walkthrough: []step{{What: "conversation <A>", Worker: "w0", PromptTokens: 700}},
	}
	path := filepath.Join(t.TempDir(), "report.html")
	if err := writeReport(path, out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	if strings.Count(page, "<svg") != 3 || strings.Contains(page, "<script") || strings.Contains(page, "src=") ||
		!strings.Contains(page, "conversation &lt;A&gt;") {
		t.Errorf("report:\n%s", page)
	}
	if _, err := json.Marshal(out); err != nil {
		t.Errorf("output does not marshal: %v", err)
	}
	if strings.Contains(page, "J/request") {
		t.Error("a report without -energy has a J/request column")
	}

	// With -energy, the joules per request as the table prints them.
	out.Params.Energy = []string{"25mJ/150mJ", "40mJ/210mJ"}
	out.Policies[0].Joules = []float64{44.25, 46.5}
	if err := writeReport(path, out); err != nil {
		t.Fatal(err)
	}
	if b, err = os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	if page := string(b); !strings.Contains(page, "<th>J/request</th>") || !strings.Contains(page, "<td>45.4 (44.2-46.5)</td>") {
		t.Errorf("report with -energy lacks the J/request column:\n%s", page)
	}
}
