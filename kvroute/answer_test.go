package kvroute

import (
	"strings"
	"testing"
)

// Real answers' shapes: vLLM (OpenAI chat and completions, Responses), Anthropic's Messages
// API, llama.cpp's server.
var answerCases = []struct {
	name        string
	kind        answerKind
	responses   bool
	body        string
	want        usage
	wantContent bool // a first content event (a non-streamed answer has none)
}{
	{"chat json", answerJSON, false,
		`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"usage\":{\"prompt_tokens\":9}"}}],` +
			`"usage":{"prompt_tokens":1200,"total_tokens":1210,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":1024}}}`,
		usage{ok: true, prompt: 1200, cached: 1024, cachedKnown: true}, false},
	{"chat json without cached tokens", answerJSON, false,
		`{"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens_details":null}}`,
		usage{ok: true, prompt: 12}, false},
	{"chat json without usage", answerJSON, false, `{"id":"x","choices":[{"message":{"content":"usage"}}]}`, usage{}, false},
	{"chat stream with usage", answerSSE, false,
		"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
			"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n" +
			"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":500,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":496}}}\n\n" +
			"data: [DONE]\n\n",
		usage{ok: true, prompt: 500, cached: 496, cachedKnown: true}, true},
	{"chat stream, role chunk only", answerSSE, false,
		"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\r\n\r\n", usage{}, false},
	{"chat stream reasoning", answerSSE, false,
		"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hmm\"}}]}\n\n", usage{}, true},
	{"completions stream", answerSSE, false,
		"data: {\"object\":\"text_completion\",\"choices\":[{\"text\":\"a\",\"index\":0}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":64,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n",
		usage{ok: true, prompt: 64, cachedKnown: true}, true},
	{"responses json", answerJSON, true,
		`{"id":"resp_abc123","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],` +
			`"usage":{"input_tokens":300,"input_tokens_details":{"cached_tokens":256},"output_tokens":2,"total_tokens":302}}`,
		usage{ok: true, prompt: 300, cached: 256, cachedKnown: true, respID: "resp_abc123"}, false},
	{"responses stream", answerSSE, true,
		"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_s1\",\"object\":\"response\",\"status\":\"in_progress\",\"usage\":null}}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"delta\":\"Hi\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_s1\",\"object\":\"response\",\"output\":[{\"content\":[{\"text\":\"Hi\"}]}],\"usage\":{\"input_tokens\":40,\"input_tokens_details\":{\"cached_tokens\":32},\"output_tokens\":1}}}\n\n",
		usage{ok: true, prompt: 40, cached: 32, cachedKnown: true, respID: "resp_s1"}, true},
	{"responses created only", answerSSE, true,
		"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_s2\",\"object\":\"response\"}}\n\n",
		usage{respID: "resp_s2"}, false},
	{"anthropic json", answerJSON, false,
		`{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"usage":{"input_tokens":20,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":5}}`,
		usage{ok: true, prompt: 2120, cached: 2000, cachedKnown: true}, false},
	{"anthropic stream", answerSSE, false,
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"content\":[],\"usage\":{\"input_tokens\":7,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":1500,\"output_tokens\":1}}}\n\n" +
			"event: ping\ndata: {\"type\": \"ping\"}\n\n" +
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
		usage{ok: true, prompt: 1507, cached: 1500, cachedKnown: true}, true},
	{"llama.cpp json", answerJSON, false,
		`{"content":"Hi","tokens_predicted":1,"timings":{"prompt_n":100,"prompt_ms":50.5,"cache_n":900,"predicted_n":1}}`,
		usage{ok: true, prompt: 1000, cached: 900, cachedKnown: true, computed: 100, prefillMS: 50.5}, false},
	{"llama.cpp chat with timings", answerJSON, false,
		`{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":1000,"completion_tokens":1},"timings":{"prompt_n":100,"prompt_ms":20,"cache_n":900}}`,
		usage{ok: true, prompt: 1000, computed: 100, prefillMS: 20}, false},

	// Lies and junk: ignored, counted, never trusted.
	{"cached above prompt", answerJSON, false, `{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":11}}}`, usage{lies: true}, false},
	{"negative", answerJSON, false, `{"usage":{"prompt_tokens":-5}}`, usage{lies: true}, false},
	{"NaN", answerJSON, false, `{"usage":{"prompt_tokens":NaN,"prompt_tokens_details":{"cached_tokens":1}}}`, usage{lies: true}, false},
	{"1e12", answerJSON, false, `{"usage":{"prompt_tokens":1e12}}`, usage{lies: true}, false},
	{"10^12 digits", answerJSON, false, `{"usage":{"prompt_tokens":1000000000000}}`, usage{lies: true}, false},
	{"fraction", answerJSON, false, `{"usage":{"prompt_tokens":10.5}}`, usage{lies: true}, false},
	{"usage as a string", answerJSON, false, `{"usage":{"prompt_tokens":"10"}}`, usage{}, false},
	{"usage deep in content", answerSSE, false,
		"data: {\"choices\":[{\"delta\":{\"content\":\"{\\\"usage\\\":{\\\"prompt_tokens\\\":99}}\"}}]}\n\n", usage{}, true},
	{"nested usage is not the usage", answerJSON, false, `{"choices":[{"usage":{"prompt_tokens":5}}]}`, usage{}, false},
	{"escaped key", answerJSON, false, `{"\u0075sage":{"prompt_tokens":5}}`, usage{}, false},
	{"cut json", answerJSON, false, `{"usage":{"prompt_tokens":5}`, usage{}, false},
	{"trailing garbage", answerJSON, false, `{"usage":{"prompt_tokens":5}} x`, usage{}, false},
	{"stream cut mid-event", answerSSE, false,
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5}}", usage{}, true},
	{"id of a chat answer is no response id", answerJSON, true, `{"id":"chatcmpl-9","object":"chat.completion","usage":{"prompt_tokens":5}}`,
		usage{ok: true, prompt: 5}, false},
	{"response id of a request that was not a Responses request", answerJSON, false, `{"id":"resp_1","object":"response"}`, usage{}, false},
}

