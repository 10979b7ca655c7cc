package kvroute

// Fuzz targets of the kvroute package. `go test` runs their seeds (the f.Add calls below and the
// files under testdata/fuzz/<target>/); a longer run, one target at a time:
//
//	go test ./kvroute -run '^$' -fuzz '^FuzzCookieDecode$' -fuzztime 60s
//	go test ./kvroute -run '^$' -fuzz '^FuzzPolicyCaddyfile$' -fuzztime 60s
//	go test ./kvroute -run '^$' -fuzz '^FuzzMatcherCaddyfile$' -fuzztime 60s
//	go test ./kvroute -run '^$' -fuzz '^FuzzSelectBody$' -fuzztime 60s
//	go test ./kvroute -run '^$' -fuzz '^FuzzAnswer$' -fuzztime 60s
//
// or all of them: examples/soak/fuzz.sh [duration per target]. The extraction (kvroute/llmreq)
// and the radix tree (tree/) have their own fuzz targets.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
)

// FuzzCookieDecode: decode never panics, and accepts exactly what encode produced with the
// same secret: an accepted value re-encodes to itself, a value signed with another secret or
// with one byte changed is refused.
func FuzzCookieDecode(f *testing.F) {
	good := &cookieCodec{name: "s", secret: []byte("secret")}
	id := base64.RawURLEncoding.EncodeToString(make([]byte, cookieIDBytes))
	f.Add([]byte("secret"), good.encode(id), []byte("seed"))
	f.Add([]byte(""), id, []byte(""))
	f.Add([]byte("secret"), id, []byte("x"))
	f.Add([]byte("secret"), id+"."+strings.Repeat("A", cookieMACLen), []byte("y"))
	f.Add([]byte("k"), "127.0.0.1:8001", []byte{0})
	f.Add([]byte("k"), strings.Repeat(".", 70), []byte{1, 2})
	f.Add([]byte("k\x00"), "", []byte("\xff"))
	f.Add([]byte(strings.Repeat("s", 100)), "a.b.c", []byte("z"))
	f.Fuzz(func(t *testing.T, secret []byte, value string, idSeed []byte) {
		c := &cookieCodec{name: "s", secret: secret}
		if id, ok := c.decode(value); ok {
			if len(id) != cookieIDLen || !isBase64URL(id) {
				t.Fatalf("decode(%q) accepted id %q: not %d base64url chars", value, id, cookieIDLen)
			}
			if c.encode(id) != value {
				t.Fatalf("decode(%q) = %q, but encode(%q) = %q: accepted a value encode does not produce", value, id, id, c.encode(id))
			}
		}

		// A value made by encode round-trips, and nothing else nearby is accepted.
		sum := sha256.Sum256(idSeed)
		id := base64.RawURLEncoding.EncodeToString(sum[:cookieIDBytes])
		v := c.encode(id)
		if got, ok := c.decode(v); !ok || got != id {
			t.Fatalf("decode(encode(%q)) = %q, %v", id, got, ok)
		}
		other := &cookieCodec{name: "s", secret: append(append([]byte{}, secret...), 'x')}
		if _, ok := other.decode(v); ok {
			t.Fatalf("a cookie signed with %q was accepted with secret %q", secret, other.secret)
		}
		if len(secret) > 0 {
			if _, ok := (&cookieCodec{name: "s"}).decode(v); ok {
				t.Fatalf("a signed cookie %q was accepted by an unsigned codec", v)
			}
			if _, ok := c.decode(id); ok {
				t.Fatalf("an unsigned id %q was accepted with secret %q", id, secret)
			}
			pos := int(sum[20]) % len(v)
			b := []byte(v)
			b[pos] ^= byte(sum[21]%63) + 1
			if _, ok := c.decode(string(b)); ok {
				t.Fatalf("%q (one byte of %q changed) was accepted", b, v)
			}
		}
	})
}

// caddyfileLine is how a Caddyfile error names its place.
var caddyfileLine = regexp.MustCompile(`, at Caddyfile:[1-9][0-9]*`)

// dispenser tokenizes input as the Caddyfile adapter does and returns the dispenser a module
// named name would get: the adapter always hands over a segment that starts with the module's
// name, so other token streams are skipped. (caddyfile.NewTestDispenser exits the process with
// log.Fatalf on a lexer error; Tokenize returns it, and the adapter reports those itself, with
// file:line, before any module sees a token.)
func dispenser(name, input string) (*caddyfile.Dispenser, bool) {
	tokens, err := caddyfile.Tokenize([]byte(input), "Caddyfile")
	if err != nil || len(tokens) == 0 || tokens[0].Text != name {
		return nil, false
	}
	return caddyfile.NewDispenser(tokens), true
}

