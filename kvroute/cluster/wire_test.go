package cluster

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	ok := testConfig()
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"no URL", func(c *Config) { c.URLs = nil }, "URL"},
		{"bad scheme", func(c *Config) { c.URLs = []string{"http://x:4222"} }, "scheme"},
		{"no host", func(c *Config) { c.URLs = []string{"nats://"} }, "no host"},
		{"no name", func(c *Config) { c.Name = "" }, "name"},
		{"dotted name", func(c *Config) { c.Name = "a.b" }, "name"},
		{"wildcard name", func(c *Config) { c.Name = "a*" }, "name"},
		{"long name", func(c *Config) { c.Name = strings.Repeat("a", 65) }, "name"},
		{"no secret", func(c *Config) { c.Secret = "" }, "secret"},
		{"short secret", func(c *Config) { c.Secret = "short" }, "secret"},
		{"secret newline", func(c *Config) { c.Secret = testSecret + "\n" }, "secret"},
		{"tls_ca without tls", func(c *Config) { c.TLSCA = "/ca.pem" }, "tls_ca"},
		{"ttl below interval", func(c *Config) { c.LoadTTL = 100 * time.Millisecond }, "load_ttl"},
		{"negative", func(c *Config) { c.QueueLen = -1 }, "queue_len"},
	}
	for _, tt := range tests {
		c := testConfig()
		tt.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want an error naming %q", tt.name, err, tt.want)
		}
	}
	c := testConfig()
	c.URLs = []string{"tls://user:hunter2@nats.example:4222"}
	c.TLSCA = "/ca.pem"
	if err := c.Validate(); err != nil {
		t.Errorf("tls URL with tls_ca: %v", err)
	}
	c.URLs = []string{"nats://user:hunter2@nats.example:4222", "ftp://user:hunter2@x"}
	if err := c.Validate(); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("bad URL error must not show the password: %v", err)
	}
}

func TestSealOpen(t *testing.T) {
	k, err := deriveKeys(testSecret, "fleet-a")
	if err != nil {
		t.Fatal(err)
	}
	aead, _ := k.aeadFor(42)
	h := header{version: wireVersion, kind: kindData, sender: 42, seq: 7, nanos: time.Now().UnixNano()}
	plain := []byte("records go here")
	msg := seal(nil, aead, h, plain)
	if bytes.Contains(msg, plain) {
		t.Fatal("plaintext visible in the message")
	}
	got, err := parseHeader(msg)
	if err != nil || got != h {
		t.Fatalf("header: %+v %v, want %+v", got, err, h)
	}
	out, err := open(nil, aead, got, msg)
	if err != nil || !bytes.Equal(out, plain) {
		t.Fatalf("open: %q %v", out, err)
	}
	// Every single flipped bit, header included, must fail to open (or to parse).
	for i := range msg {
		bad := bytes.Clone(msg)
		bad[i] ^= 0x10
		bh, err := parseHeader(bad)
		if err != nil {
			continue
		}
		a, _ := k.aeadFor(bh.sender)
		if _, err := open(nil, a, bh, bad); err == nil && headerOK(new(scratch), a, bh, bad) {
			t.Fatalf("byte %d flipped: message still opens", i)
		}
		// The header and its tag are checked on their own, before the payload.
		if i < headerLen+tagLen && headerOK(new(scratch), a, bh, bad) {
			t.Fatalf("byte %d of the header flipped: header tag still checks", i)
		}
	}
	if !headerOK(new(scratch), aead, got, msg) {
		t.Fatal("header tag does not check")
	}
	// A catch-up reply's header names its recipient.
	reply := seal(nil, aead, header{kind: kindSyncData, sender: 42, seq: 8, nanos: 1, to: 5}, plain)
	rh, _ := parseHeader(reply)
	if rh.to = 6; headerOK(new(scratch), aead, rh, reply) {
		t.Error("a reply's header checks for another recipient")
	}
	// Version 2 (no header tag) still opens.
	v2 := seal(nil, aead, header{version: 2, kind: kindData, sender: 42, seq: 9, nanos: 1}, plain)
	if h2, err := parseHeader(v2); err != nil || len(v2) != overheadLegacy+len(plain) {
		t.Errorf("version 2: %v, %d bytes", err, len(v2))
	} else if out, err := open(nil, aead, h2, v2); err != nil || !bytes.Equal(out, plain) {
		t.Errorf("version 2 open: %q %v", out, err)
	}
	for _, other := range []struct{ secret, name string }{{testSecret + "x", "fleet-a"}, {testSecret, "fleet-b"}} {
		k2, _ := deriveKeys(other.secret, other.name)
		a2, _ := k2.aeadFor(42)
		if _, err := open(nil, a2, h, msg); err == nil {
			t.Errorf("opens with secret %q name %q", other.secret, other.name)
		}
	}
	if _, err := parseHeader(msg[:overhead-1]); !errors.Is(err, errTruncated) {
		t.Errorf("short message: %v", err)
	}
}