func TestAnswerObserver(t *testing.T) {
	for _, tc := range answerCases {
		t.Run(tc.name, func(t *testing.T) {
			// Whole, then split at every byte: the engine's writes and Caddy's copy buffer cut
			// answers anywhere.
			splits := []int{len(tc.body)}
			for i := 1; i < len(tc.body); i++ {
				splits = append(splits, i)
			}
			for _, at := range splits {
				var o answerObserver
				o.begin(tc.kind, tc.responses)
				firsts := 0
				for _, part := range []string{tc.body[:at], tc.body[at:]} {
					if o.write([]byte(part)) {
						firsts++
					}
				}
				got := o.finish()
				if got := got.sansOutput(); got != tc.want {
					t.Fatalf("split at %d: got %+v, want %+v", at, got, tc.want)
				}
				if wantFirsts := map[bool]int{true: 1, false: 0}[tc.wantContent]; firsts != wantFirsts {
					t.Fatalf("split at %d: first content reported %d times, want %d", at, firsts, wantFirsts)
				}
			}
		})
	}
}

// TestAnswerObserverBounds: a final chunk of megabytes and a JSON answer beyond the bound are
// given up (counted), the events after a huge one still read.
func TestAnswerObserverBounds(t *testing.T) {
	huge := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 3<<20) + "\"}}],\"usage\":{\"prompt_tokens\":1}}\n\n"
	final := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\n"
	var o answerObserver
	o.begin(answerSSE, false)
	for i := 0; i < len(huge); i += 32 << 10 {
		o.write([]byte(huge[i:min(len(huge), i+32<<10)]))
	}
	o.write([]byte(final))
	if got := o.finish().sansOutput(); got != (usage{ok: true, prompt: 7, cached: 3, cachedKnown: true}) || o.gaveUps != 1 {
		t.Fatalf("got %+v with %d given up, want the final usage and 1 given up", got, o.gaveUps)
	}

	o.begin(answerJSON, false)
	body := `{"choices":[{"message":{"content":"` + strings.Repeat("y", 2<<20) + `"}}],"usage":{"prompt_tokens":5}}`
	o.write([]byte(body))
	if got := o.finish(); got.ok || o.gaveUps != 1 {
		t.Fatalf("a JSON answer over the bound: got %+v with %d given up, want nothing and 1", got, o.gaveUps)
	}

	o.begin(answerJSON, false)
	o.write([]byte(strings.Repeat("[", 1000)))
	if got := o.finish(); got.ok {
		t.Fatalf("deep nesting: got %+v", got)
	}
}