var policySeeds = []string{
	"kv_cache_aware",
	"kv_cache_aware {\n}",
	"kv_cache_aware {\n\tcache_threshold 0.3\n\tbalance_abs_threshold 64\n\tbalance_rel_threshold 1.5\n\ton_imbalance prefix_in_band\n\teviction_interval 120s\n\tmax_tree_size 64Mi\n\tsession_header X-Session-ID\n\tsession_cookie kvroute_session {env.SECRET}\n\tsession_ttl 30m\n\tmax_sessions 100000\n\texpected_tokens 256\n\tfallback joule\n}",
	"kv_cache_aware {\n\tupstream 10.0.0.1:8000 {\n\t\taccelerator gpu\n\t\tmodels llama-3.1-8b qwen*\n\t\tmax_concurrency 64\n\t\tenergy_per_token 150uJ\n\t\tprefill_energy_per_token 20uJ\n\t\tcarbon_intensity 56\n\t\tzone EU-FR\n\t\tkv_capacity 2M\n\t\tcontinuous_batching\n\t\tpaged_kv\n\t}\n\tupstream unix//run/llm.sock\n}",
	"kv_cache_aware extra",
	"kv_cache_aware {\n\tcache_threshold 2\n}",
	"kv_cache_aware {\n\tcache_threshold\n}",
	"kv_cache_aware {\n\tcache_threshold 0.1 0.2\n}",
	"kv_cache_aware {\n\tcache_threshold NaN\n}",
	"kv_cache_aware {\n\tbalance_rel_threshold +Inf\n}",
	"kv_cache_aware {\n\tmax_tree_size 99999999999999999999Ti\n}",
	"kv_cache_aware {\n\tmax_sessions -1\n}",
	"kv_cache_aware {\n\tsession_cookie a b c\n}",
	"kv_cache_aware {\n\tsession_cookie \"a\nb\"\n}",
	"kv_cache_aware {\n\tfallback cheapest\n}",
	"kv_cache_aware {\n\tupstream 10.0.0.1:8000 {\n\t\tenergy_per_token 150\n\t}\n}",
	"kv_cache_aware {\n\tupstream {\n\t}\n}",
	"kv_cache_aware {\n\tupstream a:1\n\tupstream a:1\n}",
	"kv_cache_aware {\n\tsession_ttl 0s\n\teviction_interval -5s\n}",
	"kv_cache_aware {\n\tmax_sessions 1\n\tmax_sessions 2\n}",
	"kv_cache_aware {\n\tcache_threshold {\n\t}\n}",
	"kv_cache_aware {\n\t}\n}\n}",
	"kv_cache_aware {\n\tqueue_timeout 10s\n\tflow_control {\n\t\ttenant {http.auth.user.id}\n\t\tpriority {http.request.header.X-Priority}\n\t\tband interactive {\n\t\t\tqueue_timeout 10s\n\t\t}\n\t\tband batch {\n\t\t\tqueue_timeout 5m\n\t\t}\n\t\tmax_queued 10000\n\t\tmax_queued_per_tenant 1000\n\t\toutput_weight 2\n\t}\n}",
	"kv_cache_aware {\n\tflow_control {\n\t\tband\n\t\tband a b\n\t}\n}",
	"kv_cache_aware {\n\tflow_control x {\n\t\tmax_queued 0\n\t}\n\tqueue_timeout -1s\n}",
	"kv_cache_aware {\n\tflow_control {\n\t\tband a {\n\t\t\tqueue_timeout\n\t\t\tother 1\n\t\t}\n\t}\n}",
}

// FuzzPolicyCaddyfile: (*KVCacheAware).UnmarshalCaddyfile never panics on any token stream; an
// error names its file:line; a block it accepts survives the JSON round trip the Caddyfile
// adapter makes (the JSON form mirrors the Caddyfile).
func FuzzPolicyCaddyfile(f *testing.F) {
	for _, s := range policySeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		d, ok := dispenser("kv_cache_aware", input)
		if !ok {
			return
		}
		p := new(KVCacheAware)
		if err := p.UnmarshalCaddyfile(d); err != nil {
			if !caddyfileLine.MatchString(err.Error()) {
				t.Fatalf("UnmarshalCaddyfile(%q): error %q does not name its file:line", input, err)
			}
			return
		}
		raw, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("UnmarshalCaddyfile(%q) accepted a policy JSON cannot encode: %v", input, err)
		}
		var q KVCacheAware
		if err := json.Unmarshal(raw, &q); err != nil {
			t.Fatalf("UnmarshalCaddyfile(%q): its JSON %s does not load back: %v", input, raw, err)
		}
		if again, _ := json.Marshal(&q); !bytes.Equal(again, raw) {
			t.Fatalf("UnmarshalCaddyfile(%q): JSON round trip changed the policy:\n %s\n %s", input, raw, again)
		}
	})
}

