package llmsim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

type responsesReply struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Status string `json:"status"`
	Output []struct {
		Type    string `json:"type"`
		Role    string `json:"role"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage struct {
		InputTokens        int `json:"input_tokens"`
		OutputTokens       int `json:"output_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	} `json:"usage"`
}

// TestResponsesHitsGrowAcrossTurns: a Responses conversation (instructions, tools, then input
// items that grow by the model's function call, its output and the answer) hits the blocks
// of its earlier turns, and the reply is a Responses object.
func TestResponsesHitsGrowAcrossTurns(t *testing.T) {
	_, ts := startServer(t, fast)
	tools := []any{map[string]any{"type": "function", "name": "lookup", "parameters": map[string]any{"type": "object"}}}
	input := []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": strings.Repeat("why? ", 200)}}}}
	prevCached, prevPrompt := -1, 0
	for turn := range 3 {
		resp := post(t, ts.URL+"/v1/responses", map[string]any{"model": DefaultModel,
			"instructions": strings.Repeat("Answer briefly. ", 40), "tools": tools, "input": input, "max_output_tokens": 16})
		r := decode[responsesReply](t, resp)
		if r.Object != "response" || !strings.HasPrefix(r.ID, "resp_") || len(r.Output) != 1 || r.Output[0].Role != "assistant" ||
			len(r.Output[0].Content) != 1 || r.Output[0].Content[0].Type != "output_text" || len(r.Output[0].Content[0].Text) != 16*CharsPerToken {
			t.Fatalf("turn %d: reply %+v", turn, r)
		}
		cached := r.Usage.InputTokensDetails.CachedTokens
		if r.Usage.OutputTokens != 16 || r.Usage.InputTokens <= prevPrompt {
			t.Errorf("turn %d: usage %+v after a %d-token turn", turn, r.Usage, prevPrompt)
		}
		if turn > 0 && (cached <= prevCached || cached < prevPrompt/DefaultBlockTokens*DefaultBlockTokens) {
			t.Errorf("turn %d: %d cached tokens; turn %d had %d cached of %d", turn, cached, turn-1, prevCached, prevPrompt)
		}
		input = append(input,
			map[string]any{"type": "function_call", "call_id": fmt.Sprint("c", turn), "name": "lookup", "arguments": `{"q":"why"}`},
			map[string]any{"type": "function_call_output", "call_id": fmt.Sprint("c", turn), "output": "because"},
			map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": r.Output[0].Content[0].Text}}},
			map[string]any{"role": "user", "content": fmt.Sprintf("and then %d?", turn)})
		prevCached, prevPrompt = cached, r.Usage.InputTokens
	}
}

func TestResponsesBadRequests(t *testing.T) {
	_, ts := startServer(t, fast)
	for _, body := range []map[string]any{
		{"model": DefaultModel},
		{"model": DefaultModel, "input": 5},
		{"model": DefaultModel, "input": "x", "max_output_tokens": 0},
		{"model": DefaultModel, "input": []any{map[string]any{"role": "user", "content": 5}}},
	} {
		resp := post(t, ts.URL+"/v1/responses", body)
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("%v: status %d, want 400", body, resp.StatusCode)
		}
	}
}

// TestResponsesStream: the events of a streamed Responses reply, in order, carry the reply.
func TestResponsesStream(t *testing.T) {
	cfg := Config{Name: "s", PrefillPerToken: -1, StepFixed: time.Millisecond, PerSeq: -1, MinEventInterval: -1}
	_, ts := startServer(t, cfg)
	resp := post(t, ts.URL+"/v1/responses", map[string]any{"model": DefaultModel, "input": "Say hi.", "max_output_tokens": 5, "stream": true})
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	var events []string
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type     string `json:"type"`
			Seq      int    `json:"sequence_number"`
			Delta    string `json:"delta"`
			Response struct {
				Status string `json:"status"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil || ev.Seq != len(events) {
			t.Fatalf("event %d: %s (%v)", len(events), data, err)
		}
		events = append(events, ev.Type)
		text.WriteString(ev.Delta)
	}
	want := []string{"response.created", "response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.delta", "response.output_text.delta", "response.incomplete"}
	if strings.Join(events, " ") != strings.Join(want, " ") || text.Len() != 5*CharsPerToken {
		t.Errorf("events %v with %d chars of text, want %v with %d", events, text.Len(), want, 5*CharsPerToken)
	}
}
