package peers

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/caddy-kvroute/examples/peerrules"
)

func newPrefixHash(t *testing.T, configure func(p *PrefixHash)) *PrefixHash {
	t.Helper()
	p := new(PrefixHash)
	if configure != nil {
		configure(p)
	}
	if err := p.setup(); err != nil {
		t.Fatal(err)
	}
	return p
}

// Requests whose first prefix_chars chars agree go to the same upstream, whatever follows.
func TestPrefixHashStable(t *testing.T) {
	p := newPrefixHash(t, nil)
	pool := testPool(5)
	prefix := strings.Repeat("You are a careful assistant. ", 40) // > 1000 chars
	want := route(t, p, p.load, pool, completion("m", prefix+"first question"))
	for i := range 20 {
		if got := route(t, p, p.load, pool, completion("m", fmt.Sprintf("%squestion %d", prefix, i))); got != want {
			t.Fatalf("request %d with the same prefix went to %s, want %s", i, got, want)
		}
	}
	// Pool order does not matter: the order is the hash's.
	reversed := reverseproxy.UpstreamPool{pool[4], pool[3], pool[2], pool[1], pool[0]}
	if got := route(t, p, p.load, reversed, completion("m", prefix+"again")); got != want {
		t.Errorf("with the pool reversed: %s, want %s", got, want)
	}
	// A short text hashes whole.
	short := route(t, p, p.load, pool, completion("m", "hi"))
	for range 5 {
		if got := route(t, p, p.load, pool, completion("m", "hi")); got != short {
			t.Fatalf("short prompt moved from %s to %s", short, got)
		}
	}
}

func TestPrefixHashSpreads(t *testing.T) {
	p := newPrefixHash(t, nil)
	pool := testPool(4)
	counts := map[string]int{}
	const n = 400
	for i := range n {
		counts[route(t, p, p.load, pool, completion("m", fmt.Sprintf("tenant %d system prompt", i)))]++
	}
	for _, u := range pool {
		if c := counts[u.Dial]; c < n/4/2 {
			t.Errorf("%s got %d of %d distinct prefixes: %v", u.Dial, c, n, counts)
		}
	}
	// Removing an upstream moves only its own prefixes.
	smaller := pool[:3]
	for i := range n {
		body := completion("m", fmt.Sprintf("tenant %d system prompt", i))
		before := route(t, p, p.load, pool, body)
		after := route(t, p, p.load, smaller, body)
		if before != "d:1" && before != after {
			t.Fatalf("prefix %d moved from %s to %s when d:1 left", i, before, after)
		}
	}
}

// An upstream with more than load_factor × (mean + 1) in flight is passed over for the next
// upstream in the prefix's rendezvous order.
func TestPrefixHashEscapesOverload(t *testing.T) {
	p := newPrefixHash(t, nil)
	pool := testPool(4)
	text := "a hot system prompt that everyone shares"
	order := rendezvous(pool, xxhash.Sum64String(text))
	body := completion("m", text)

	// In flight on the first choice 0 then 1: mean 0 then 0.25, limit 1.25 then 1.5625.
	for i := range 2 {
		if got := hold(t, p, pool, body); got != order[0].Dial {
			t.Fatalf("request %d went to %s, want the first choice %s", i, got, order[0].Dial)
		}
	}
	// 2 in flight > 1.25 × (0.5 + 1) = 1.875: the second choice.
	if got := hold(t, p, pool, body); got != order[1].Dial {
		t.Errorf("overloaded first choice: went to %s, want the second choice %s", got, order[1].Dial)
	}
	// Loads 2, 1, 0, 0: mean 0.75, limit 2.1875: the first choice again.
	if got := hold(t, p, pool, body); got != order[0].Dial {
		t.Errorf("went to %s, want the first choice %s again", got, order[0].Dial)
	}
}

// Unavailable upstreams are skipped; requests without text go to a random available upstream.
func TestPrefixHashAvailability(t *testing.T) {
	down := map[string]bool{}
	p := newPrefixHash(t, func(p *PrefixHash) {
		p.available = func(u *reverseproxy.Upstream) bool { return !down[u.Dial] }
	})
	pool := testPool(3)
	body := completion("m", "some prompt")
	first := route(t, p, p.load, pool, body)
	down[first] = true
	if got := route(t, p, p.load, pool, body); got == first || got == "" {
		t.Errorf("with %s down, went to %q", first, got)
	}
	seen := map[string]bool{}
	for range 200 {
		got := route(t, p, p.load, pool, `{"model":"m","stream":true}`)
		if got == first || got == "" {
			t.Fatalf("request without text went to %q (down: %s)", got, first)
		}
		seen[got] = true
	}
	if len(seen) != 2 {
		t.Errorf("requests without text reached %v, want both available upstreams", seen)
	}
}

func TestPrefixChars(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"hello", 3, "hel"}, {"hello", 5, "hello"}, {"hello", 9, "hello"},
		{"héllo", 2, "hé"}, {"你好嗎", 1, "你"}, {"", 4, ""},
	} {
		if got := peerrules.PrefixChars(tc.s, tc.n); got != tc.want {
			t.Errorf("prefixChars(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}

func TestPrefixHashCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		err  bool
	}{
		{in: `prefix_hash`, want: `{}`},
		{in: "prefix_hash {\n prefix_chars 2048\n load_factor 1.5\n}", want: `{"prefix_chars":2048,"load_factor":1.5}`},
		{in: "prefix_hash {\n prefix_chars 0\n}", want: "prefix_chars", err: true},
		{in: "prefix_hash {\n load_factor -1\n}", want: "load_factor", err: true},
		{in: "prefix_hash {\n load_factor NaN\n}", want: "load_factor", err: true},
		{in: "prefix_hash {\n hash xxh3\n}", want: "unrecognized", err: true},
		{in: "prefix_hash extra", err: true},
	} {
		p := new(PrefixHash)
		err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if tc.err {
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%q: error %v, want one naming %q", tc.in, err, tc.want)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if got, _ := json.Marshal(p); string(got) != tc.want {
			t.Errorf("%q:\n got %s\nwant %s", tc.in, got, tc.want)
		}
	}
	p := newPrefixHash(t, nil)
	if p.PrefixChars != 1000 || p.LoadFactor != 1.25 {
		t.Errorf("defaults: %+v", p)
	}
	for _, bad := range []string{`{"prefix_chars":-1}`, `{"load_factor":-2}`} {
		p := new(PrefixHash)
		if err := json.Unmarshal([]byte(bad), p); err != nil {
			t.Fatal(err)
		}
		if p.setup() == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