func TestRecordsRoundTrip(t *testing.T) {
	var b []byte
	b = appendDecision(b, "llama", "10.0.0.1:8000", textRaw, 5, []byte("hello"))
	b = appendBinding(b, "llama", "abcd", "10.0.0.2:8000", 1234567890)
	b = appendOrigin(b, 77)
	b = appendForget(b, "abcd")
	b = appendReset(b)
	b = appendLoad(b, []peerCount{{"10.0.0.1:8000", 3}, {"10.0.0.2:8000", 0}})
	b = appendSyncReq(b, true, []seenSeq{{1, 2}, {3, 4}})
	b = appendFragment(b, fragment{id: 9, index: 1, total: 3, chunk: []byte("xyz")})
	var got []record
	if err := decodeRecords(b, wireVersion, 1<<20, func(r *record) {
		c := *r
		c.text = bytes.Clone(r.text)
		c.frag.chunk = bytes.Clone(r.frag.chunk)
		got = append(got, c)
	}); err != nil {
		t.Fatal(err)
	}
	want := []record{
		{typ: recDecision, model: "llama", upstream: "10.0.0.1:8000", textEnc: textRaw, textLen: 5, text: []byte("hello")},
		{typ: recBinding, model: "llama", sessionKey: "abcd", upstream: "10.0.0.2:8000", at: 1234567890},
		{typ: recOrigin, origin: 77},
		{typ: recForget, sessionKey: "abcd"},
		{typ: recReset},
		{typ: recLoad, loads: []peerCount{{"10.0.0.1:8000", 3}, {"10.0.0.2:8000", 0}}},
		{typ: recSyncReq, first: true, seen: []seenSeq{{1, 2}, {3, 4}}},
		{typ: recFragment, frag: fragment{id: 9, index: 1, total: 3, chunk: []byte("xyz")}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	// Every strict prefix either decodes fewer records or fails; none panics or invents one.
	for i := 0; i < len(b); i++ {
		count := 0
		err := decodeRecords(b[:i], wireVersion, 1<<20, func(*record) { count++ })
		if err == nil && count >= len(want) {
			t.Fatalf("prefix %d of %d decoded %d records", i, len(b), count)
		}
	}
}

func TestDecodeBounds(t *testing.T) {
	huge := appendDecision(nil, "m", "u", textS2, 1<<30, []byte("x"))
	if err := decodeRecords(huge, wireVersion, 1<<20, func(*record) { t.Fatal("applied a 1 GiB text") }); !errors.Is(err, errMalformed) {
		t.Errorf("declared 1 GiB text: %v", err)
	}
	long := appendBinding(nil, strings.Repeat("m", maxField+1), "k", "u", 1)
	if err := decodeRecords(long, wireVersion, 1<<20, func(*record) { t.Fatal("applied") }); !errors.Is(err, errMalformed) {
		t.Errorf("long model: %v", err)
	}
	bad := appendBinding(nil, "\xff\xfe", "k", "u", 1)
	if err := decodeRecords(bad, wireVersion, 1<<20, func(*record) { t.Fatal("applied") }); !errors.Is(err, errMalformed) {
		t.Errorf("invalid UTF-8: %v", err)
	}
	// A load record claiming more upstreams than allowed, or a sync request claiming more
	// entries than its bytes hold, is refused before anything is allocated for it.
	lie := []byte{recLoad, 0xff, 0xff, 0xff, 0x7f}
	if err := decodeRecords(lie, wireVersion, 1<<20, func(*record) { t.Fatal("applied") }); err == nil {
		t.Error("load record with 2^28 entries accepted")
	}
	lie = []byte{recSyncReq, 0, 0xff, 0xff, 0xff, 0x7f}
	if err := decodeRecords(lie, wireVersion, 1<<20, func(*record) { t.Fatal("applied") }); err == nil {
		t.Error("sync request with 2^28 entries accepted")
	}
	neg := appendLoad(nil, []peerCount{{"u", -1}})
	if err := decodeRecords(neg, wireVersion, 1<<20, func(*record) { t.Fatal("applied") }); err == nil {
		t.Error("negative load accepted")
	}
	if err := decodeRecords([]byte{99}, wireVersion, 1<<20, func(*record) { t.Fatal("applied") }); err == nil {
		t.Error("unknown record type accepted")
	}
}

func TestReplayWindowAccept(t *testing.T) {
	var p peer
	steps := []struct {
		seq  uint64
		want bool
	}{
		{0, false}, {1, true}, {1, false}, {3, true}, {2, true}, {2, false}, {3, false},
		{1000, true}, {999, true}, {4, true}, {4, false},
		{1000 + windowBits, true}, {1000, false}, // fell out of the window
		{1000 + windowBits - 1, true}, {5 * windowBits, true}, {4*windowBits + 1, true}, {4 * windowBits, false},
	}
	for i, s := range steps {
		if got := p.accept(s.seq); got != s.want {
			t.Fatalf("step %d: accept(%d) = %v, want %v", i, s.seq, got, s.want)
		}
	}
}

func TestTruncateText(t *testing.T) {
	s := "aé€😀"
	for max := 0; max <= len(s); max++ {
		got := truncateText(s, max)
		if len(got) > max || !strings.HasPrefix(s, got) || !utf8ValidString(got) {
			t.Errorf("truncate(%d) = %q", max, got)
		}
	}
}

func TestConfigEqual(t *testing.T) {
	a, b := testConfig(), testConfig()
	b.FlushDelay = defaultFlushDelay // the default, spelled out
	if !a.Equal(b) {
		t.Error("a config and the same with a default spelled out differ")
	}
	b.URLs = append(b.URLs, "nats://127.0.0.1:2")
	if a.Equal(b) {
		t.Error("another URL list is equal")
	}
	b = testConfig()
	b.Secret += "x"
	if a.Equal(b) {
		t.Error("another secret is equal")
	}
}

// TestCompressionPerDecision: a decision's bytes on the wire must not depend on what other
// clients sent before it (compression across clients would let one client learn, from sizes,
// whether another's prompt shares its text).
func TestCompressionPerDecision(t *testing.T) {
	n, _ := newTestNode(t, testConfig())
	secretPrompt := "user: my password is hunter2 and my account is 12345678 " + textOf(2000)
	probe := "user: my password is hunter2 and my account is 12345678 " + textOf(100)
	alone, _, _ := n.encodeDecision("m", "u", probe, nil, nil)
	var zb, tb []byte
	_, zb, tb = n.encodeDecision("m", "u", secretPrompt, zb, tb)
	after, _, _ := n.encodeDecision("m", "u", probe, zb, tb)
	if len(alone) != len(after) || !bytes.Equal(alone, after) {
		t.Errorf("the probe's record is %d bytes alone, %d after a similar prompt", len(alone), len(after))
	}
	if n.Stats().CompressionRatio() <= 1 {
		t.Errorf("compression ratio %v on English-like text", n.Stats().CompressionRatio())
	}
}
