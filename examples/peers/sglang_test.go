package peers

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/kvroute/caddy-kvroute/examples/peerrules"
)

func newSGLang(t *testing.T, configure func(p *SGLangCacheAware)) *SGLangCacheAware {
	t.Helper()
	p := new(SGLangCacheAware)
	if configure != nil {
		configure(p)
	}
	if err := p.setup(); err != nil {
		t.Fatal(err)
	}
	return p
}

const (
	systemA = "You are a pirate. Answer every question in pirate speak, with nautical metaphors."
	systemB = "You are a lawyer. Answer every question with a disclaimer and cite the statute."
)

// Above cache_threshold the request follows the tenant holding its prefix, even when that
// upstream is busier than the others.
func TestSGLangFollowsMatchedTenant(t *testing.T) {
	p := newSGLang(t, nil)
	pool := testPool(3)

	if got := hold(t, p, pool, completion("m", systemA+" Q1")); got != "a:1" {
		t.Fatalf("cold request went to %s, want a:1 (least loaded, first on ties)", got)
	}
	if got := hold(t, p, pool, completion("m", systemB+" Q1")); got != "b:1" {
		t.Fatalf("second cold request went to %s, want b:1 (least loaded)", got)
	}
	// a and b have one request in flight, c none: the prefix still wins.
	if got := hold(t, p, pool, completion("m", systemA+" Q2, a longer follow-up")); got != "a:1" {
		t.Errorf("request sharing systemA's prefix went to %s, want a:1", got)
	}
	if got := hold(t, p, pool, completion("m", systemB+" Q2")); got != "b:1" {
		t.Errorf("request sharing systemB's prefix went to %s, want b:1", got)
	}
	// At or below the threshold: the least loaded, c.
	if got := hold(t, p, pool, completion("m", "Translate to French: cat")); got != "c:1" {
		t.Errorf("cold request went to %s, want c:1", got)
	}
}

// SGLang breaks load ties by pool order: on an idle fleet, cold prompts all land on the first
// upstream. This is the reference's behaviour, kept on purpose, and what kvroute avoids.
func TestSGLangFirstIndexOnTies(t *testing.T) {
	p := newSGLang(t, nil)
	pool := testPool(4)
	for _, prompt := range []string{systemA, systemB, "Write a haiku about Go.", "What is 2+2?"} {
		if got := route(t, p, p.load, pool, completion("m", prompt)); got != "a:1" {
			t.Errorf("cold prompt %.20q on an idle fleet went to %s, want a:1", prompt, got)
		}
	}
	// Without routing text too.
	if got := route(t, p, p.load, pool, `{"model":"m"}`); got != "a:1" {
		t.Errorf("request without text went to %s, want a:1", got)
	}
}

// Imbalance sends the request to the shortest queue regardless of the cache, and the text is
// still recorded under the upstream chosen.
func TestSGLangShortestQueueOnImbalance(t *testing.T) {
	p := newSGLang(t, func(p *SGLangCacheAware) {
		p.BalanceAbsThreshold = ptr(2)
		p.BalanceRelThreshold = ptr(1.5)
	})
	pool := testPool(3)
	body := completion("m", systemA)
	for range 3 {
		if got := hold(t, p, pool, body); got != "a:1" {
			t.Fatalf("balanced request went to %s, want a:1", got)
		}
	}
	// Loads 3, 0, 0: 3-0 > 2 and 3 > 0×1.5.
	if got := hold(t, p, pool, body); got != "b:1" {
		t.Fatalf("imbalanced request went to %s, want b:1 (shortest queue, first on ties)", got)
	}
	if n := p.tree("m", pool).Sizes()["b:1"]; n == 0 {
		t.Error("the text was not recorded under the upstream chosen on imbalance")
	}
	// Loads 3, 1, 0: 3-0 > 2 still.
	if got := hold(t, p, pool, body); got != "c:1" {
		t.Errorf("imbalanced request went to %s, want c:1", got)
	}
}

// The relative threshold alone does not trigger imbalance.
func TestSGLangBothThresholds(t *testing.T) {
	p := newSGLang(t, func(p *SGLangCacheAware) {
		p.BalanceAbsThreshold = ptr(2)
		p.BalanceRelThreshold = ptr(10.0)
	})
	pool := testPool(2)
	if got := hold(t, p, pool, completion("m", systemA)); got != "a:1" {
		t.Fatalf("went to %s, want a:1", got)
	}
	if got := hold(t, p, pool, completion("m", systemB)); got != "b:1" {
		t.Fatalf("went to %s, want b:1", got)
	}
	for range 3 {
		hold(t, p, pool, completion("m", systemA)) // a's load: 2, 3, 4
	}
	// Loads a=4, b=1: 4-1 > 2 but 4 <= 1×10: balanced, the prefix wins.
	if got := hold(t, p, pool, completion("m", systemA)); got != "a:1" {
		t.Errorf("request went to %s, want a:1 (balanced by the relative threshold)", got)
	}
}

