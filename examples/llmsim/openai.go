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
	KVTransferParams *kvParams `json:"kv_transfer_params"`
	// SGLang's bootstrap fields (pd_sglang.go).
	BootstrapHost json.RawMessage `json:"bootstrap_host"`
	BootstrapPort json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom json.RawMessage `json:"bootstrap_room"`
}

type apiMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// job is a parsed request: what the simulation needs.
type job struct {
	chat         bool
	responses    bool // an OpenAI Responses request (chat is false)
	model        string
	text         string // the prompt text the cache sees
	maxTokens    int
	stream       bool
	includeUsage bool
	kv           *kvParams  // vLLM's kv_transfer_params (prefill/decode disaggregation)
	boot         *bootstrap // SGLang's bootstrap fields
	bootErr      error      // malformed bootstrap fields
}

// parseJob decodes a chat (chat == true) or completions request body.
func parseJob(body []byte, chat bool, defaultMaxTokens int) (job, error) {
	var req apiRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return job{}, fmt.Errorf("invalid JSON body: %w", err)
	}
	j := job{chat: chat, model: req.Model, stream: req.Stream, maxTokens: defaultMaxTokens, kv: req.KVTransferParams}
	j.boot, j.bootErr = parseBootstrap(req.BootstrapHost, req.BootstrapPort, req.BootstrapRoom)
	if j.kv != nil && j.kv.DoRemoteDecode && (j.stream || req.StreamOptions != nil) {
		return job{}, errors.New("a prefill request (kv_transfer_params.do_remote_decode) must not stream")
	}
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
		switch p.Type {
		case "text", "input_text", "output_text": // chat; Responses
			sb.WriteString(p.Text)
		}
	}
	return sb.String(), nil
}

// responsesRequest is the part of an OpenAI Responses request the simulator reads.
type responsesRequest struct {
	Model           string          `json:"model"`
	Instructions    string          `json:"instructions"`
	Tools           json.RawMessage `json:"tools"`
	Input           json.RawMessage `json:"input"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	Stream          bool            `json:"stream"`
}

// responsesItem is an input item: a message, a function call or a function call's output.
type responsesItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// parseResponsesJob decodes a Responses request body into the messages a chat template would
// render: the instructions as a system message, the tools, then the input (a string is one user
// message; function calls and outputs read as assistant and tool messages; reasoning items, which
// engines do not prefill again, are left out).
func parseResponsesJob(body []byte, defaultMaxTokens int) (job, error) {
	var req responsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return job{}, fmt.Errorf("invalid JSON body: %w", err)
	}
	j := job{responses: true, model: req.Model, stream: req.Stream, maxTokens: defaultMaxTokens}
	if req.MaxOutputTokens != nil {
		j.maxTokens = *req.MaxOutputTokens
	}
	if j.maxTokens < 1 {
		return job{}, errors.New("max_output_tokens must be at least 1")
	}
	var msgs []Message
	if req.Instructions != "" {
		msgs = append(msgs, Message{Role: "system", Content: req.Instructions})
	}
	if tools := bytes.TrimSpace(req.Tools); len(tools) > 0 && !bytes.Equal(tools, []byte("null")) {
		msgs = append(msgs, Message{Role: "tools", Content: string(tools)})
	}
	input := bytes.TrimSpace(req.Input)
	switch {
	case len(input) > 0 && input[0] == '"':
		var s string
		if err := json.Unmarshal(input, &s); err != nil {
			return job{}, fmt.Errorf("input: %w", err)
		}
		msgs = append(msgs, Message{Role: "user", Content: s})
	case len(input) > 0 && input[0] == '[':
		var items []responsesItem
		if err := json.Unmarshal(input, &items); err != nil {
			return job{}, errors.New("input: must be a string or an array of input items")
		}
		for i, it := range items {
			switch it.Type {
			case "", "message":
				text, err := contentText(it.Content)
				if err != nil {
					return job{}, fmt.Errorf("input[%d].content: %w", i, err)
				}
				msgs = append(msgs, Message{Role: it.Role, Content: text})
			case "function_call":
				msgs = append(msgs, Message{Role: "assistant", Content: it.Name + "(" + it.Arguments + ")"})
			case "function_call_output":
				text, err := contentText(it.Output)
				if err != nil {
					return job{}, fmt.Errorf("input[%d].output: %w", i, err)
				}
				msgs = append(msgs, Message{Role: "tool", Content: text})
			}
		}
	default:
		return job{}, errors.New("input: a string or an array of input items is required")
	}
	j.text = ChatText(msgs)
	return j, nil
}

// responsesResponse is a Responses API response object, with the usage fields clients read.
type responsesResponse struct {
	ID        string           `json:"id"`
	Object    string           `json:"object"`
	CreatedAt int64            `json:"created_at"`
	Status    string           `json:"status"`
	Model     string           `json:"model"`
	Output    []responsesOut   `json:"output"`
	Usage     *responsesUsage  `json:"usage,omitempty"`
	Details   *incompleteCause `json:"incomplete_details"`
}

type responsesOut struct {
	Type    string            `json:"type"`
	ID      string            `json:"id"`
	Status  string            `json:"status"`
	Role    string            `json:"role"`
	Content []responsesOutput `json:"content"`
}

type responsesOutput struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type incompleteCause struct {
	Reason string `json:"reason"`
}

type responsesUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens int `json:"output_tokens"`
	TotalTokens  int `json:"total_tokens"`
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
	// KVTransferParams: a prefill worker's handover to the decode worker.
	KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
}

type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}
