package kvroute

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// breakingPrefill is a prefill engine that answers its header and part of a body, then breaks
// the connection off, as an engine that crashes mid-answer does.
func breakingPrefill(t *testing.T) string {
	t.Helper()
	p := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			http.NotFound(w, r)
			return
		}
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, `{"choices":`)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(p.Close)
	return strings.TrimPrefix(p.URL, "http://")
}

// Caddy's reverse_proxy panics with http.ErrAbortHandler when an answer breaks off after its
// header. protocol sglang runs the prefill leg on a goroutine of its own, where that panic
// ended the whole process ("panic: net/http: abort Handler" from serveSGLang's goroutine); it
// is a failed prefill leg: the documented 502.
func TestDisaggregateSGLangPrefillBreaksOffMidAnswer(t *testing.T) {
	dec := newSGEngine(t)
	dec.set(true, 0) // the decode engine holds the request: its KV never arrives
	startCaddy(t, pdConfig(breakingPrefill(t), dec.addr(), "protocol sglang", ""))
	client := &http.Client{Timeout: 15 * time.Second}
	before := disaggCounts[disaggPrefillFailed].Load()
	for _, stream := range []bool{false, true} {
		code, got := postPD(t, client, longChat(stream, ""))
		if code != http.StatusBadGateway {
			t.Fatalf("stream %t: a prefill engine that broke off mid-answer: status %d (%q), want 502", stream, code, got)
		}
	}
	if n := disaggCounts[disaggPrefillFailed].Load() - before; n != 2 {
		t.Fatalf("prefill_failed counted %d, want 2", n)
	}
}

// With protocol vllm the same break-off is a failed prefill leg that goes on aggregated: the
// client gets the decode engine's answer, never a cut connection.
func TestDisaggregateVLLMPrefillBreaksOffMidAnswer(t *testing.T) {
	fl := new(pdFleet)
	dec := newPDEngine(t, fl, "d1", false)
	startCaddy(t, pdConfig(breakingPrefill(t), dec.addr(), "split always", ""))
	client := &http.Client{Timeout: 15 * time.Second}
	code, got := postPD(t, client, longChat(false, ""))
	if code != http.StatusOK || !strings.Contains(got, "Paris. (d1)") {
		t.Fatalf("a prefill engine that broke off mid-answer: status %d, answer %q; want the decode engine's aggregated answer", code, got)
	}
}

// A gzip body decoded as it streams to a decode engine is bounded (at least 16 × max_body):
// before, 1 MB of gzip could reach an engine as a gigabyte (found by review). Here the bound
// is 16 × 2 KiB; a body decoding to ~200 KiB never reaches the engine whole, one within the
// bound does, unchanged but for its P/D fields.
func TestDisaggregateDecodedStreamBounded(t *testing.T) {
	old := maxDecodedStream
	maxDecodedStream = 0
	t.Cleanup(func() { maxDecodedStream = old })
	fl := new(pdFleet)
	p := newPDEngine(t, fl, "p1", true)
	dec := newRawDecoder(t)
	cfg := strings.Replace(pdConfig(p.addr(), dec.addr(), "split always", ""), "@llm llm_prompt\n", "@llm llm_prompt {\n\t\tmax_body 2KiB\n\t}\n", 1)
	startCaddy(t, cfg)
	client := &http.Client{Timeout: 20 * time.Second}

	within := longChat(false, ", "+forgedKV) // ~11 KiB decoded
	if code, _, got := postGzip(t, client, within); code != http.StatusOK {
		t.Fatalf("a gzip body within the bound: status %d: %s", code, got)
	}
	if b := dec.next(t); b.encoding != "" || strings.Contains(string(b.body), "kv_transfer_params") || strings.Count(string(b.body), "a long document") != 400 {
		t.Fatalf("a gzip body within the bound reached the decode engine as (Content-Encoding %q) %.200s...", b.encoding, b.body)
	}
	huge := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":5}`, strings.Repeat("a", 200<<10))
	code, enc, got := postGzip(t, client, huge)
	if code == http.StatusOK {
		t.Fatalf("a %d-byte gzip body decoding to %d bytes, over the bound of 32 KiB: status 200 (%s)", enc, len(huge), got)
	}
	if n := dec.seen.Load(); n != 1 {
		t.Fatalf("the decode engine read %d whole bodies, want 1 (not the one over the bound)", n)
	}
}