// A matched upstream that is unavailable is forgotten and the request goes to the first
// available upstream.
func TestSGLangStaleTenant(t *testing.T) {
	down := map[string]bool{}
	p := newSGLang(t, func(p *SGLangCacheAware) {
		p.available = func(u *reverseproxy.Upstream) bool { return !down[u.Dial] }
	})
	pool := testPool(3)
	body := completion("m", systemA)
	if got := route(t, p, p.load, pool, body); got != "a:1" {
		t.Fatalf("went to %s, want a:1", got)
	}
	down["a:1"] = true
	if got := route(t, p, p.load, pool, body); got != "b:1" {
		t.Errorf("with a down, went to %s, want b:1 (first available)", got)
	}
	if _, ok := p.tree("m", pool).Sizes()["a:1"]; ok {
		t.Error("the unavailable tenant is still in the tree")
	}
}

// Trees are per model: a prefix cached for one model does not attract another model's request.
func TestSGLangPerModelTrees(t *testing.T) {
	p := newSGLang(t, nil)
	pool := testPool(2)
	if got := hold(t, p, pool, completion("llama", systemA)); got != "a:1" {
		t.Fatalf("went to %s, want a:1", got)
	}
	if got := hold(t, p, pool, completion("qwen", systemA)); got != "b:1" {
		t.Errorf("another model's request went to %s, want b:1 (cold tree, least loaded)", got)
	}
	if got := hold(t, p, pool, completion("llama", systemA)); got != "a:1" {
		t.Errorf("same model's request went to %s, want a:1", got)
	}
	// Models beyond the bound share the unknown-model tree.
	for i := range peerrules.MaxTrees + 5 {
		p.tree(strings.Repeat("x", i+1), pool)
	}
	if n := p.rules.Trees(); n > peerrules.MaxTrees+1 {
		t.Errorf("%d trees, want at most %d", n, peerrules.MaxTrees+1)
	}
}

func TestSGLangEvictionLoop(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	p := &SGLangCacheAware{
		EvictionInterval: ptr(caddy.Duration(10 * time.Millisecond)),
		MaxTreeSize:      ptr(100),
	}
	if err := p.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	pool := testPool(1)
	tree := p.tree("m", pool)
	for i := range 50 {
		tree.Insert(strings.Repeat(string(rune('a'+i%26)), 20)+string(rune('A'+i)), "a:1")
	}
	deadline := time.Now().Add(10 * time.Second)
	for tree.Sizes()["a:1"] > 100 {
		if time.Now().After(deadline) {
			t.Fatalf("not evicted: %d chars", tree.Sizes()["a:1"])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSGLangCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // JSON, or the error's beginning
		err  bool
	}{
		{in: `sglang_cache_aware`, want: `{}`},
		{in: `sglang_cache_aware {
			cache_threshold 0.5
			balance_abs_threshold 32
			balance_rel_threshold 1.1
			eviction_interval 30s
			max_tree_size 64Mi
		}`, want: `{"cache_threshold":0.5,"balance_abs_threshold":32,"balance_rel_threshold":1.1,"eviction_interval":30000000000,"max_tree_size":67108864}`},
		{in: `sglang_cache_aware {
			max_tree_size 10000
		}`, want: `{"max_tree_size":10000}`},
		{in: `sglang_cache_aware {
			cache_threshold high
		}`, want: "cache_threshold", err: true},
		{in: `sglang_cache_aware {
			balance_abs_threshold 1.5
		}`, want: "balance_abs_threshold", err: true},
		{in: `sglang_cache_aware {
			eviction_interval soon
		}`, want: "eviction_interval", err: true},
		{in: `sglang_cache_aware {
			max_tree_size lots
		}`, want: "max_tree_size", err: true},
		{in: `sglang_cache_aware {
			cache_threshold
		}`, err: true},
		{in: `sglang_cache_aware {
			colour blue
		}`, want: "unrecognized", err: true},
		{in: `sglang_cache_aware extra`, err: true},
	} {
		p := new(SGLangCacheAware)
		err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if tc.err {
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: error %v, want one naming %q", tc.in, err, tc.want)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if got, _ := json.Marshal(p); string(got) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.in, got, tc.want)
		}
	}
}

func TestSGLangRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		json string
		want string
	}{
		{`{"cache_threshold":1.5}`, "cache_threshold"},
		{`{"cache_threshold":-0.1}`, "cache_threshold"},
		{`{"balance_abs_threshold":-1}`, "balance_abs_threshold"},
		{`{"balance_rel_threshold":-1}`, "balance_rel_threshold"},
		{`{"eviction_interval":"-1s"}`, "eviction_interval"},
		{`{"max_tree_size":-5}`, "max_tree_size"},
	} {
		p := new(SGLangCacheAware)
		if err := json.Unmarshal([]byte(tc.json), p); err != nil {
			t.Fatal(err)
		}
		if err := p.setup(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %s", tc.json, err, tc.want)
		}
	}
	p := newSGLang(t, nil)
	if *p.CacheThreshold != 0.3 || *p.BalanceAbsThreshold != 64 || *p.BalanceRelThreshold != 1.5 ||
		time.Duration(*p.EvictionInterval) != time.Minute || *p.MaxTreeSize != 1<<26 {
		t.Errorf("defaults: %+v", p)
	}
}
