package workload

import (
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestChatWorkloadShape(t *testing.T) {
	cfg := ChatConfig{Conversations: 10, SystemPrompts: 3, Turns: 4, SessionHeader: "X-Session-ID", Seed: 7}
	w := ChatWorkload(cfg)
	if w.Name != "chat" || len(w.Sessions) != 10 || w.Calls() != 40 {
		t.Fatalf("name %q, %d sessions, %d calls", w.Name, len(w.Sessions), w.Calls())
	}
	systems := map[string]bool{}
	ids := map[string]bool{}
	for _, s := range w.Sessions {
		ids[s.ID] = true
		var prevAt time.Duration = -1
		for turn, c := range s.Calls {
			if c.API != APIChat || c.Model != DefaultChat.Model || c.Headers["X-Session-ID"] != s.ID {
				t.Fatalf("call %+v", c)
			}
			if len(c.Messages) != 2+2*turn || c.Messages[0].Role != "system" || c.Messages[len(c.Messages)-1].Role != "user" {
				t.Fatalf("turn %d: %d messages", turn, len(c.Messages))
			}
			if n := len(c.Messages[0].Content); n < 2000 || n > 4000 {
				t.Errorf("system prompt of %d chars", n)
			}
			if n := len(c.Messages[len(c.Messages)-1].Content); n < 200 || n > 600 {
				t.Errorf("user message of %d chars", n)
			}
			if c.At <= prevAt {
				t.Errorf("turn %d At %v not after %v", turn, c.At, prevAt)
			}
			prevAt = c.At
			if turn+1 < len(s.Calls) {
				next := s.Calls[turn+1].Messages
				if !slices.Equal(next[:len(c.Messages)], c.Messages) {
					t.Fatalf("turn %d's messages are not resent by turn %d", turn, turn+1)
				}
				reply := next[len(c.Messages)]
				if reply.Role != "assistant" || len(reply.Content) != c.MaxTokens*CharsPerToken {
					t.Errorf("reply of %d chars for max_tokens %d", len(reply.Content), c.MaxTokens)
				}
			}
		}
		systems[s.Calls[0].Messages[0].Content] = true
	}
	if len(systems) < 2 || len(systems) > 3 {
		t.Errorf("%d distinct system prompts, want 2-3", len(systems))
	}
	if len(ids) != 10 {
		t.Errorf("%d distinct session ids", len(ids))
	}
}

func TestChatWorkloadSeed(t *testing.T) {
	a := ChatWorkload(ChatConfig{Conversations: 5, Seed: 1})
	b := ChatWorkload(ChatConfig{Conversations: 5, Seed: 1})
	c := ChatWorkload(ChatConfig{Conversations: 5, Seed: 2})
	if !reflect.DeepEqual(a, b) {
		t.Error("same seed, different workloads")
	}
	if reflect.DeepEqual(a.Sessions[0].Calls[0].Messages, c.Sessions[0].Calls[0].Messages) {
		t.Error("different seeds, same first call")
	}
	if a.Sessions[0].Calls[0].Headers != nil {
		t.Error("headers without SessionHeader")
	}
}

func TestCallBody(t *testing.T) {
	reqs := []Request{{Timestamp: 3 * time.Second, InputLength: 600, OutputLength: 0, HashIDs: []int{4, 5}}}
	tests := []struct {
		name   string
		call   Call
		stream bool
		want   map[string]any
	}{
		{"chat streamed", Call{API: APIChat, Model: "m", Messages: []Message{{"user", "a<b"}}, MaxTokens: 9}, true,
			map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "a<b"}},
				"max_tokens": 9.0, "stream": true, "stream_options": map[string]any{"include_usage": true}}},
		{"completions", Call{API: APICompletions, Prompt: "p", MaxTokens: 1}, false,
			map[string]any{"prompt": "p", "max_tokens": 1.0}},
		{"mooncake as completions", MooncakeWorkload(reqs, MooncakeConfig{}).Sessions[0].Calls[0], false,
			map[string]any{"prompt": reqs[0].Prompt(), "max_tokens": 1.0}},
		{"mooncake as chat", MooncakeWorkload(reqs, MooncakeConfig{API: APIChat, Model: "x"}).Sessions[0].Calls[0], false,
			map[string]any{"model": "x", "messages": []any{map[string]any{"role": "user", "content": reqs[0].Prompt()}}, "max_tokens": 1.0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.call.Body(tt.stream)
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("body %s\nwant %v", b, tt.want)
			}
			if strings.Contains(string(b), `\u003c`) {
				t.Error("HTML-escaped body")
			}
		})
	}
}

func TestMooncakeWorkload(t *testing.T) {
	reqs := []Request{
		{Timestamp: 0, InputLength: 700, OutputLength: 50, HashIDs: []int{1, 2}},
		{Timestamp: 40 * time.Millisecond, InputLength: 100, OutputLength: 5, HashIDs: []int{1}},
	}
	w := MooncakeWorkload(reqs, MooncakeConfig{MaxTokens: 10})
	if w.Name != "mooncake" || len(w.Sessions) != 2 || w.Calls() != 2 {
		t.Fatalf("%+v", w)
	}
	c := w.Sessions[1].Calls[0]
	if c.API != APICompletions || c.At != 40*time.Millisecond || c.MaxTokens != 5 || w.Sessions[0].Calls[0].MaxTokens != 10 {
		t.Errorf("call %+v", c)
	}
	r := c.Resolve()
	if r.Trace != nil || r.Prompt != reqs[1].Prompt() || len(r.Prompt) != 400 {
		t.Errorf("resolved prompt of %d chars", len(r.Prompt))
	}
	if got := w.Limit(1); len(got.Sessions) != 1 || len(w.Limit(0).Sessions) != 2 {
		t.Error("Limit")
	}
}

// With PromptZipf the first system prompt draws the most conversations: with 16 prompts and
// exponent 1.3, about 40% (1/H(16, 1.3) = 0.401), and each next one fewer.
func TestChatPromptZipf(t *testing.T) {
	w := ChatWorkload(ChatConfig{Conversations: 4000, SystemPrompts: 16, Turns: 1, PromptZipf: 1.3, Seed: 3})
	first := map[string]int{}
	for _, s := range w.Sessions {
		first[s.Calls[0].Messages[0].Content]++
	}
	counts := make([]int, 16)
	for p, n := range first {
		k := 0
		for k < 16 && !strings.HasPrefix(p, "You are assistant "+strconv.Itoa(k)+". ") {
			k++
		}
		if k == 16 {
			t.Fatalf("prompt %.30q names no assistant", p)
		}
		counts[k] = n
	}
	if share := float64(counts[0]) / 4000; share < 0.37 || share > 0.43 {
		t.Errorf("the first prompt draws %.3f of the conversations, want about 0.40 (counts %v)", share, counts)
	}
	if !(counts[0] > counts[1] && counts[1] > counts[3] && counts[3] > counts[15]) {
		t.Errorf("counts do not fall with the rank: %v", counts)
	}
	// Uniform without it: the first prompt near 1/16.
	w = ChatWorkload(ChatConfig{Conversations: 4000, SystemPrompts: 16, Turns: 1, Seed: 3})
	n := 0
	for _, s := range w.Sessions {
		if strings.HasPrefix(s.Calls[0].Messages[0].Content, "You are assistant 0. ") {
			n++
		}
	}
	if share := float64(n) / 4000; share > 0.09 {
		t.Errorf("uniform: the first prompt draws %.3f", share)
	}
}
