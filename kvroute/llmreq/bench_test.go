package llmreq

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

var words = strings.Fields(`the a of to and in is that for it as with was on be by this are or from at
which an have not they but their has more one can all were other been its also when there if than
model cache request server token prompt context memory latency throughput user assistant system
answer question example function result value error data table file code line number string list`)

// prose returns n bytes or so of English-like text with the escapes chat bodies carry: line
// breaks, quotes, a tab, and now and then a non-ASCII character.
func prose(r *rand.Rand, n int) string {
	var sb strings.Builder
	for sb.Len() < n {
		sentence := 6 + r.IntN(14)
		for i := range sentence {
			w := words[r.IntN(len(words))]
			switch {
			case i == 0:
				w = strings.ToUpper(w[:1]) + w[1:]
			case r.IntN(40) == 0:
				w = `"` + w + `"`
			case r.IntN(60) == 0:
				w = "café"
			case r.IntN(200) == 0:
				w = "naïve — 🙂"
			}
			if i > 0 {
				sb.WriteByte(' ')
			}
			sb.WriteString(w)
		}
		sb.WriteByte('.')
		switch r.IntN(8) {
		case 0:
			sb.WriteString("\n\n")
		case 1:
			sb.WriteString("\n\t- ")
		default:
			sb.WriteByte(' ')
		}
	}
	return sb.String()
}

// chatBody returns an OpenAI chat body (or an Anthropic one, with content blocks) of about size
// bytes: a system prompt and alternating turns.
func chatBody(size int, anthropic bool) []byte {
	r := rand.New(rand.NewPCG(uint64(size), 7))
	type block struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	type message struct { // clients write the role first
		Role    string `json:"role"`
		Content any    `json:"content"`
	}
	body := map[string]any{"model": "llama-3.1-8b-instruct", "max_tokens": 512, "stream": true, "temperature": 0.7}
	var msgs []message
	system := prose(r, 600)
	if anthropic {
		body["system"] = system
	} else {
		msgs = append(msgs, message{"system", system})
	}
	for i := 0; ; i++ {
		role := []string{"user", "assistant"}[i%2]
		text := prose(r, 200+r.IntN(1200))
		var content any = text
		if anthropic {
			content = []block{{"text", text}}
		}
		msgs = append(msgs, message{role, content})
		body["messages"] = msgs
		b, _ := json.Marshal(body)
		if len(b) >= size {
			return b
		}
	}
}

// responsesBody returns an OpenAI Responses body of about size bytes, as the OpenAI SDK writes
// it: instructions, six function tools with JSON Schema parameters (some 4.5 KB), then user
// messages and assistant output_text messages in turn. With chat, it is the same conversation
// as a chat body: the tools as chat tools, the instructions as a system message, the assistant
// turns as text parts.
func responsesBody(size int, chat bool) []byte {
	r := rand.New(rand.NewPCG(uint64(size), 9))
	type item struct {
		Type    string `json:"type,omitempty"`
		Role    string `json:"role"`
		Content any    `json:"content"`
	}
	type part struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Annotations []any  `json:"annotations"`
	}
	var tools []any
	for i := range 6 {
		fn := map[string]any{
			"name": fmt.Sprintf("tool_%d", i), "description": prose(r, 300), "strict": false,
			"parameters": map[string]any{"type": "object", "required": []string{"query"}, "properties": map[string]any{
				"query": map[string]any{"type": "string", "description": prose(r, 80)},
				"limit": map[string]any{"type": "integer", "minimum": 1, "maximum": 100},
				"mode":  map[string]any{"type": "string", "enum": []string{"fast", "exact", "fuzzy"}},
			}},
		}
		if chat {
			tools = append(tools, map[string]any{"type": "function", "function": fn})
		} else {
			fn["type"] = "function"
			tools = append(tools, fn)
		}
	}
	instructions := prose(r, 600)
	body := map[string]any{"model": "gpt-4.1", "instructions": instructions, "tools": tools, "max_output_tokens": 512, "stream": true}
	var input []item
	if chat {
		body = map[string]any{"model": "gpt-4.1", "tools": tools, "max_tokens": 512, "stream": true}
		input = append(input, item{Role: "system", Content: instructions})
	}
	for i := 0; ; i++ {
		text := prose(r, 200+r.IntN(1200))
		switch {
		case i%2 == 0:
			input = append(input, item{Role: "user", Content: text})
		case chat:
			input = append(input, item{Role: "assistant", Content: []map[string]string{{"type": "text", "text": text}}})
		default:
			input = append(input, item{Type: "message", Role: "assistant", Content: []part{{"output_text", text, []any{}}}})
		}
		if chat {
			body["messages"] = input
		} else {
			body["input"] = input
		}
		b, _ := json.Marshal(body)
		if len(b) >= size {
			return b
		}
	}
}

func BenchmarkParse(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	completion, _ := json.Marshal(map[string]any{"model": "m", "prompt": prose(r, 64<<10), "max_tokens": 16})
	for _, bm := range []struct {
		name      string
		body      []byte
		truncated bool
	}{
		{"chat/4KiB", chatBody(4<<10, false), false},
		{"chat/64KiB", chatBody(64<<10, false), false},
		{"chat/64KiB-truncated", chatBody(128<<10, false)[:64<<10], true},
		{"anthropic/64KiB", chatBody(64<<10, true), false},
		{"completion/64KiB", completion, false},
		{"responses-tools/64KiB", responsesBody(64<<10, false), false},
		{"chat-tools/64KiB", responsesBody(64<<10, true), false},
	} {
		if Parse(bm.body, bm.truncated).Format == None {
			b.Fatalf("%s: not parsed", bm.name)
		}
		b.Run(bm.name, func(b *testing.B) {
			b.SetBytes(int64(len(bm.body)))
			b.ReportAllocs()
			for b.Loop() {
				Parse(bm.body, bm.truncated)
			}
		})
	}
}

func BenchmarkReadBody(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		benchmarkReadBody(b, size)
	}
}

func benchmarkReadBody(b *testing.B, size int) {
	body := chatBody(size, false)
	for _, cl := range []int64{int64(len(body)), -1} {
		b.Run(fmt.Sprintf("%dKiB/content-length=%d", size>>10, cl), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			src := bytes.NewReader(body)
			for b.Loop() {
				src.Reset(body)
				r.Body, r.ContentLength = io.NopCloser(src), cl
				if _, _, err := ReadBody(r, 4<<20); err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, r.Body)
			}
		})
	}
}
