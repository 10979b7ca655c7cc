package llmreq_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
)

func ExampleParse() {
	body := `{
		"model": "llama-3.1-8b",
		"messages": [
			{"role": "system", "content": "You are terse."},
			{"role": "user", "content": [{"type": "text", "text": "Hi!\nWho are you?"}]}
		],
		"max_completion_tokens": 64,
		"stream": true,
		"prompt_cache_key": "conversation-42"
	}`
	req := llmreq.Parse([]byte(body), false)
	fmt.Println(req.Format, req.Model, req.MaxTokens, req.Stream, req.Session)
	fmt.Printf("%q\n", req.Text)

	// The first bytes of the same body: the text so far, a prefix of the whole text.
	cut := llmreq.Parse([]byte(body[:strings.Index(body, "Who")]), true)
	fmt.Printf("%q truncated=%v\n", cut.Text, cut.Truncated)

	// Anthropic's top-level system reads as a system message.
	req = llmreq.Parse([]byte(`{"model":"claude","system":"You are terse.","messages":[{"role":"user","content":"Hi"}]}`), false)
	fmt.Println(req.Format)
	fmt.Printf("%q\n", req.Text)

	// Output:
	// openai_chat llama-3.1-8b 64 true conversation-42
	// "system\x1fYou are terse.\x1euser\x1fHi!\nWho are you?\x1e"
	// "system\x1fYou are terse.\x1euser\x1fHi!\n" truncated=true
	// anthropic_messages
	// "system\x1fYou are terse.\x1euser\x1fHi\x1e"
}

func ExampleReadBody() {
	r, _ := http.NewRequest(http.MethodPost, "http://upstream/v1/completions",
		strings.NewReader(`{"model":"m","prompt":"Once upon a time"}`))
	prefix, truncated, err := llmreq.ReadBody(r, 27)
	if err != nil {
		return
	}
	req := llmreq.Parse(prefix, truncated)
	fmt.Printf("%s %q %q truncated=%v\n", req.Format, req.Model, req.Text, req.Truncated)

	// r.Body still yields the whole body, for the upstream.
	whole, _ := io.ReadAll(r.Body)
	fmt.Println(string(whole))
	// Output:
	// openai_completion "m" "Once" truncated=true
	// {"model":"m","prompt":"Once upon a time"}
}

func ExampleParseAs() {
	// A Responses turn as the OpenAI SDK sends it, posted to /v1/responses: instructions, the
	// tool definitions as sent, then the input items in order.
	body := `{"model":"gpt-4.1","instructions":"Be brief.","tools":[{"type":"function","name":"weather"}],` +
		`"input":[{"role":"user","content":"Weather in Paris?"},` +
		`{"type":"function_call","call_id":"c1","name":"weather","arguments":"{\"city\":\"Paris\"}"},` +
		`{"type":"function_call_output","call_id":"c1","output":"sunny"}],"max_output_tokens":64}`
	r, _ := http.NewRequest(http.MethodPost, "http://upstream/v1/responses", strings.NewReader(body))
	prefix, truncated, err := llmreq.ReadBody(r, 1<<20)
	if err != nil {
		return
	}
	req := llmreq.ParseAs(prefix, truncated, llmreq.Hint(r))
	fmt.Println(req.Format, req.Model, req.MaxTokens)
	for _, m := range strings.Split(strings.TrimSuffix(req.Text, "\x1e"), "\x1e") {
		fmt.Printf("%q\n", m)
	}
	// Output:
	// openai_responses gpt-4.1 64
	// "system\x1fBe brief."
	// "tools\x1f[{\"type\":\"function\",\"name\":\"weather\"}]"
	// "user\x1fWeather in Paris?"
	// "assistant\x1fweather({\"city\":\"Paris\"})"
	// "tool\x1fsunny"
}
