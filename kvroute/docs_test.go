package kvroute

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// Every ```caddyfile block of the README and docs/ is a whole Caddyfile that adapts, and so is
// every example Caddyfile: the docs cannot drift from the code. Fragments that are not a whole
// Caddyfile take another fence.
func TestDocsCaddyfilesAdapt(t *testing.T) {
	docs, _ := filepath.Glob("../docs/*.md")
	docs = append(docs, "../README.md", "../examples/README.md")
	blocks := 0
	for _, doc := range docs {
		for _, b := range caddyfileBlocks(t, doc) {
			blocks++
			adapt(t, b.where, b.text)
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
		adapt(t, f, string(text))
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

func adapt(t *testing.T, where, text string) {
	t.Helper()
	ad := caddyconfig.GetAdapter("caddyfile")
	if ad == nil {
		t.Fatal("no caddyfile adapter registered")
	}
	_, warnings, err := ad.Adapt([]byte(text), map[string]any{"filename": where})
	if err != nil {
		t.Errorf("%s: caddy adapt: %v", where, err)
	}
	for _, w := range warnings {
		if w.Message != "" && !strings.Contains(w.Message, "formatted") {
			t.Logf("%s: %s", where, w.Message)
		}
	}
}