var matcherSeeds = []string{
	"llm_prompt",
	"llm_prompt {\n}",
	"llm_prompt {\n\tmax_body 4MiB\n\tmodel llama-3.1-8b qwen*\n\tmodels gpt-?\n}",
	"llm_prompt arg",
	"llm_prompt {\n\tmax_body 0\n}",
	"llm_prompt {\n\tmax_body\n}",
	"llm_prompt {\n\tmax_body 1 2\n}",
	"llm_prompt {\n\tmax_body 99999999999999999999EiB\n}",
	"llm_prompt {\n\tmodel\n}",
	"llm_prompt {\n\tmodel [\n}",
	"llm_prompt {\n\tmodel a\n\tmodel b\n}",
	"llm_prompt {\n\tunknown 1\n}",
	"llm_prompt {\n\tmax_body {\n\t}\n}",
	"llm_prompt\nllm_prompt {\n\tmax_body 1k\n}",
}

// FuzzMatcherCaddyfile: (*LLMPrompt).UnmarshalCaddyfile never panics; an error names its
// file:line; what it accepts passes Validate and survives the JSON round trip.
func FuzzMatcherCaddyfile(f *testing.F) {
	for _, s := range matcherSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		d, ok := dispenser("llm_prompt", input)
		if !ok {
			return
		}
		m := new(LLMPrompt)
		if err := m.UnmarshalCaddyfile(d); err != nil {
			if !caddyfileLine.MatchString(err.Error()) {
				t.Fatalf("UnmarshalCaddyfile(%q): error %q does not name its file:line", input, err)
			}
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("UnmarshalCaddyfile(%q) accepted a matcher Validate refuses: %v", input, err)
		}
		raw, _ := json.Marshal(m)
		var q LLMPrompt
		if err := json.Unmarshal(raw, &q); err != nil || !reflect.DeepEqual(&q, m) {
			t.Fatalf("UnmarshalCaddyfile(%q): JSON round trip %s gave %+v, want %+v (%v)", input, raw, q, *m, err)
		}
	})
}

// selectSeeds are bodies for FuzzSelectBody: the four formats, and the bad input of docs/design.md and the README's threat model.
var selectSeeds = []string{
	``,
	`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"}],"max_tokens":16}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}],"prompt_cache_key":"pck","stream":true}`,
	`{"model":"claude","system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":"hi"}]}`,
	`{"model":"m","prompt":["a","b"],"max_tokens":1}`,
	`{"text":"sglang prompt","sampling_params":{"max_new_tokens":8}}`,
	`{"model":"m","messages":[{"role":"user","content":"\ud83d\ude00 \udc00 \u0000"}]}`,
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\xc0\"}]}",
	`{"model":"m","messages":`,
	`not json at all`,
	"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff",
	strings.Repeat("[", 5000),
	strings.Repeat(`{"a":`, 2000),
	`{"model":"` + strings.Repeat("M", 300) + `","prompt_cache_key":"` + strings.Repeat("k", 300) + `","prompt":"x"}`,
	`{"model":1,"messages":{"role":"user"},"prompt":null,"text":[1,2]}`,
	`{"messages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}]}`,
}

