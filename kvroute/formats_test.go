package kvroute

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// sdkPayload reads a body recorded from the OpenAI or Anthropic Node SDK (see
// llmreq/testdata/sdk and llmreq/formats_test.go).
func sdkPayload(t testing.TB, name string) []byte {
	b, err := os.ReadFile(filepath.Join("llmreq", "testdata", "sdk", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

func zlibbed(b []byte) []byte {
	var buf bytes.Buffer
	w := zlib.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

// gzipBomb is a gzip stream that starts a chat body and then decodes to mib MiB of 'a' inside
// its last message: two gzip members, the second one MiB of 'a' compressed once and repeated
// (a non-final block ending byte-aligned), so that the stream is generated, not stored.
func gzipBomb(mib int) io.Reader {
	head := gzipped([]byte(`{"model":"m","messages":[{"role":"user","content":"`))
	var block bytes.Buffer
	zw, _ := flate.NewWriter(&block, flate.BestCompression)
	zw.Write(bytes.Repeat([]byte("a"), 1<<20))
	zw.Flush()
	parts := []io.Reader{bytes.NewReader(head), bytes.NewReader([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff})}
	for range mib {
		parts = append(parts, bytes.NewReader(block.Bytes()))
	}
	return io.MultiReader(append(parts, bytes.NewReader([]byte{1, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0}))...)
}

// TestMatcherFormats runs the matcher without a server: formats by path and header, compressed
// bodies, a prompt_cache_key alone; and the body the next handler reads is the one sent.
func TestMatcherFormats(t *testing.T) {
	chat := []byte(`{"model":"m","messages":[{"role":"user","content":"hello there"}]}`)
	for _, tt := range []struct {
		name     string
		path     string
		header   []string
		body     []byte
		match    bool
		format   string
		text     string // a part of the routing text
		maxBody  int64
		maxChars int
	}{
		{"responses", "/v1/responses", nil, sdkPayload(t, "responses-turn3.json"), true, "openai_responses", "user\x1fAnd in Lyon?", 0, 0},
		{"responses by path only", "/v1/responses", nil, sdkPayload(t, "responses-string.json"), true, "openai_responses", "Say hi.", 0, 0},
		{"input elsewhere", "/v1/embeddings", nil, []byte(`{"model":"m","input":"Say hi."}`), false, "none", "", 0, 0},
		{"prompt_cache_key only", "/v1/embeddings", nil, []byte(`{"model":"m","prompt_cache_key":"conv-9"}`), true, "none", "", 0, 0},
		{"anthropic by path", "/v1/messages", nil, sdkPayload(t, "anthropic-no-system.json"), true, "anthropic_messages", "Hi", 0, 0},
		{"anthropic by header", "/proxy/chat", []string{"Anthropic-Version", "2023-06-01"}, sdkPayload(t, "anthropic-no-system.json"), true, "anthropic_messages", "Hi", 0, 0},
		{"chat with tools", "/v1/chat/completions", nil, sdkPayload(t, "chat-tools-image.json"), true, "openai_chat", "tools\x1f[{\"type\":\"function\"", 0, 0},
		{"input_ids", "/generate", nil, []byte(`{"input_ids":[101,2023,2003],"sampling_params":{"max_new_tokens":8}}`), true, "sglang_generate", "101 2023 2003", 0, 0},
		{"ollama chat by path", "/api/chat", nil, chat, true, "ollama_chat", "user\x1fhello there", 0, 0},
		{"ollama generate by path", "/api/generate", nil, []byte(`{"model":"tiny","prompt":"hello there"}`), true, "ollama_generate", "user\x1fhello there\x1e", 0, 0},
		{"ollama generate by its fields", "/proxy", nil, []byte(`{"model":"tiny","system":"S","prompt":"hello there","options":{"num_predict":3}}`), true, "ollama_generate", "system\x1fS\x1euser\x1fhello there", 0, 0},
		{"gzip", "/v1/chat/completions", []string{"Content-Encoding", "gzip"}, gzipped(chat), true, "openai_chat", "hello there", 0, 0},
		{"deflate", "/v1/responses", []string{"Content-Encoding", "deflate"}, zlibbed(sdkPayload(t, "responses-turn1.json")), true, "openai_responses", "Paris?", 0, 0},
		{"gzip, decoded beyond max_body", "/v1/chat/completions", []string{"Content-Encoding", "gzip"},
			gzipped([]byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("abc ", 10000) + `"}]}`)), true, "openai_chat", "abc abc", 1000, 1000},
		{"gzip unreadable", "/v1/chat/completions", []string{"Content-Encoding", "gzip"}, chat, false, "none", "", 0, 0},
		{"brotli", "/v1/chat/completions", []string{"Content-Encoding", "br"}, chat, false, "none", "", 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := &LLMPrompt{MaxBody: tt.maxBody, logger: zap.NewNop()}
			if m.MaxBody == 0 {
				m.MaxBody = DefaultMaxBody
			}
			r := httptest.NewRequest(http.MethodPost, tt.path, bytes.NewReader(tt.body))
			for i := 0; i+1 < len(tt.header); i += 2 {
				r.Header.Set(tt.header[i], tt.header[i+1])
			}
			ok, err := m.MatchWithError(r)
			lr := requestFor(r, m.MaxBody)
			if err != nil || ok != tt.match || lr.Format.String() != tt.format || !strings.Contains(lr.Text, tt.text) {
				t.Errorf("match %v (%v), format %v, text %q; want match %v, %s, text with %q", ok, err, lr.Format, lr.Text, tt.match, tt.format, tt.text)
			}
			if tt.maxChars > 0 && lr.Runes > tt.maxChars {
				t.Errorf("%d chars of routing text from max_body %d", lr.Runes, tt.maxBody)
			}
			if got, _ := io.ReadAll(r.Body); !bytes.Equal(got, tt.body) {
				t.Errorf("the next handler reads %d bytes, the client sent %d", len(got), len(tt.body))
			}
		})
	}
}

// TestIntegrationFormatsBodyIntegrity: through matcher, policy and proxy, every body format
// reaches the upstream byte for byte (compressed ones as compressed), and is routed as what
// it is (the format placeholder, echoed by the proxy, says so).
func TestIntegrationFormatsBodyIntegrity(t *testing.T) {
	f := newFleet(t, 2)
	const maxBody = 64 << 10
	startCaddy(t, proxyConfig(f, fmt.Sprintf("max_body %d", maxBody), "", "header_down X-LLM-Format {http.vars.llm.format}"))
	client := &http.Client{Timeout: 60 * time.Second}
	big := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("compressible ", 50000) + `"}]}`)
	var bomb bytes.Buffer
	io.Copy(&bomb, gzipBomb(10<<10)) // 10 GiB decoded, some 10 MB sent
	cases := []struct {
		name, path string
		header     []string
		body       []byte
		format     string // "" for unmatched: the plain proxy serves it
	}{
		{"responses turn", "/v1/responses", nil, sdkPayload(t, "responses-turn3.json"), "openai_responses"},
		{"responses string", "/v1/responses", nil, sdkPayload(t, "responses-string.json"), "openai_responses"},
		{"responses previous_response_id", "/v1/responses", nil, sdkPayload(t, "responses-previous.json"), "openai_responses"},
		{"chat tools image", "/v1/chat/completions", nil, sdkPayload(t, "chat-tools-image.json"), "openai_chat"},
		{"anthropic tools image", "/v1/messages", []string{"Anthropic-Version", "2023-06-01"}, sdkPayload(t, "anthropic-tools-image.json"), "anthropic_messages"},
		{"anthropic no system", "/v1/messages", nil, sdkPayload(t, "anthropic-no-system.json"), "anthropic_messages"},
		{"input_ids", "/generate", nil, []byte(`{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":4}}`), "sglang_generate"},
		{"prompt_cache_key only", "/v1/embeddings", nil, []byte(`{"model":"m","input":"x","prompt_cache_key":"k"}`), "none"},
		{"gzip chat", "/v1/chat/completions", []string{"Content-Encoding", "gzip"}, gzipped(sdkPayload(t, "chat-tools-image.json")), "openai_chat"},
		{"deflate responses", "/v1/responses", []string{"Content-Encoding", "deflate"}, zlibbed(sdkPayload(t, "responses-turn2.json")), "openai_responses"},
		{"gzip decoding past max_body", "/v1/chat/completions", []string{"Content-Encoding", "gzip"}, gzipped(big), "openai_chat"},
		{"gzip bomb", "/v1/chat/completions", []string{"Content-Encoding", "gzip"}, bomb.Bytes(), "openai_chat"},
		{"gzip garbage", "/v1/chat/completions", []string{"Content-Encoding", "gzip"}, big[:5000], ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, baseURL+tc.path, bytes.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			for i := 0; i+1 < len(tc.header); i += 2 {
				req.Header.Set(tc.header[i], tc.header[i+1])
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var rep backendReply
			if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, reply: %v", resp.StatusCode, err)
			}
			sum := sha256.Sum256(tc.body)
			if rep.SHA256 != hex.EncodeToString(sum[:]) || rep.Len != int64(len(tc.body)) {
				t.Errorf("upstream received %d bytes with sha256 %s, want %d bytes, %x", rep.Len, rep.SHA256, len(tc.body), sum)
			}
			if got := resp.Header.Get("X-LLM-Format"); got != tc.format {
				t.Errorf("routed as %q, want %q", got, tc.format)
			}
		})
	}
}

