package kvroute

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// Every ```caddyfile block of the README and docs/ is a whole Caddyfile that is formatted as
// `caddy fmt` writes it and passes `caddy validate` (with the environment it documents in an
// "Environment:" comment), and so is every shipped Caddyfile: the docs cannot drift from the
// code, and a user who copies one never sees "Caddyfile input is not formatted". Fragments
// that are not a whole Caddyfile take another fence.
func TestDocsCaddyfilesAdapt(t *testing.T) {
	docs, _ := filepath.Glob("../docs/*.md")
	docs = append(docs, "../README.md", "../examples/README.md")
	blocks := 0
	for _, doc := range docs {
		for _, b := range caddyfileBlocks(t, doc) {
			blocks++
			t.Run(b.where, func(t *testing.T) { adapt(t, b.where, b.text) })
		}
	}
	if blocks < 2 {
		t.Fatalf("found %d caddyfile blocks in %v; the README has at least two", blocks, docs)
	}
	files, _ := filepath.Glob("../examples/*Caddyfile")
	more, _ := filepath.Glob("../examples/*/*Caddyfile")
	for _, f := range append(files, more...) {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(f, func(t *testing.T) { adapt(t, f, string(text)) })
	}
}

type docBlock struct{ where, text string }

func caddyfileBlocks(t *testing.T, path string) []docBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []docBlock
	var cur *strings.Builder
	start := 0
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```caddyfile":
			cur, start = new(strings.Builder), n
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, docBlock{where: path + ":" + strconv.Itoa(start), text: cur.String()})
			cur = nil
		case cur != nil:
			cur.WriteString(line + "\n")
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: unterminated caddyfile block", path, start)
	}
	return out
}

// documentedEnv finds the environment variables a Caddyfile says it needs: comment lines
// "# Environment: NAME[, NAME...]" followed by anything.
var documentedEnv = regexp.MustCompile(`(?m)^\s*#\s*Environment:\s*([A-Z_][A-Z0-9_]*(?:\s*,\s*[A-Z_][A-Z0-9_]*)*)`)

// adapt runs what `caddy fmt`, `caddy adapt` and `caddy validate` do to text. Each file or
// block runs as a subtest of its own, so that the variables one documents are unset again for
// the next: a Caddyfile that needs a variable it does not document fails.
func adapt(t *testing.T, where, text string) {
	t.Helper()
	if formatted := caddyfile.Format([]byte(text)); !bytes.Equal(formatted, []byte(text)) {
		t.Errorf("%s: not formatted as `caddy fmt` writes it (run `caddy fmt --overwrite`); first difference at line %d", where, firstDiffLine(text, string(formatted)))
	}
	ad := caddyconfig.GetAdapter("caddyfile")
	if ad == nil {
		t.Fatal("no caddyfile adapter registered")
	}
	for _, m := range documentedEnv.FindAllStringSubmatch(text, -1) {
		for _, name := range strings.Split(m[1], ",") {
			t.Setenv(strings.TrimSpace(name), "documented-value-0123456789abcdef")
		}
	}
	out, warnings, err := ad.Adapt([]byte(text), map[string]any{"filename": where})
	if err != nil {
		t.Errorf("%s: caddy adapt: %v", where, err)
		return
	}
	for _, w := range warnings {
		if w.Message != "" {
			t.Errorf("%s:%d: caddy adapt warns: %s", where, w.Line, w.Message)
		}
	}
	var cfg caddy.Config
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatalf("%s: adapted JSON: %v", where, err)
	}
	if err := caddy.Validate(&cfg); err != nil {
		t.Errorf("%s: caddy validate: %v", where, err)
	}
}

func firstDiffLine(a, b string) int {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}

// The code and the docs cite what a clone holds (docs/...), never the project's design notes
// nor other files beside the repository (its shared folder), which no clone has (issue 40).
func TestDocsCiteTheRepository(t *testing.T) {
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || (!strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, ".md")) {
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for n, line := range strings.Split(string(text), "\n") {
			if strings.Contains(line, "DESIGN"+".md") || strings.Contains(line, "../"+"shared/") {
				t.Errorf("%s:%d cites a file no clone holds: %s", path, n+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