// TestAnswerUsageMergedByField: a later usage object of the same answer adds what it reports to
// the earlier ones, field by field; a field it leaves out (or nulls, or zeroes after a count)
// keeps the earlier value. Anthropic's message_delta (cumulative counts, each field optional)
// after a message_start that counted cached tokens; OpenAI chunks whose final usage leaves out
// the details an earlier one gave; vLLM's continuous usage, growing.
func TestAnswerUsageMergedByField(t *testing.T) {
	start := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null," +
		"\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":4096,\"output_tokens\":1}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
	stop := "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	anthropic := usage{ok: true, prompt: 4108, cached: 4096, cachedKnown: true}
	chunk := "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]"
	for _, tc := range []struct {
		name, body string
		want       usage
	}{
		{"anthropic message_delta with output tokens only", start +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n" + stop,
			anthropic},
		{"anthropic message_delta with input tokens, cache fields null", start +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":null,\"cache_read_input_tokens\":null,\"output_tokens\":15,\"server_tool_use\":null}}\n\n" + stop,
			anthropic},
		{"anthropic message_delta with input tokens only", start +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":12,\"output_tokens\":15}}\n\n" + stop,
			anthropic},
		{"anthropic message_delta that zeroes the cache read", start +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":12,\"cache_read_input_tokens\":0,\"output_tokens\":15}}\n\n" + stop,
			anthropic},
		{"anthropic message_delta with the full cumulative usage", start +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":4096,\"output_tokens\":15}}\n\n" + stop,
			anthropic},
		{"openai final usage chunk", chunk + "}\n\n" +
			"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":900,\"completion_tokens\":7,\"total_tokens\":907,\"prompt_tokens_details\":{\"cached_tokens\":768}}}\n\ndata: [DONE]\n\n",
			usage{ok: true, prompt: 900, cached: 768, cachedKnown: true}},
		{"openai final usage without the details an earlier chunk gave", chunk + ",\"usage\":{\"prompt_tokens\":900,\"completion_tokens\":1,\"total_tokens\":901,\"prompt_tokens_details\":{\"cached_tokens\":768}}}\n\n" +
			"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":900,\"completion_tokens\":7,\"total_tokens\":907,\"prompt_tokens_details\":null}}\n\ndata: [DONE]\n\n",
			usage{ok: true, prompt: 900, cached: 768, cachedKnown: true}},
		{"vllm continuous usage, details in the final chunk", chunk + ",\"usage\":{\"prompt_tokens\":900,\"completion_tokens\":1,\"total_tokens\":901}}\n\n" +
			chunk + ",\"usage\":{\"prompt_tokens\":900,\"completion_tokens\":2,\"total_tokens\":902}}\n\n" +
			"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":900,\"completion_tokens\":2,\"total_tokens\":902,\"prompt_tokens_details\":{\"cached_tokens\":512}}}\n\ndata: [DONE]\n\n",
			usage{ok: true, prompt: 900, cached: 512, cachedKnown: true}},
		{"a later lie is ignored, the earlier usage stands", chunk + ",\"usage\":{\"prompt_tokens\":900,\"prompt_tokens_details\":{\"cached_tokens\":768}}}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":900,\"prompt_tokens_details\":{\"cached_tokens\":901}}}\n\n",
			usage{ok: true, prompt: 900, cached: 768, cachedKnown: true, lies: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for at := 1; at <= len(tc.body); at++ {
				var o answerObserver
				o.begin(answerSSE, false)
				o.write([]byte(tc.body[:at]))
				o.write([]byte(tc.body[at:]))
				if got := o.finish().sansOutput(); got != tc.want {
					t.Fatalf("split at %d: got %+v, want %+v", at, got, tc.want)
				}
			}
		})
	}
}

