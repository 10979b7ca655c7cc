package workload

import (
	"bytes"
	"encoding/json"
	"time"
)

// API is the OpenAI endpoint a call goes to.
type API string

const (
	APIChat        API = "chat"        // POST /v1/chat/completions
	APICompletions API = "completions" // POST /v1/completions
)

// Path returns the API's URL path.
func (a API) Path() string {
	if a == APICompletions {
		return "/v1/completions"
	}
	return "/v1/chat/completions"
}

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Call is one request of a workload.
type Call struct {
	API       API
	Model     string
	Messages  []Message // APIChat
	Prompt    string    // APICompletions
	MaxTokens int
	// Trace, when set, holds the call's prompt instead of Messages or Prompt: Resolve builds
	// the text from it. A Mooncake trace's prompts take hundreds of MB as text, so they are
	// built when sent.
	Trace *Request
	// At is the earliest time the call may be sent, from the start of the replay (open loop);
	// a call also waits for the previous call of its session to finish.
	At time.Duration
	// Headers are sent with the call (X-Session-ID, for example).
	Headers map[string]string
}

// Session is a sequence of calls sent one after the other: a conversation's turns, or a
// single request of a trace.
type Session struct {
	ID    string
	Calls []Call
	// Class names the class of clients the session belongs to in a workload of several
	// (TwoClass: "light", "heavy", ...); "" in a workload of one.
	Class string
}

// Workload is a named set of sessions.
type Workload struct {
	Name     string
	Sessions []Session
}

// Calls returns the number of calls in the workload.
func (w Workload) Calls() int {
	n := 0
	for _, s := range w.Sessions {
		n += len(s.Calls)
	}
	return n
}

// Limit returns the workload's first n sessions (all when n <= 0 or n is larger).
func (w Workload) Limit(n int) Workload {
	if n > 0 && n < len(w.Sessions) {
		w.Sessions = w.Sessions[:n]
	}
	return w
}

// Resolve returns the call with its text in Messages (APIChat) or Prompt (APICompletions),
// built from Trace when there is one.
func (c Call) Resolve() Call {
	if c.Trace == nil {
		return c
	}
	text := c.Trace.Prompt()
	c.Trace = nil
	if c.API == APICompletions {
		c.Prompt = text
	} else {
		c.Messages = []Message{{Role: "user", Content: text}}
	}
	return c
}

// Body returns the call's JSON request body. A streamed call asks for the usage in a last
// chunk (stream_options.include_usage), which is where the cached tokens are reported.
func (c Call) Body(stream bool) ([]byte, error) {
	c = c.Resolve()
	type streamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	}
	body := struct {
		Model         string         `json:"model,omitempty"`
		Messages      []Message      `json:"messages,omitempty"`
		Prompt        *string        `json:"prompt,omitempty"`
		MaxTokens     int            `json:"max_tokens,omitempty"`
		Stream        bool           `json:"stream,omitempty"`
		StreamOptions *streamOptions `json:"stream_options,omitempty"`
	}{Model: c.Model, MaxTokens: c.MaxTokens, Stream: stream}
	if c.API == APICompletions {
		body.Prompt = &c.Prompt
	} else {
		body.Messages = c.Messages
	}
	if stream {
		body.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(body); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
