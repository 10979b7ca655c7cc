package cluster

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

const testSecret = "0123456789abcdef-test-secret"

func testConfig() Config {
	return Config{URLs: []string{"nats://127.0.0.1:1"}, Name: "fleet-a", Secret: testSecret}
}

// recorder is a Handler that remembers every call, as one line each.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.calls = append(r.calls, s)
	r.mu.Unlock()
}
func (r *recorder) Decision(model, upstream, text string) {
	r.add(fmt.Sprintf("decision %s %s %d:%s", model, upstream, len(text), short(text)))
}
func (r *recorder) Binding(model, sk, upstream string, at time.Time) bool {
	r.add(fmt.Sprintf("binding %s %s %s", model, sk, upstream))
	return true
}
func (r *recorder) Forget(sk string) { r.add("forget " + sk) }
func (r *recorder) Reset()           { r.add("reset") }
func (r *recorder) Reading(er EngineReading) {
	r.add(fmt.Sprintf("reading %s %s run %d wait %d kv %d known %d failed %v", er.Upstream, er.Engine, er.Running, er.Waiting, er.KVCapacityTokens, er.Known, er.Failed))
}

func (r *recorder) Learned(l EngineLearned) {
	r.add(fmt.Sprintf("learned %s prefill %v decode %v restarted %v", l.Upstream, l.PrefillTokensPerSecond, l.DecodeTokensPerSecond, !l.RestartedAt.IsZero()))
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func short(s string) string {
	if len(s) > 24 {
		return s[:24]
	}
	return s
}

// newTestNode is a node that is never connected: tests feed its receive side directly.
func newTestNode(t testing.TB, cfg Config) (*Node, *recorder) {
	t.Helper()
	r := &recorder{}
	n, _, err := newNode(cfg, r, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, r
}

// sealAs seals plain as a message from n with the next sequence number.
func sealAs(n *Node, kind byte, plain []byte) []byte {
	return sealTo(n, 0, kind, plain)
}

// sealTo seals plain as a message from n to the node whose id is to (catch-up replies).
func sealTo(n *Node, to uint64, kind byte, plain []byte) []byte {
	return seal(nil, n.aead, header{kind: kind, sender: n.id, seq: n.seq.Add(1), nanos: time.Now().UnixNano(), to: to}, plain)
}

func textOf(n int) string {
	return strings.Repeat("the quick brown fox jumps over the lazy dog ", n/44+1)[:n]
}

func utf8ValidString(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }
