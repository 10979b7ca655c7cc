package llmreq

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// The payloads in testdata/sdk are the bodies the OpenAI Node SDK 6.49.0 and the Anthropic Node
// SDK 1.15.0 sent (Node 20), byte for byte, recorded by testdata/sdk/capture.mjs against a local
// server. The SDKs send keys in the order the caller wrote them: the chat payload has its tools
// after its messages, as the SDK's own examples write them.
var sdkTests = []struct {
	file string
	hint Format // from the path the SDK posted to (and Anthropic's anthropic-version header)
	want func(body []byte) Request
}{
	{"responses-turn1.json", Responses, func(b []byte) Request {
		return Request{Format: Responses, Model: "gpt-4.1-mini", MaxTokens: 256, Text: responsesTurn(b, 1)}
	}},
	{"responses-turn2.json", Responses, func(b []byte) Request {
		return Request{Format: Responses, Model: "gpt-4.1-mini", MaxTokens: 256, Text: responsesTurn(b, 2)}
	}},
	{"responses-turn3.json", Responses, func(b []byte) Request {
		return Request{Format: Responses, Model: "gpt-4.1-mini", MaxTokens: 256, Text: responsesTurn(b, 3)}
	}},
	{"responses-previous.json", Responses, func([]byte) Request {
		return Request{Format: Responses, Model: "gpt-4.1-mini", Session: "conv-7", PreviousResponseID: "resp_123", Text: msg("user", "And in Lyon?")}
	}},
	{"responses-string.json", Responses, func([]byte) Request {
		return Request{Format: Responses, Model: "gpt-4.1-mini", Stream: true, Text: msg("user", "Say hi.")}
	}},
	{"chat-tools-image.json", None, func(b []byte) Request {
		return Request{Format: Chat, Model: "gpt-4.1-mini", MaxTokens: 256, Text: msg("tools", rawAt(b, "tools")) +
			msg("system", "You are a helpful assistant.") +
			msg("user", question+"\n"+ph(rawAt(b, "messages", "1", "content", "1"))) +
			msg("assistant", `get_weather({"city":"Paris"})`) + msg("tool", weather)}
	}},
	{"anthropic-tools-image.json", Messages, func(b []byte) Request {
		return Request{Format: Messages, Model: "claude-sonnet-4-5", MaxTokens: 1024, Text: msg("system", "You are a helpful assistant.") +
			msg("tools", rawAt(b, "tools")) +
			msg("user", ph(rawAt(b, "messages", "0", "content", "0"))+"\n"+question) +
			msg("assistant", "Let me check.\n"+`get_weather({"city":"Paris"})`) + msg("user", weather)}
	}},
	{"anthropic-no-system.json", Messages, func([]byte) Request {
		return Request{Format: Messages, Model: "claude-sonnet-4-5", MaxTokens: 64, Text: msg("user", "Hi")}
	}},
}

const (
	question = "What is in this picture, and what is the weather in Paris?"
	weather  = `{"temp_c":18,"sky":"clear"}`
)

// responsesTurn is the routing text of the recorded Responses conversation after turn n.
func responsesTurn(b []byte, n int) string {
	text := msg("system", "You are a helpful assistant.") + msg("tools", rawAt(b, "tools")) +
		msg("user", question+"\n"+ph(rawAt(b, "input", "0", "content", "1")))
	if n >= 2 {
		text += msg("reasoning", "The user wants the weather; call the tool.") +
			msg("assistant", `get_weather({"city":"Paris"})`) + msg("tool", weather)
	}
	if n >= 3 {
		text += msg("assistant", "A red pixel. Paris: 18 °C and clear.") + msg("user", "And in Lyon?")
	}
	return text
}

// rawAt returns the JSON of the value at path (object keys, array indexes) as written in body.
func rawAt(body []byte, path ...string) string {
	raw := json.RawMessage(body)
	for _, k := range path {
		if raw[0] == '[' {
			var a []json.RawMessage
			json.Unmarshal(raw, &a)
			i := int(k[0] - '0')
			raw = a[i]
			continue
		}
		var m map[string]json.RawMessage
		json.Unmarshal(raw, &m)
		raw = m[k]
	}
	return string(raw)
}

func sdkBody(t testing.TB, file string) []byte {
	b, err := os.ReadFile(filepath.Join("testdata", "sdk", file))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSDKPayloads(t *testing.T) {
	for _, tt := range sdkTests {
		t.Run(tt.file, func(t *testing.T) {
			body := sdkBody(t, tt.file)
			want := tt.want(body)
			want.Runes = utf8.RuneCountInString(want.Text)
			if got := ParseAs(body, false, tt.hint); got != want {
				t.Errorf("ParseAs(%s, %v)\n got %s\nwant %s", tt.file, tt.hint, show(got), show(want))
			}
			if ref, ok := refParseAs(body, tt.hint); !ok || ref != want {
				t.Errorf("reference: %s", show(ref))
			}
		})
	}
	// Without the path, what the fields alone tell.
	for file, want := range map[string]Format{
		"responses-turn1.json":     Responses, // instructions, max_output_tokens
		"responses-previous.json":  Responses, // previous_response_id
		"responses-string.json":    None,      // {"model","input","stream"}: embeddings look alike
		"anthropic-no-system.json": Chat,
	} {
		if got := Parse(sdkBody(t, file), false).Format; got != want {
			t.Errorf("Parse(%s) without a hint: %v, want %v", file, got, want)
		}
	}
}

func TestHint(t *testing.T) {
	for _, tt := range []struct {
		path   string
		header string
		want   Format
	}{
		{"/v1/messages", "", Messages},
		{"/anthropic/v1/messages/", "", Messages},
		{"/v1/chat/completions", "2023-06-01", Messages},
		{"/v1/responses", "", Responses},
		{"/openai/v1/responses", "", Responses},
		{"/v1/chat/completions", "", None},
		{"/v1/messages/count_tokens", "", None},
		{"/v1/responses/resp_1/cancel", "", None},
	} {
		r := httptest.NewRequest(http.MethodPost, tt.path, nil)
		if tt.header != "" {
			r.Header.Set("Anthropic-Version", tt.header)
		}
		if got := Hint(r); got != tt.want {
			t.Errorf("Hint(%s, anthropic-version %q) = %v, want %v", tt.path, tt.header, got, tt.want)
		}
	}
}

// TestSDKTurnPrefix: each recorded Responses turn's text extends the previous turn's.
func TestSDKTurnPrefix(t *testing.T) {
	prev := ""
	for i := 1; i <= 3; i++ {
		got := ParseAs(sdkBody(t, "responses-turn"+string(rune('0'+i))+".json"), false, Responses)
		if !strings.HasPrefix(got.Text, prev) || len(got.Text) <= len(prev) {
			t.Fatalf("turn %d: text %q does not extend turn %d's %q", i, got.Text, i-1, prev)
		}
		prev = got.Text
	}
}

// pngData returns a base64 "image" of n bytes that differs for every seed.
func pngData(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n*3/4)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return base64.StdEncoding.EncodeToString(b)
}

// toolConversations returns the bodies of one conversation after each turn, through chat,
// Anthropic messages and Responses: tools ahead of the conversation, and an image in every user
// turn. Keys come in the order of the routing text, as the prefix promise for cut bodies needs.
func toolConversations(turns, imageBytes int) (chat, anthropic, responses [][]byte) {
	type body struct {
		Model        string `json:"model"`
		System       string `json:"system,omitempty"`
		Instructions string `json:"instructions,omitempty"`
		Tools        any    `json:"tools"`
		Messages     any    `json:"messages,omitempty"`
		Input        any    `json:"input,omitempty"`
	}
	params := map[string]any{"type": "object", "properties": map[string]any{"n": map[string]string{"type": "integer"}}}
	chatTools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "square", "description": "n²", "parameters": params}}}
	antTools := []any{map[string]any{"name": "square", "description": "n²", "input_schema": params}}
	respTools := []any{map[string]any{"type": "function", "name": "square", "description": "n²", "parameters": params}}
	const sys = "You are exact."
	oai := []any{map[string]any{"role": "system", "content": sys}}
	var ant, resp []any
	for i := range turns {
		img := pngData(uint64(i), imageBytes)
		q := "Question " + string(rune('0'+i)) + ": what is \"this\" squared? 🎉"
		oai = append(oai, map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": q},
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64," + img}},
		}})
		ant = append(ant, map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/png", "data": img}},
			map[string]any{"type": "text", "text": q},
		}})
		resp = append(resp, map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "input_text", "text": q},
			map[string]any{"type": "input_image", "image_url": "data:image/png;base64," + img},
		}})
		b, _ := json.Marshal(body{Model: "m", Tools: chatTools, Messages: oai})
		chat = append(chat, b)
		b, _ = json.Marshal(body{Model: "m", System: sys, Tools: antTools, Messages: ant})
		anthropic = append(anthropic, b)
		b, _ = json.Marshal(body{Model: "m", Instructions: sys, Tools: respTools, Input: resp})
		responses = append(responses, b)
		args := `{"n":` + string(rune('0'+i)) + `}`
		oai = append(oai,
			map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "c", "type": "function", "function": map[string]any{"name": "square", "arguments": args}}}},
			map[string]any{"role": "tool", "tool_call_id": "c", "content": "81"},
			map[string]any{"role": "assistant", "content": "It is 81."})
		ant = append(ant,
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": "t", "name": "square", "input": map[string]int{"n": i}}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "t", "content": "81"}}},
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": "It is 81."}}})
		resp = append(resp,
			map[string]any{"type": "reasoning", "summary": []any{map[string]any{"type": "summary_text", "text": "Use the tool."}}},
			map[string]any{"type": "function_call", "call_id": "c", "name": "square", "arguments": args},
			map[string]any{"type": "function_call_output", "call_id": "c", "output": "81"},
			map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "It is 81."}}})
	}
	return chat, anthropic, responses
}

// TestToolTurnPrefix: with tools and images, turn n+1's text starts with turn n's for chat,
// Anthropic and Responses, and every cut of every turn's body gives a prefix of its text.
func TestToolTurnPrefix(t *testing.T) {
	chat, anthropic, responses := toolConversations(5, 3000)
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct {
		name   string
		bodies [][]byte
		format Format
	}{{"chat", chat, Chat}, {"anthropic", anthropic, Messages}, {"responses", responses, Responses}} {
		prev := ""
		for i, body := range c.bodies {
			got := Parse(body, false)
			if got.Format != c.format || !strings.HasPrefix(got.Text, prev) || len(got.Text) <= len(prev) {
				t.Fatalf("%s turn %d: %v text %q does not extend turn %d's %q", c.name, i, got.Format, got.Text, i-1, prev)
			}
			if !strings.Contains(got.Text, "tools\x1f[{") || !strings.Contains(got.Text, "\uFFFC") {
				t.Fatalf("%s turn %d: no tools or image in %q", c.name, i, got.Text)
			}
			if ref, ok := refParse(body); !ok || ref != got {
				t.Fatalf("%s turn %d: reference %s, got %s", c.name, i, show(ref), show(got))
			}
			for range 50 {
				cut := r.IntN(len(body) + 1)
				part := Parse(body[:cut], true)
				if !strings.HasPrefix(got.Text, part.Text) {
					t.Fatalf("%s turn %d cut at %d: %q is not a prefix of %q", c.name, i, cut, part.Text, got.Text)
				}
			}
			prev = got.Text
		}
	}
}

// TestImageWeight: an image weighs in the text what it costs to prefill, the same image
// followed by different questions shares all of it, and a different image of the same size
// shares (practically) nothing.
func TestImageWeight(t *testing.T) {
	const size = 400 << 10
	body := func(img, q string) []byte {
		b, _ := json.Marshal(map[string]any{"input": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "input_image", "image_url": "data:image/jpeg;base64," + img},
			map[string]any{"type": "input_text", "text": q}}}}})
		return b
	}
	a, b := pngData(1, size), pngData(2, size)
	first := Parse(body(a, "What is this?"), false)
	same := Parse(body(a, "Who took it?"), false)
	other := Parse(body(b, "What is this?"), false)
	weight := size / bytesPerChar
	if first.Runes < weight || first.Runes > weight+100 {
		t.Errorf("a %d-byte image gives %d chars, want about %d", size, first.Runes, weight)
	}
	if n := commonPrefix(first.Text, same.Text); n < weight {
		t.Errorf("same image, other question: %d chars in common, want at least %d", n, weight)
	}
	if n := commonPrefix(first.Text, other.Text); n > len("user\x1f\uFFFC")+4 {
		t.Errorf("another image of the same size: %d bytes in common", n)
	}
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// TestParseAsFieldsDecide: a hint labels, it does not turn a body into another format.
func TestParseAsFieldsDecide(t *testing.T) {
	chat := []byte(`{"messages":[{"role":"user","content":"x"}]}`)
	if got := ParseAs(chat, false, Responses).Format; got != Chat {
		t.Errorf("chat body sent to /v1/responses: %v, want %v", got, Chat)
	}
	if got := ParseAs(chat, false, Messages).Format; got != Messages {
		t.Errorf("chat body sent to /v1/messages: %v, want %v", got, Messages)
	}
	emb := []byte(`{"model":"e","input":"x"}`)
	if got := ParseAs(emb, false, Messages); got.Format != None || got.Text != "" {
		t.Errorf("embeddings body with a Messages hint: %s", show(got))
	}
	if got := ParseAs(bytes.Clone(emb), false, Responses); got.Format != Responses || got.Text != msg("user", "x") {
		t.Errorf("the same body sent to /v1/responses: %s", show(got))
	}
}