// FuzzSelectBody: the full Select path (matcher or not, known length or chunked, retried) on
// any body. It never panics and always picks an upstream; what an upstream would read is the
// input, byte for byte; the extracted keys are bounded; the trees and sessions stay within their
// bounds; and what one decision allocates is bounded by the bytes read for routing, not by the
// body.
func FuzzSelectBody(f *testing.F) {
	for i, s := range selectSeeds {
		f.Add([]byte(s), uint16(64<<(i%6)), i%2 == 1, i%3 != 0, []string{"", "sess", strings.Repeat("s", 200)}[i%3])
	}
	p := newPolicy(f, &KVCacheAware{MaxTreeSize: 1 << 20, MaxSessions: 512, SessionCookie: &SessionCookie{Secret: testSecret}})
	p.logger = zap.NewNop()
	pool := newPool("a:1", "b:1", "c:1")
	f.Fuzz(func(t *testing.T, body []byte, maxBody uint16, chunked, matcher bool, sid string) {
		mb := int64(maxBody) + 1
		var rd io.Reader = bytes.NewReader(body)
		if chunked {
			rd = io.MultiReader(rd) // hides the length
		}
		r := withVars(httptest.NewRequest(http.MethodPost, "/v1/chat/completions", rd))
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel() // the request ends: its in-flight count is released
		r = r.WithContext(ctx)
		r.ContentLength = int64(len(body))
		if chunked {
			r.ContentLength = -1
		}
		if sid != "" {
			r.Header.Set("X-Session-ID", sid)
		}
		readLimit := min(int64(len(body)), mb) + 1

		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		if matcher {
			m := &LLMPrompt{MaxBody: mb, logger: zap.NewNop()}
			_, _ = m.MatchWithError(r)
		} else {
			mb = DefaultMaxBody
		}
		first := p.Select(pool, r, httptest.NewRecorder())
		retry := p.Select(pool, r, httptest.NewRecorder()) // a retry after a failed dial
		runtime.ReadMemStats(&after)
		if first == nil || retry == nil {
			t.Fatalf("no upstream for body %.80q", body)
		}
		// The bytes read for routing (at most max_body+1), the routing text and its copy in the
		// tree (each at most 3 bytes per body byte: U+FFFD for an invalid byte), and a constant.
		if alloc, bound := after.TotalAlloc-before.TotalAlloc, uint64(16*readLimit+256<<10); alloc > bound {
			t.Errorf("one decision on a %d-byte body (max_body %d) allocated %d bytes, bound %d", len(body), mb, alloc, bound)
		}

		got, err := io.ReadAll(r.Body)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("the upstream would read %d bytes (%v), not the %d sent", len(got), err, len(body))
		}
		_ = r.Body.Close()

		lr := requestFor(r, mb)
		if !bounded(lr.Model, maxModelLen) || !bounded(lr.Session, maxSessionLen) || !utf8.ValidString(lr.Text) {
			t.Fatalf("unbounded keys: model %d bytes, session %d bytes, valid text %v", len(lr.Model), len(lr.Session), utf8.ValidString(lr.Text))
		}
		if c, max := p.state.forest.Chars(), p.MaxTreeSize+p.MaxTreeSize/10; c > max {
			t.Fatalf("trees hold %d chars, bound %d", c, max)
		}
		if n := p.state.sessions.len(); n > p.MaxSessions {
			t.Fatalf("%d sessions bound, max_sessions %d", n, p.MaxSessions)
		}
	})
}

// bounded reports whether a client-chosen key is short, or a digest of a long one.
func bounded(s string, max int) bool {
	return len(s) <= max || strings.HasPrefix(s, "sha256:") && len(s) == 71
}

// FuzzAnswer: the answer observer never panics, reports only usage that can be true (0 <=
// cached <= prompt <= maxUsageTokens), and reads the same whether the answer comes whole or cut
// in two anywhere (the engine's writes and Caddy's copy buffer cut it anywhere).
func FuzzAnswer(f *testing.F) {
	for _, tc := range answerCases {
		f.Add([]byte(tc.body), uint16(len(tc.body)/2), tc.kind == answerSSE)
	}
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":1}}\r\rdata:[DONE]\n\n"), uint16(3), true)
	f.Add([]byte("data\n\ndata:\ndata:{}\n\n:comment\n\n"), uint16(0), true)
	f.Fuzz(func(t *testing.T, body []byte, cut uint16, sse bool) {
		kind := answerJSON
		if sse {
			kind = answerSSE
		}
		at := int(cut) % (len(body) + 1)
		var whole, split answerObserver
		whole.begin(kind, true)
		firstWhole := whole.write(body)
		a := whole.finish()
		split.begin(kind, true)
		firstSplit := split.write(body[:at])
		firstSplit = split.write(body[at:]) || firstSplit
		b := split.finish()
		if a != b || firstWhole != firstSplit {
			t.Fatalf("whole: %+v (first %v), cut at %d: %+v (first %v)", a, firstWhole, at, b, firstSplit)
		}
		if a.ok && !(a.cached >= 0 && a.cached <= a.prompt && a.prompt <= maxUsageTokens && a.prefillMS >= 0) {
			t.Fatalf("usage that cannot be true was reported: %+v", a)
		}
		if len(a.respID) > maxIDLen {
			t.Fatalf("response id of %d bytes kept", len(a.respID))
		}
	})
}