// TestAnswerDoneSplit: OpenAI's [DONE] end marker cut anywhere between two writes is the end
// marker, not a malformed event: in a stream with content (whose events are skimmed once
// content flows), and in one where no event carried content the observer knows (a role chunk
// and a usage chunk: an empty completion; SGLang's /generate text), each of which is parsed.
func TestAnswerDoneSplit(t *testing.T) {
	usageChunk := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":64,\"prompt_tokens_details\":{\"cached_tokens\":48}}}\n\n"
	for _, body := range []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n" + usageChunk + "data: [DONE]\n\n",
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" + usageChunk + "data: [DONE]\n\n",
	} {
		for at := 1; at < len(body); at++ {
			var o answerObserver
			o.begin(answerSSE, false)
			o.write([]byte(body[:at]))
			o.write([]byte(body[at:]))
			if got := o.finish().sansOutput(); got != (usage{ok: true, prompt: 64, cached: 48, cachedKnown: true}) || o.gaveUps != 0 {
				t.Fatalf("split at %d (%q | %q): got %+v with %d given up, want the usage and none given up", at, body[max(0, at-8):at], body[at:min(len(body), at+8)], got, o.gaveUps)
			}
		}
	}
	// Not the marker: a [DONE] followed by more, or a prefix of it, is no JSON either.
	for _, data := range []string{"[DO", "[DONE", "[DONEX]", "[D0NE]"} {
		var o answerObserver
		o.begin(answerSSE, false)
		o.write([]byte("data: " + data + "\n\n"))
		o.finish()
		if want := map[bool]int{true: 0, false: 1}[strings.HasPrefix(data, "[DONE]")]; o.gaveUps != want {
			t.Errorf("data %q: %d given up, want %d", data, o.gaveUps, want)
		}
	}
}

// sansOutput is u without its output tokens: the tables above are about the prompt's.
func (u usage) sansOutput() usage {
	u.output, u.outputKnown = 0, false
	return u
}

// An answer's output tokens (flow_control's tokens served): OpenAI's completion_tokens, the
// Responses API's and Anthropic's output_tokens (Anthropic's final message_delta counts them
// all); none when the usage leaves them out.
func TestAnswerOutputTokens(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind answerKind
		body string
		want float64 // -1: not known
	}{
		{"chat JSON", answerJSON, `{"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":7,"total_tokens":27}}`, 7},
		{"chat JSON without completion_tokens", answerJSON, `{"choices":[],"usage":{"prompt_tokens":20}}`, -1},
		{"responses JSON", answerJSON, `{"object":"response","usage":{"input_tokens":20,"output_tokens":9}}`, 9},
		{"chat stream, final usage", answerSSE, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":1}}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":12}}\n\ndata: [DONE]\n\n", 12},
		{"anthropic stream", answerSSE, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n", 15},
	} {
		var o answerObserver
		o.begin(tc.kind, false)
		o.write([]byte(tc.body))
		u := o.finish()
		if !u.ok {
			t.Errorf("%s: no usage read", tc.name)
			continue
		}
		if tc.want < 0 {
			if u.outputKnown {
				t.Errorf("%s: output %v known, want unknown", tc.name, u.output)
			}
		} else if !u.outputKnown || u.output != tc.want {
			t.Errorf("%s: output %v (known %v), want %v", tc.name, u.output, u.outputKnown, tc.want)
		}
	}
}