// A decode engine that sends its header (a Content-Length and a header of its own) and breaks
// off before its first byte of body: the client gets a clean 502 with none of the decode
// answer's headers (with its Content-Length the 502 was a broken answer; found by review).
// Whether the prefill engine answered already or still holds its leg (an SGLang prefill engine
// answers only once the decode engine took the KV, which this one never does) makes no
// difference to the client: the leg still running when the decode leg ends is cancelled, and
// Caddy's reverse proxy records that cancellation as a 499 of its own, which was taken for the
// prefill engine's refusal (a 4xx) and answered to the live client (a 499, seen once in CI).
func TestDisaggregateSGLangDecodeCutLeavesNoHeaders(t *testing.T) {
	for _, held := range []bool{false, true} {
		t.Run(fmt.Sprintf("prefill held %t", held), func(t *testing.T) {
			pre := newSGEngine(t)
			pre.set(held, 0)
			dec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/metrics" {
					http.NotFound(w, r)
					return
				}
				io.Copy(io.Discard, r.Body)
				<-pre.arrived // the prefill engine has the leg: it answers at once, or holds it
				w.Header().Set("X-Decode-Engine", "d1")
				w.Header().Set("Content-Length", "1000")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			}))
			t.Cleanup(dec.Close)
			startCaddy(t, pdConfig(pre.addr(), strings.TrimPrefix(dec.URL, "http://"), "protocol sglang", ""))
			client := &http.Client{Timeout: 15 * time.Second}
			resp, err := client.Post(baseURL+"/v1/chat/completions", "application/json", strings.NewReader(longChat(false, "")))
			if err != nil {
				t.Fatalf("POST: %v", err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadGateway || err != nil || resp.Header.Get("X-Decode-Engine") != "" {
				t.Fatalf("a decode answer cut before its body: status %d, X-Decode-Engine %q, Content-Length %d, body %q (read error %v); want a clean 502 without the decode answer's headers",
					resp.StatusCode, resp.Header.Get("X-Decode-Engine"), resp.ContentLength, body, err)
			}
			if held {
				select {
				case <-pre.cancelled:
				case <-time.After(10 * time.Second):
					t.Fatal("the held prefill leg was not cancelled")
				}
			}
		})
	}
}

// A decode pool that cannot be reached (its engine's port closed) while the prefill leg runs
// (the engine holds it; the leg may also be cancelled before it got there: the decode leg fails
// at once): the client gets the decode reverse_proxy's 502, not the 499 that Caddy records for
// the prefill leg cancelled afterwards (which was taken for the prefill engine's refusal).
func TestDisaggregateSGLangDecodeUnreachableIs502(t *testing.T) {
	pre := newSGEngine(t)
	pre.set(true, 0)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := l.Addr().String()
	l.Close()
	startCaddy(t, pdConfig(pre.addr(), gone, "protocol sglang", ""))
	client := &http.Client{Timeout: 15 * time.Second}
	before := disaggCounts[disaggSplit].Load()
	for _, stream := range []bool{false, true} {
		if code, got := postPD(t, client, longChat(stream, "")); code != http.StatusBadGateway {
			t.Fatalf("stream %t: the decode engine unreachable, the prefill leg held: status %d (%q), want 502", stream, code, got)
		}
	}
	if n := disaggCounts[disaggSplit].Load() - before; n != 2 {
		t.Errorf("split counted %d, want 2 (both legs went; the decode leg failed)", n)
	}
}
