package llmsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// apiRequest is the part of an OpenAI chat or completions request the simulator reads.
type apiRequest struct {
	Model               string          `json:"model"`
	Messages            []apiMessage    `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type apiMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// job is a parsed request: what the simulation needs.
type job struct {
	chat         bool
	model        string
	text         string // the prompt text the cache sees
	maxTokens    int
	stream       bool
	includeUsage bool
}

// parseJob decodes a chat (chat == true) or completions request body.
func parseJob(body []byte, chat bool, defaultMaxTokens int) (job, error) {
	var req apiRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return job{}, fmt.Errorf("invalid JSON body: %w", err)
	}
	j := job{chat: chat, model: req.Model, stream: req.Stream, maxTokens: defaultMaxTokens}
	j.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	switch {
	case req.MaxCompletionTokens != nil:
		j.maxTokens = *req.MaxCompletionTokens
	case req.MaxTokens != nil:
		j.maxTokens = *req.MaxTokens
	}
	if j.maxTokens < 1 {
		return job{}, errors.New("max_tokens must be at least 1")
	}
	if chat {
		if len(req.Messages) == 0 {
			return job{}, errors.New("messages: at least one message is required")
		}
		msgs := make([]Message, len(req.Messages))
		for i, m := range req.Messages {
			text, err := contentText(m.Content)
			if err != nil {
				return job{}, fmt.Errorf("messages[%d].content: %w", i, err)
			}
			msgs[i] = Message{Role: m.Role, Content: text}
		}
		j.text = ChatText(msgs)
		return j, nil
	}
	text, err := promptText(req.Prompt)
	if err != nil {
		return job{}, fmt.Errorf("prompt: %w", err)
	}
	if text == "" {
		return job{}, errors.New("prompt: must not be empty")
	}
	j.text = text
	return j, nil
}

// contentText returns a message's text: a string, or the text parts of an array; null is "".
func contentText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or an array of content parts")
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			sb.WriteString(p.Text)
		}
	}
	return sb.String(), nil
}

// promptText returns a completions prompt: a string, or an array of strings joined by newlines.
func promptText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", errors.New("must be a string or an array of strings")
	}
	return strings.Join(list, "\n"), nil
}

// Usage is the usage object of a response, with vLLM's cached-token detail.
type Usage struct {
	PromptTokens        int                 `json:"prompt_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	PromptTokensDetails PromptTokensDetails `json:"prompt_tokens_details"`
}

// PromptTokensDetails reports the prompt tokens served from the prefix cache.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type chatMessage struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

// choice is a choice of any response or chunk; the fields that do not apply are omitted.
type choice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatMessage `json:"delta,omitempty"`
	Text         *string      `json:"text,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
}

type response struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []choice `json:"choices"`
	Usage   *Usage   `json:"usage,omitempty"`
}

type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}
