package kvroute

import (
	"bufio"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// The README's JSON example is its Caddyfile ("Every option, with its default") in JSON: each
// field of the example's selection_policy has the value the Caddyfile adapts to, durations as
// durations, so that neither form shows a default the other contradicts.
func TestReadmeJSONMatchesCaddyfile(t *testing.T) {
	text := readmeBlock(t, "### Caddyfile", "caddyfile")
	for _, name := range documentedEnv.FindAllStringSubmatch(text, -1) {
		for _, v := range strings.Split(name[1], ",") {
			t.Setenv(strings.TrimSpace(v), "documented-value-0123456789abcdef")
		}
	}
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(text), nil)
	if err != nil {
		t.Fatalf("README's Caddyfile: %v", err)
	}
	adapted := findPolicy(decodeAny(t, out))
	if adapted == nil {
		t.Fatal("README's Caddyfile: no kv_cache_aware selection_policy in the adapted JSON")
	}
	doc := findPolicy(decodeAny(t, []byte(readmeBlock(t, "### JSON", "json"))))
	if doc == nil {
		t.Fatal("README: no kv_cache_aware selection_policy in the JSON example")
	}
	for k, want := range doc {
		got, ok := adapted[k]
		if !ok {
			t.Errorf("README JSON: %q is not in what the Caddyfile adapts to", k)
			continue
		}
		if !sameJSON(want, got) {
			w, _ := json.Marshal(want)
			g, _ := json.Marshal(got)
			t.Errorf("README JSON: %q is %s, the Caddyfile adapts to %s", k, w, g)
		}
	}
}

// readmeBlock is the README's first ```lang block after the heading line.
func readmeBlock(t *testing.T, heading, lang string) string {
	t.Helper()
	f, err := os.Open("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b strings.Builder
	section, in := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == heading:
			section = true
		case section && !in && strings.TrimSpace(line) == "```"+lang:
			in = true
		case in && strings.TrimSpace(line) == "```":
			return b.String()
		case in:
			b.WriteString(line + "\n")
		}
	}
	t.Fatalf("README: no ```%s block after %s", lang, heading)
	return ""
}

func decodeAny(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%v in %.200s", err, b)
	}
	return v
}

// findPolicy returns the first object with "policy": "kv_cache_aware" in v.
func findPolicy(v any) map[string]any {
	switch x := v.(type) {
	case map[string]any:
		if x["policy"] == "kv_cache_aware" {
			return x
		}
		for _, e := range x {
			if m := findPolicy(e); m != nil {
				return m
			}
		}
	case []any:
		for _, e := range x {
			if m := findPolicy(e); m != nil {
				return m
			}
		}
	}
	return nil
}

// sameJSON compares two decoded JSON values, a duration string equal to a number of
// nanoseconds.
func sameJSON(a, b any) bool {
	if as, ok := a.(string); ok {
		if bn, ok := b.(float64); ok {
			d, err := caddy.ParseDuration(as)
			return err == nil && float64(d) == bn
		}
	}
	if bs, ok := b.(string); ok {
		if an, ok := a.(float64); ok {
			d, err := caddy.ParseDuration(bs)
			return err == nil && float64(d) == an
		}
	}
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k := range x {
			if !sameJSON(x[k], y[k]) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameJSON(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}