// responsesBody is a Responses request as the OpenAI SDK writes it: instructions, tools, the
// input items so far, max_output_tokens.
func responsesBody(t testing.TB, instructions string, input []any, extra map[string]any) string {
	body := map[string]any{
		"model":        "m",
		"instructions": instructions,
		"tools": []any{map[string]any{"type": "function", "name": "lookup", "description": strings.Repeat("Looks a word up. ", 20),
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"word": map[string]string{"type": "string"}}}}},
		"input":             input,
		"max_output_tokens": 128,
	}
	for k, v := range extra {
		body[k] = v
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestIntegrationResponsesConversationStaysHome: 3-turn Responses conversations (messages,
// function calls and their outputs, reasoning) each stay on the upstream of their first turn,
// and so does one that sends only its new input with previous_response_id and a
// prompt_cache_key.
func TestIntegrationResponsesConversationStaysHome(t *testing.T) {
	f := newFleet(t, 4)
	startCaddy(t, proxyConfig(f, "", "", ""))
	client := &http.Client{Timeout: 10 * time.Second}
	type conv struct {
		instructions string
		input        []any
		home         string
	}
	var convs []*conv
	for i := range 6 {
		convs = append(convs, &conv{
			instructions: fmt.Sprintf("You are assistant number %d. ", i) + strings.Repeat("Answer with care. ", 40),
			input:        []any{map[string]any{"role": "user", "content": fmt.Sprintf("question %d: %s", i, strings.Repeat("why? ", 20))}},
		})
	}
	for turn := range 3 {
		for i, c := range convs {
			rep, resp := send(t, client, baseURL+"/v1/responses", responsesBody(t, c.instructions, c.input, nil))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("conversation %d turn %d: status %d", i, turn, resp.StatusCode)
			}
			if turn == 0 {
				c.home = rep.Upstream
			} else if rep.Upstream != c.home {
				t.Errorf("conversation %d turn %d served by %s, its first turn by %s", i, turn, rep.Upstream, c.home)
			}
			c.input = append(c.input,
				map[string]any{"type": "reasoning", "summary": []any{map[string]any{"type": "summary_text", "text": "Look it up."}}},
				map[string]any{"type": "function_call", "call_id": fmt.Sprint("c", turn), "name": "lookup", "arguments": `{"word":"why"}`},
				map[string]any{"type": "function_call_output", "call_id": fmt.Sprint("c", turn), "output": strings.Repeat("because. ", 30)},
				map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "answer " + strings.Repeat("so. ", 30)}}},
				map[string]any{"role": "user", "content": fmt.Sprintf("follow-up %d", turn)})
		}
	}

	// Server-side state: the follow-ups carry only their new input; the key routes them.
	var home string
	for turn := range 3 {
		extra := map[string]any{"prompt_cache_key": "conversation-with-state", "store": true}
		if turn > 0 {
			extra["previous_response_id"] = fmt.Sprint("resp_", turn)
		}
		rep, _ := send(t, client, baseURL+"/v1/responses", responsesBody(t, coldPrompt(turn), []any{map[string]any{"role": "user", "content": coldPrompt(100 + turn)}}, extra))
		if turn == 0 {
			home = rep.Upstream
		} else if rep.Upstream != home {
			t.Errorf("previous_response_id turn %d served by %s, its first turn by %s", turn, rep.Upstream, home)
		}
	}
}
