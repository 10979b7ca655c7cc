package llmreq

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// msg is one serialized message of the routing text.
func msg(role, text string) string { return role + "\x1f" + text + "\x1e" }

func show(r Request) string {
	return fmt.Sprintf("{%v model=%q text=%q session=%q previous_response_id=%q max_tokens=%d stream=%v truncated=%v}",
		r.Format, r.Model, r.Text, r.Session, r.PreviousResponseID, r.MaxTokens, r.Stream, r.Truncated)
}

// ph is the placeholder of a non-text part written as raw.
func ph(raw string) string { return refPlaceholder([]byte(raw)) }

func TestFormatString(t *testing.T) {
	for f, want := range map[Format]string{
		None: "none", Chat: "openai_chat", Messages: "anthropic_messages",
		Completion: "openai_completion", Generate: "sglang_generate", Responses: "openai_responses",
		OllamaChat: "ollama_chat", OllamaGenerate: "ollama_generate", 9: "Format(9)",
	} {
		if got := f.String(); got != want {
			t.Errorf("Format(%d).String() = %q, want %q", f, got, want)
		}
	}
}

const (
	image      = `{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}`
	inputImage = `{"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgo=","detail":"auto"}`
)

// bigImage is an image part of some 3 KB.
var bigImage = `{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,` + strings.Repeat("/9j/4AAQSkZJRgABAQ", 170) + `"}}`

var parseTests = []struct {
	name string
	body string
	want Request
}{
	// OpenAI chat.
	{"chat", `{"model":"llama-3.1-8b","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`,
		Request{Format: Chat, Model: "llama-3.1-8b", Text: msg("system", "Be brief.") + msg("user", "Hi")}},
	{"chat every role", `{"messages":[{"role":"developer","content":"d"},{"role":"user","content":"u"},{"role":"assistant","content":"a"},{"role":"tool","tool_call_id":"c1","content":"t"}]}`,
		Request{Format: Chat, Text: msg("developer", "d") + msg("user", "u") + msg("assistant", "a") + msg("tool", "t")}},
	{"chat content parts", `{"messages":[{"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":"two"},"three"]}]}`,
		Request{Format: Chat, Text: msg("user", "one\ntwo\nthree")}},
	{"chat image", `{"messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},` + image + `]}]}`,
		Request{Format: Chat, Text: msg("user", "What is this?\n"+ph(image))}},
	{"chat image only", `{"messages":[{"role":"user","content":[` + image + `]}]}`,
		Request{Format: Chat, Text: msg("user", ph(image))}},
	{"chat empty parts skipped", `{"messages":[{"role":"user","content":[{"type":"text","text":""},"",{"type":"text","text":"x"},null,5]}]}`,
		Request{Format: Chat, Text: msg("user", "x")}},
	{"chat single part object", `{"messages":[{"role":"user","content":{"type":"text","text":"x"}}]}`,
		Request{Format: Chat, Text: msg("user", "x")}},
	{"chat untyped part", `{"messages":[{"role":"user","content":[{"text":"x"},{}]}]}`,
		Request{Format: Chat, Text: msg("user", "x\n"+ph(`{}`))}},
	{"chat tool calls", `{"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[` +
		`{"id":"c1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}},` +
		`{"id":"c2","type":"function","function":{"arguments":{"a":[1,2]},"name":"time"}}]},` +
		`{"role":"tool","tool_call_id":"c1","content":"sunny"}]}`,
		Request{Format: Chat, Text: msg("user", "Weather?") + msg("assistant", "weather({\"city\":\"Paris\"})\ntime({\"a\":[1,2]})") + msg("tool", "sunny")}},
	{"chat tool calls after content", `{"messages":[{"tool_calls":[{"function":{"name":"f","arguments":""}},{"id":"no function"}],"content":"Let me check.","role":"assistant"}]}`,
		Request{Format: Chat, Text: msg("assistant", "Let me check.\nf()")}},
	{"chat key order", `{"messages":[{"content":"Hi","name":"bob","role":"user"}],"model":"m"}`,
		Request{Format: Chat, Model: "m", Text: msg("user", "Hi")}},
	{"chat skipped values", `{"user":"say \"hi\" \\","metadata":{"a":[1,-2.5e3,true,false,null,{"b":"\"}"}],"c":{}},"messages":[{"role":"user","name":"\"x\"","content":"x"}]}`,
		Request{Format: Chat, Text: msg("user", "x")}},
	{"chat empty messages", `{"model":"m","messages":[]}`, Request{Format: Chat, Model: "m"}},
	{"chat fields", `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":100,"max_completion_tokens":200,"stream":true,"prompt_cache_key":"conv-1"}`,
		Request{Format: Chat, Model: "m", Text: msg("user", "x"), MaxTokens: 200, Stream: true, Session: "conv-1"}},
	{"chat max_tokens", `{"messages":[],"max_tokens":100,"stream":false}`, Request{Format: Chat, MaxTokens: 100}},
	{"chat pretty", "{\n  \"model\" : \"m\" ,\n  \"messages\" : [\n    {\n      \"role\" : \"user\",\n      \"content\" : \"x\"\n    }\n  ]\n}\n",
		Request{Format: Chat, Model: "m", Text: msg("user", "x")}},
	{"chat escaped keys", `{"mod\u0065l":"m","\u006dessages":[{"r\u006fle":"user","content":"x"}]}`,
		Request{Format: Chat, Model: "m", Text: msg("user", "x")}},

	// Anthropic messages.
	{"anthropic system string", `{"model":"claude","max_tokens":1024,"system":"You are terse.","messages":[{"role":"user","content":"Hi"}]}`,
		Request{Format: Messages, Model: "claude", MaxTokens: 1024, Text: msg("system", "You are terse.") + msg("user", "Hi")}},
	{"anthropic system array", `{"system":[{"type":"text","text":"A"},{"type":"text","text":"B","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}]}`,
		Request{Format: Messages, Text: msg("system", "A\nB") + msg("user", "Hi")}},
	{"anthropic system after messages", `{"messages":[{"role":"user","content":"Hi"}],"system":"S"}`,
		Request{Format: Messages, Text: msg("system", "S") + msg("user", "Hi")}},
	{"anthropic version only", `{"anthropic_version":"vertex-2023-10-16","messages":[{"role":"user","content":"Hi"}]}`,
		Request{Format: Messages, Text: msg("user", "Hi")}},
	{"anthropic stop_sequences", `{"messages":[{"role":"user","content":"Hi"}],"stop_sequences":["x"]}`,
		Request{Format: Messages, Text: msg("user", "Hi")}},
	{"anthropic tools", `{"messages":[{"role":"user","content":"Weather?"},` +
		`{"role":"assistant","content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"t1","name":"weather","input":{"city": "Paris"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"sunny"},{"type":"image","source":{}}]},{"type":"tool_result","content":"ok"}]}]}`,
		Request{Format: Messages, Text: msg("user", "Weather?") + msg("assistant", "Checking.\nweather({\"city\": \"Paris\"})") +
			msg("user", "sunny\n"+ph(`{"type":"image","source":{}}`)+"\nok")}},
	{"anthropic thinking", `{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"s"},{"type":"text","text":"x"}]}]}`,
		Request{Format: Chat, Text: msg("assistant", ph(`{"type":"thinking","thinking":"hmm","signature":"s"}`)+"\nx")}},
	{"anthropic system only", `{"system":"S"}`, Request{}},

	// Tool definitions: as sent, after Anthropic's system and ahead of every message.
	{"chat tools", `{"messages":[{"role":"system","content":"S"},{"role":"user","content":"Hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`,
		Request{Format: Chat, Text: msg("tools", `[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`) + msg("system", "S") + msg("user", "Hi")}},
	{"chat tools as written", "{\"tools\": [ {\"name\":\"caf\\u00e9\"} ],\"messages\":[]}",
		Request{Format: Chat, Text: msg("tools", `[ {"name":"caf\u00e9"} ]`)}},
	{"chat tools not an array", `{"tools":{"a":1},"messages":[]}`, Request{Format: Chat}},
	{"anthropic tools", `{"system":"S","tools":[{"name":"f","input_schema":{}}],"messages":[{"role":"user","content":"Hi"}]}`,
		Request{Format: Messages, Text: msg("system", "S") + msg("tools", `[{"name":"f","input_schema":{}}]`) + msg("user", "Hi")}},
	{"tools alone", `{"tools":[]}`, Request{}},

	// Non-text parts weigh one char per 64 bytes of their JSON, at least 8.
	{"image weight", `{"messages":[{"role":"user","content":[` + bigImage + `]}]}`,
		Request{Format: Chat, Text: msg("user", ph(bigImage))}},
	{"audio part", `{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}]}]}`,
		Request{Format: Chat, Text: msg("user", ph(`{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}`))}},

	// OpenAI Responses.
	{"responses string", `{"model":"gpt","instructions":"Be brief.","input":"Hi","max_output_tokens":64,"stream":true}`,
		Request{Format: Responses, Model: "gpt", Text: msg("system", "Be brief.") + msg("user", "Hi"), MaxTokens: 64, Stream: true}},
	{"responses items", `{"model":"gpt","input":[{"role":"developer","content":"d"},{"type":"message","role":"user","content":[{"type":"input_text","text":"q"},` + inputImage + `]},` +
		`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"a","annotations":[]},{"type":"refusal","refusal":"no"}]}]}`,
		Request{Format: Responses, Model: "gpt", Text: msg("developer", "d") + msg("user", "q\n"+ph(inputImage)) + msg("assistant", "a\n"+ph(`{"type":"refusal","refusal":"no"}`))}},
	{"responses function call", `{"input":[{"role":"user","content":"Weather?"},{"type":"function_call","call_id":"c1","name":"weather","arguments":"{\"city\":\"Paris\"}"},` +
		`{"type":"function_call_output","call_id":"c1","output":"sunny"},{"call_id":"c2","output":[{"type":"input_text","text":"t"},{"type":"input_image","file_id":"f"}],"type":"function_call_output"}]}`,
		Request{Format: Responses, Text: msg("user", "Weather?") + msg("assistant", `weather({"city":"Paris"})`) + msg("tool", "sunny") + msg("tool", "t\n"+ph(`{"type":"input_image","file_id":"f"}`))}},
	{"responses custom tool", `{"input":[{"type":"custom_tool_call","name":"sh","input":"ls -l","call_id":"c"},{"type":"custom_tool_call_output","call_id":"c","output":"a b"}]}`,
		Request{Format: Responses, Text: msg("assistant", "sh(ls -l)") + msg("tool", "a b")}},
	{"responses reasoning", `{"input":[{"type":"reasoning","id":"rs","summary":[{"type":"summary_text","text":"s1"},{"type":"summary_text","text":"s2"}],"content":[{"type":"reasoning_text","text":"r"}],"encrypted_content":"xyz"},{"type":"reasoning","summary":[]}]}`,
		Request{Format: Responses, Text: msg("reasoning", "s1\ns2\nr") + msg("reasoning", "")}},
	{"responses other item", `{"input":[{"type":"item_reference","id":"msg_1"}]}`,
		Request{Format: Responses, Text: msg("item_reference", ph(`{"type":"item_reference","id":"msg_1"}`))}},
	{"responses role wins over type", `{"input":[{"type":"function_call","role":"user","content":"x","name":"f"}]}`,
		Request{Format: Responses, Text: msg("user", "x")}},
	{"responses tools", `{"input":"Hi","instructions":"S","tools":[{"type":"web_search"}]}`,
		Request{Format: Responses, Text: msg("system", "S") + msg("tools", `[{"type":"web_search"}]`) + msg("user", "Hi")}},
	{"responses previous_response_id", `{"model":"gpt","previous_response_id":"resp_1","input":"And then?","prompt_cache_key":"c7"}`,
		Request{Format: Responses, Model: "gpt", Text: msg("user", "And then?"), Session: "c7", PreviousResponseID: "resp_1"}},
	{"responses instructions only", `{"instructions":"S"}`, Request{Format: Responses, Text: msg("system", "S")}},
	{"responses input without a Responses field", `{"model":"gpt","input":"Hi"}`, Request{Model: "gpt"}},
	{"responses max_tokens first", `{"input":"x","max_output_tokens":5,"max_tokens":7}`, Request{Format: Responses, Text: msg("user", "x"), MaxTokens: 7}},
	{"responses text config", `{"input":"x","reasoning":{"effort":"low"},"text":{"format":{"type":"text"}},"prompt":{"id":"p"}}`,
		Request{Format: Responses, Text: msg("user", "x")}},
	{"messages beat input", `{"input":"x","instructions":"i","messages":[]}`, Request{Format: Chat}},

	// OpenAI completions.
	{"completion string", `{"model":"m","prompt":"Once upon a time","max_tokens":16}`,
		Request{Format: Completion, Model: "m", Text: "Once upon a time", MaxTokens: 16}},
	{"completion array", `{"prompt":["a","","b"]}`, Request{Format: Completion, Text: "a\n\nb"}},
	{"completion token ids", `{"prompt":[1,22,333]}`, Request{Format: Completion, Text: "1 22 333"}},
	{"completion token id lists", `{"prompt":[[1,2],[],[3]]}`, Request{Format: Completion, Text: "1 2\n\n3"}},
	{"completion mixed", `{"prompt":["a",1,2,null,"b",[3,"x",4]]}`, Request{Format: Completion, Text: "a\n1 2\nb\n3 4"}},
	{"completion beats text", `{"text":"t","prompt":"p"}`, Request{Format: Completion, Text: "p"}},
	{"messages beat prompt", `{"prompt":"p","messages":[]}`, Request{Format: Chat}},

	// SGLang generate.
	{"generate", `{"text":"Hello","sampling_params":{"temperature":0,"max_new_tokens":64},"stream":true}`,
		Request{Format: Generate, Text: "Hello", MaxTokens: 64, Stream: true}},
	{"generate batch", `{"text":["a","b"]}`, Request{Format: Generate, Text: "a\nb"}},
	{"generate input_ids", `{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":8}}`, Request{Format: Generate, Text: "1 2 3", MaxTokens: 8}},
	{"generate input_ids batch", `{"input_ids":[[1,2],[3]]}`, Request{Format: Generate, Text: "1 2\n3"}},
	{"generate text beats input_ids", `{"input_ids":[1],"text":"t"}`, Request{Format: Generate, Text: "t"}},
	{"generate max_tokens first", `{"text":"x","max_tokens":5,"sampling_params":{"max_new_tokens":64}}`,
		Request{Format: Generate, Text: "x", MaxTokens: 5}},

	// Strings.
	{"escapes", `{"prompt":"a\nb\"c\\d\/e\b\f\r\t\u00e9\u4e16\ud83d\ude00"}`,
		Request{Format: Completion, Text: "a\nb\"c\\d/e\b\f\r\té世😀"}},
	{"raw utf-8", `{"prompt":"é世😀 x"}`, Request{Format: Completion, Text: "é世😀 x"}},
	{"lone surrogates", `{"prompt":"\ud800x\udc00\ud83d\u0041\ud83d\ud83d\ude00\ud83d"}`,
		Request{Format: Completion, Text: "\uFFFDx\uFFFD\uFFFDA\uFFFD😀\uFFFD"}},
	{"invalid escapes kept", `{"prompt":"\q\u12G4\x"}`, Request{Format: Completion, Text: `\q\u12G4\x`}},
	{"control characters kept", "{\"prompt\":\"a\tb\x01\"}", Request{Format: Completion, Text: "a\tb\x01"}},
	{"invalid utf-8", "{\"model\":\"m\xff\",\"prompt\":\"a\xffb\xe4\x41\xc0\xaf\"}",
		Request{Format: Completion, Model: "m\uFFFD", Text: "a\uFFFDb\uFFFDA\uFFFD\uFFFD"}},
	{"invalid utf-8 in raw input", "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\",\"name\":\"f\",\"input\":\"\xff\"}]}]}",
		Request{Format: Messages, Text: msg("user", "f(\"\uFFFD\")")}},

	// Numbers and other wrong types.
	{"max_tokens string", `{"prompt":"x","max_tokens":"12"}`, Request{Format: Completion, Text: "x", MaxTokens: 12}},
	{"max_tokens float", `{"prompt":"x","max_tokens":12.0}`, Request{Format: Completion, Text: "x", MaxTokens: 12}},
	{"max_tokens exponent", `{"prompt":"x","max_tokens":1e3}`, Request{Format: Completion, Text: "x", MaxTokens: 1000}},
	{"max_tokens largest", `{"prompt":"x","max_tokens":2147483647}`, Request{Format: Completion, Text: "x", MaxTokens: 2147483647}},
	{"max_tokens too large", `{"prompt":"x","max_tokens":2147483648}`, Request{Format: Completion, Text: "x"}},
	{"max_tokens overflow", `{"prompt":"x","max_tokens":1e309}`, Request{Format: Completion, Text: "x"}},
	{"max_tokens negative", `{"prompt":"x","max_tokens":-5}`, Request{Format: Completion, Text: "x"}},
	{"max_tokens zero", `{"prompt":"x","max_tokens":0,"max_completion_tokens":null}`, Request{Format: Completion, Text: "x"}},
	{"max_tokens fraction", `{"prompt":"x","max_tokens":12.5}`, Request{Format: Completion, Text: "x"}},
	{"max_tokens bad strings", `{"prompt":"x","max_tokens":" 12","max_completion_tokens":"0x10"}`, Request{Format: Completion, Text: "x"}},
	{"max_tokens not JSON numbers", `{"prompt":"x","max_tokens":"+12","max_completion_tokens":"0x1p4"}`, Request{Format: Completion, Text: "x"}},
	{"max_tokens bool", `{"prompt":"x","max_tokens":true,"sampling_params":[1]}`, Request{Format: Completion, Text: "x"}},
	{"messages number", `{"model":"m","messages":5}`, Request{Model: "m"}},
	{"messages string", `{"messages":"hi"}`, Request{}},
	{"messages odd elements", `{"messages":[5,"x",null,[],{"role":"user","content":"ok"}]}`, Request{Format: Chat, Text: msg("user", "ok")}},
	{"content number", `{"messages":[{"role":"user","content":5}]}`, Request{Format: Chat, Text: msg("user", "")}},
	{"role number", `{"messages":[{"role":5,"content":"x"},{"content":"y"}]}`, Request{Format: Chat, Text: msg("", "x") + msg("", "y")}},
	{"system number", `{"system":5,"messages":[]}`, Request{Format: Chat}},
	{"tool_calls object", `{"messages":[{"role":"assistant","tool_calls":{"a":1},"content":"x"}]}`, Request{Format: Chat, Text: msg("assistant", "x")}},
	{"prompt number", `{"prompt":5}`, Request{}},
	{"prompt object", `{"prompt":{"text":"x"}}`, Request{}},
	{"model number", `{"model":5,"prompt":"x"}`, Request{Format: Completion, Text: "x"}},
	{"stream string", `{"prompt":"x","stream":"true"}`, Request{Format: Completion, Text: "x"}},
	{"session number", `{"prompt":"x","prompt_cache_key":7}`, Request{Format: Completion, Text: "x"}},

	// Duplicate keys: the last one counts.
	{"duplicate model", `{"model":"a","prompt":"x","model":"b"}`, Request{Format: Completion, Model: "b", Text: "x"}},
	{"duplicate model wrong type", `{"model":"a","prompt":"x","model":null}`, Request{Format: Completion, Text: "x"}},
	{"duplicate messages", `{"messages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}]}`,
		Request{Format: Chat, Text: msg("user", "b")}},
	{"duplicate messages wrong type", `{"messages":[{"role":"user","content":"a"}],"messages":null}`, Request{}},
	{"duplicate role and content", `{"messages":[{"role":"user","content":"a","role":"assistant","content":"b"}]}`,
		Request{Format: Chat, Text: msg("assistant", "b")}},
	{"duplicate part text", `{"messages":[{"role":"user","content":[{"text":"a","type":"text","text":"b"}]}]}`,
		Request{Format: Chat, Text: msg("user", "b")}},
	{"duplicate max_tokens", `{"prompt":"x","max_tokens":5,"max_tokens":"no"}`, Request{Format: Completion, Text: "x"}},

	// Not for us.
	{"embeddings", `{"input":"x","model":"m","encoding_format":"float","stream":true,"prompt_cache_key":"s"}`,
		Request{Model: "m", Stream: true, Session: "s"}},
	{"embeddings token ids", `{"input":[[1,2],[3]],"model":"m"}`, Request{Model: "m"}},
	{"empty object", `{}`, Request{}},
	{"empty", ``, Request{}},
	{"spaces", " \n\t ", Request{}},
	{"null", `null`, Request{}},
	{"array", `[{"prompt":"x"}]`, Request{}},
	{"string", `"prompt"`, Request{}},
	{"number", `42`, Request{}},
	{"binary", "\x00\x01\x02\xff\xfe{\"prompt\":\"x\"}", Request{}},
	{"unclosed", `{"prompt":"x"`, Request{}},
	{"unclosed string", `{"prompt":"x}`, Request{}},
	{"trailing garbage", `{"prompt":"x"} {}`, Request{}},
	{"trailing comma", `{"prompt":"x",}`, Request{}},
	{"missing colon", `{"prompt" "x"}`, Request{}},
	{"single quotes", `{'prompt':'x'}`, Request{}},
	{"bad literal", `{"prompt":"x","stream":tru}`, Request{}},
	{"bad number", `{"prompt":"x","seed":01}`, Request{}},
	{"bad fraction", `{"prompt":"x","seed":1.}`, Request{}},
	// Ollama's own API: /api/chat streams unless told not to; /api/generate renders its system
	// and prompt as a system and a user message.
	{"ollama chat", `{"model":"tiny","messages":[{"role":"system","content":"S"},{"role":"user","content":"Hi"}],"options":{"num_predict":12,"temperature":0},"keep_alive":-1}`,
		Request{Format: OllamaChat, Model: "tiny", MaxTokens: 12, Stream: true, Text: msg("system", "S") + msg("user", "Hi")}},
	{"ollama chat not streamed", `{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"stream":false,"format":"json"}`,
		Request{Format: OllamaChat, Model: "tiny", Text: msg("user", "Hi")}},
	{"ollama chat images", `{"model":"tiny","messages":[{"role":"user","content":"What?","images":["iVBORw0KGgo=","/9j/4AAQ"]},{"role":"assistant","content":"","images":["AA=="]}],"think":false}`,
		Request{Format: OllamaChat, Model: "tiny", Stream: true, Text: msg("user", "What?\n"+ph(`"iVBORw0KGgo="`)+"\n"+ph(`"/9j/4AAQ"`)) + msg("assistant", ph(`"AA=="`))}},
	{"ollama chat tool calls", `{"model":"tiny","messages":[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{"city":"Paris"}}}]},{"role":"tool","content":"18"}],"options":{}}`,
		Request{Format: OllamaChat, Model: "tiny", Stream: true, Text: msg("assistant", `f({"city":"Paris"})`) + msg("tool", "18")}},
	{"ollama generate", `{"model":"tiny","system":"S","prompt":"Hi","options":{"num_predict":"7"}}`,
		Request{Format: OllamaGenerate, Model: "tiny", MaxTokens: 7, Stream: true, Text: msg("system", "S") + msg("user", "Hi")}},
	{"ollama generate keep_alive", `{"model":"tiny","prompt":"Hi","keep_alive":"5m","stream":false}`,
		Request{Format: OllamaGenerate, Model: "tiny", Text: msg("user", "Hi")}},
	{"ollama generate context images", `{"model":"tiny","context":[1,22,333],"images":["AA==","BB=="],"prompt":"And?"}`,
		Request{Format: OllamaGenerate, Model: "tiny", Stream: true, Text: msg("context", "1 22 333") + msg("user", ph(`"AA=="`)) + msg("user", ph(`"BB=="`)) + msg("user", "And?")}},
	{"ollama generate raw", `{"model":"tiny","raw":true,"prompt":"<|user|>Hi","system":"ignored","stream":true}`,
		Request{Format: OllamaGenerate, Model: "tiny", Stream: true, Text: "<|user|>Hi"}},
	{"ollama num_predict unbounded", `{"model":"tiny","prompt":"x","options":{"num_predict":-1}}`,
		Request{Format: OllamaGenerate, Model: "tiny", Stream: true, Text: msg("user", "x")}},
	{"ollama max_tokens wins", `{"model":"tiny","messages":[{"role":"user","content":"x"}],"max_tokens":5,"options":{"num_predict":9}}`,
		Request{Format: OllamaChat, Model: "tiny", MaxTokens: 5, Stream: true, Text: msg("user", "x")}},
	{"bad exponent", `{"prompt":"x","seed":1e+}`, Request{}},
	{"bad number sign", `{"prompt":"x","seed":-}`, Request{}},
	{"bad nested", `{"prompt":"x","meta":{"a":[1,2}}`, Request{}},
	{"bad brackets", `{"prompt":"x","meta":[1}}`, Request{}},
	{"bad braces", `{"prompt":"x","meta":{"a":1]}`, Request{}},
	{"bad nested key", `{"prompt":"x","meta":{1:2}}`, Request{}},
	{"bad in messages", `{"messages":[{"role":"user","content":"x"},]}`, Request{}},
	{"bad in parts", `{"messages":[{"role":"user","content":[{"type":"text" "text":"x"}]}]}`, Request{}},
}

func TestParse(t *testing.T) {
	for _, tt := range parseTests {
		t.Run(tt.name, func(t *testing.T) {
			got := Parse([]byte(tt.body), false)
			tt.want.Runes = utf8.RuneCountInString(tt.want.Text)
			if got != tt.want {
				t.Errorf("Parse(%q)\n got %s\nwant %s", tt.body, show(got), show(tt.want))
			}
			// A whole body passed as truncated gives the same result, marked truncated, unless
			// its end was needed to know it is bad.
			if tt.want.Format != None {
				want := tt.want
				want.Truncated = true
				if got := Parse([]byte(tt.body), true); got != want {
					t.Errorf("Parse(%q, true)\n got %s\nwant %s", tt.body, show(got), show(want))
				}
			}
			if ref, ok := refParse([]byte(tt.body)); ok && prefixSafe([]byte(tt.body)) && ref != got {
				t.Errorf("reference disagrees on %q\n got %s\n ref %s", tt.body, show(got), show(ref))
			}
		})
	}
}

var truncatedTests = []struct {
	name string
	body string
	want Request
}{
	{"in content", `{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"hel`,
		Request{Format: Chat, Model: "m", Text: "system\x1fS\x1euser\x1fhel"}},
	{"in model", `{"messages":[{"role":"user","content":"x"}],"model":"lla`, Request{Format: Chat, Text: msg("user", "x")}},
	{"in session", `{"messages":[],"prompt_cache_key":"ab`, Request{Format: Chat}},
	{"before messages value", `{"model":"m","messages":`, Request{Model: "m"}},
	{"before any key", `{"model":"m",`, Request{Model: "m"}},
	{"in key", `{"model":"m","mess`, Request{Model: "m"}},
	{"in role", `{"messages":[{"role":"us`, Request{Format: Chat}},
	{"content before role", `{"messages":[{"content":"hello","role":"us`, Request{Format: Chat}},
	{"after role", `{"messages":[{"role":"user",`, Request{Format: Chat, Text: "user\x1f"}},
	{"after content", `{"messages":[{"role":"user","content":"x"`, Request{Format: Chat, Text: "user\x1fx"}},
	{"between messages", `{"messages":[{"role":"user","content":"x"},`, Request{Format: Chat, Text: msg("user", "x")}},
	{"in number", `{"prompt":"x","max_tokens":12`, Request{Format: Completion, Text: "x"}},
	{"in escape", `{"prompt":"ab\u00`, Request{Format: Completion, Text: "ab"}},
	{"after backslash", `{"prompt":"ab\`, Request{Format: Completion, Text: "ab"}},
	{"in surrogate pair", `{"prompt":"ab\ud83d\ude`, Request{Format: Completion, Text: "ab"}},
	{"after high surrogate", `{"prompt":"ab\ud83d`, Request{Format: Completion, Text: "ab"}},
	{"after high surrogate and backslash", `{"prompt":"ab\ud83d\`, Request{Format: Completion, Text: "ab"}},
	{"in utf-8", "{\"prompt\":\"ab\xe4\xb8", Request{Format: Completion, Text: "ab"}},
	{"in token id", `{"prompt":[[1,2,34`, Request{Format: Completion, Text: "1 2"}},
	{"in token ids", `{"prompt":[1,2,34`, Request{Format: Completion, Text: "1 2"}},
	{"in system", `{"messages":[{"role":"user","content":"x"}],"system":"You ar`, Request{Format: Messages, Text: "system\x1fYou ar"}},
	{"system only", `{"system":"You ar`, Request{Format: Messages, Text: "system\x1fYou ar"}},
	{"system done", `{"system":"S",`, Request{Format: Messages, Text: msg("system", "S")}},
	{"in part type", `{"messages":[{"role":"user","content":[{"text":"abc","type":"te`, Request{Format: Chat, Text: "user\x1f"}},
	{"in image", `{"messages":[{"role":"user","content":["a",{"type":"image_url","image_url":{"url":"data:`,
		Request{Format: Chat, Text: "user\x1fa\n\uFFFC"}},
	{"in tool call name", `{"messages":[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"wea`,
		Request{Format: Chat, Text: "assistant\x1fwea"}},
	{"in tool call arguments", `{"messages":[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":"{\"a\":`,
		Request{Format: Chat, Text: "assistant\x1ff({\"a\":"}},
	{"tool calls before content", `{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f"}}],"content":"x`,
		Request{Format: Chat, Text: "assistant\x1fx"}},
	{"in tool_use input", `{"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{"a":"\u00`,
		Request{Format: Messages, Text: "assistant\x1ff({\"a\":\"\\u00"}},
	{"in utf-8 of input", "{\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"name\":\"f\",\"input\":{\"a\":\"\xc3",
		Request{Format: Messages, Text: "assistant\x1ff({\"a\":\""}},
	{"in literal", `{"prompt":"x","stream":tr`, Request{Format: Completion, Text: "x", Stream: true}},
	{"in tools", `{"system":"S","tools":[{"name":"f","desc`, Request{Format: Messages, Text: msg("system", "S") + "tools\x1f" + `[{"name":"f","desc`}},
	{"in chat tools", `{"model":"m","tools":[{"type":"function"`, Request{Format: Chat, Model: "m", Text: "tools\x1f" + `[{"type":"function"`}},
	{"in utf-8 of tools", "{\"tools\":[\"caf\xc3", Request{Format: Chat, Text: "tools\x1f[\"caf"}},
	{"after tools", `{"tools":[],"messages":[{"role":"user","content":"Hi`, Request{Format: Chat, Text: msg("tools", "[]") + "user\x1fHi"}},
	{"in instructions", `{"instructions":"Be br`, Request{Format: Responses, Text: "system\x1fBe br"}},
	{"in input string", `{"max_output_tokens":5,"input":"Hel`, Request{Format: Responses, Text: "user\x1fHel", MaxTokens: 5}},
	{"in input string, nothing of Responses yet", `{"model":"m","input":"Hel`, Request{Model: "m"}},
	{"in input message", `{"input":[{"role":"user","content":"Hel`, Request{Format: Responses, Text: "user\x1fHel"}},
	{"in function call", `{"input":[{"role":"user","content":"x"},{"type":"function_call","name":"f","arguments":"{`,
		Request{Format: Responses, Text: msg("user", "x")}},
	{"in function call output", `{"input":[{"type":"function_call_output","output":"sun`, Request{Format: Responses}},
	{"in typed message without role", `{"input":[{"type":"message","content":"x`, Request{Format: Responses}},
	{"in input_ids", `{"input_ids":[1,2,3`, Request{Format: Generate, Text: "1 2"}},
	{"in weighted image", `{"messages":[{"role":"user","content":[` + bigImage[:2000], Request{Format: Chat, Text: "user\x1f\uFFFC"}},
	{"whole body", `{"prompt":"x"}`, Request{Format: Completion, Text: "x"}},
	{"bad before the cut", `{"prompt":"x",,"model":"m`, Request{}},
	{"deep before the cut", `{"prompt":"x","a":` + strings.Repeat("[", 2000), Request{}},
}

func TestParseTruncated(t *testing.T) {
	for _, tt := range truncatedTests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.want
			want.Truncated = want != Request{}
			want.Runes = utf8.RuneCountInString(want.Text)
			if got := Parse([]byte(tt.body), true); got != want {
				t.Errorf("Parse(%q, true)\n got %s\nwant %s", tt.body, show(got), show(want))
			}
		})
	}
}

// prefixBodies are bodies whose every cut is checked against the whole.
var prefixBodies = []string{
	`{"model":"m","messages":[{"role":"system","content":"Be brief.\nReally."},{"role":"user","content":[{"type":"text","text":"caf\u00e9 \ud83d\ude00 \"q\""},` + image + `]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":[1,2]}"}},{"function":{"arguments":{"y":"é"},"name":"g"}}]},` +
		`{"content":"result","role":"tool","tool_call_id":"c1"},{"role":"user","content":"thanks"}],"max_tokens":64,"stream":true,"prompt_cache_key":"s1"}`,
	`{"model":"claude","system":[{"type":"text","text":"sys"},{"text":"tem","type":"text"}],"messages":[{"role":"user","content":"q"},` +
		`{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"tool_use","id":"x","name":"g","input":{"k":"vé\u00e9","n":[1,{}]}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"x","content":[{"type":"text","text":"42"},{"type":"image","source":{"data":"AA=="}}]}]}],"max_tokens":1024}`,
	"{\n  \"prompt\" : [ \"a\\nb\" , \"caf\xc3\xa9\", [ 1 , 22 ], 333 , 4444 ] ,\n  \"max_tokens\" : 7\n}\n",
	`{"text":["x\ty","\ud83d\ude00z"],"sampling_params":{"max_new_tokens":3}}`,
	"{\"prompt\":\"bad \xff\xe4\x41 utf-8 and \\q escapes \\u12G4 \\ud800 lone\"}",
	`{"model":"m","instructions":"Be \"brief\".","tools":[{"type":"function","name":"f","parameters":{"a":"é"}}],"input":[{"role":"user","content":[{"type":"input_text","text":"q"},` + inputImage + `]},` +
		`{"type":"reasoning","summary":[{"type":"summary_text","text":"think"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{\"a\":1}"},` +
		`{"type":"function_call_output","call_id":"c","output":"42"},{"type":"item_reference","id":"i"},{"role":"assistant","content":"done"}],"max_output_tokens":9}`,
	`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"input":[{"role":"user","content":"q"}],"store":false}`,
	`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"system","content":"S"},{"role":"user","content":[{"type":"text","text":"q"},` + image + `]}]}`,
	`{"system":"S","tools":[{"name":"f","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"AAAA"}},{"type":"text","text":"q"}]}]}`,
	`{"input_ids":[[1,22],[333]],"sampling_params":{"max_new_tokens":3}}`,
	`{"model":"tiny","messages":[{"role":"user","content":"q","images":["AAAA","BBBB"]},{"role":"assistant","content":"a","tool_calls":[{"function":{"name":"f","arguments":{"k":1}}}],"images":["CC"]}],"options":{"num_predict":4}}`,
	`{"model":"tiny","raw":false,"context":[1,22,333],"system":"S","images":["AA==","BB=="],"prompt":"caf\u00e9","options":{"num_predict":4}}`,
}

// TestParsePrefix cuts bodies at every byte: each cut's Text is a prefix of the next cut's,
// and of the whole body's.
func TestParsePrefix(t *testing.T) {
	for _, body := range prefixBodies {
		full := Parse([]byte(body), false)
		if full.Format == None || full.Text == "" {
			t.Fatalf("Parse(%q) = %s, want a request", body, show(full))
		}
		prev := ""
		for i := range len(body) + 1 {
			got := Parse([]byte(body[:i]), true)
			if !strings.HasPrefix(full.Text, got.Text) {
				t.Fatalf("cut at %d of %q:\n text %q\n not a prefix of %q", i, body, got.Text, full.Text)
			}
			if !strings.HasPrefix(got.Text, prev) {
				t.Fatalf("cut at %d of %q:\n text %q\n does not extend %q", i, body, got.Text, prev)
			}
			if got.Model != "" && got.Model != full.Model {
				t.Fatalf("cut at %d of %q: model %q, want %q or none", i, body, got.Model, full.Model)
			}
			if !utf8.ValidString(got.Text) {
				t.Fatalf("cut at %d of %q: invalid UTF-8 text %q", i, body, got.Text)
			}
			prev = got.Text
		}
		if got := Parse([]byte(body), true); got.Text != full.Text {
			t.Errorf("whole body parsed as truncated: %q, want %q", got.Text, full.Text)
		}
	}
}

// conversation returns the OpenAI and Anthropic bodies of a conversation after each turn.
func conversation(turns int) (openai, anthropic [][]byte) {
	type part struct {
		Type  string         `json:"type"`
		Text  string         `json:"text,omitempty"`
		Name  string         `json:"name,omitempty"`
		Input map[string]any `json:"input,omitempty"`
	}
	var oai, ant []map[string]any
	for i := range turns {
		q := fmt.Sprintf("Question %d: what is \"%d\" squared?\nThink step by step.", i, i)
		a := fmt.Sprintf("It is %d. 🎉", i*i)
		oai = append(oai, map[string]any{"role": "user", "content": q})
		ant = append(ant, map[string]any{"role": "user", "content": []part{{Type: "text", Text: q}}})
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": append([]map[string]any{{"role": "system", "content": "Be exact."}}, oai...)})
		openai = append(openai, b)
		b, _ = json.Marshal(map[string]any{"model": "m", "system": "Be exact.", "messages": ant})
		anthropic = append(anthropic, b)
		oai = append(oai, map[string]any{"role": "assistant", "content": a, "tool_calls": []any{
			map[string]any{"id": "c", "type": "function", "function": map[string]any{"name": "square", "arguments": fmt.Sprintf(`{"n":%d}`, i)}},
		}})
		ant = append(ant, map[string]any{"role": "assistant", "content": []part{
			{Type: "text", Text: a}, {Type: "tool_use", Name: "square", Input: map[string]any{"n": i}},
		}})
	}
	return openai, anthropic
}

func TestTurnPrefix(t *testing.T) {
	openai, anthropic := conversation(6)
	for name, bodies := range map[string][][]byte{"openai": openai, "anthropic": anthropic} {
		prev := ""
		for i, body := range bodies {
			got := Parse(body, false)
			if got.Format == None || !strings.HasPrefix(got.Text, prev) || len(got.Text) <= len(prev) {
				t.Fatalf("%s turn %d: text %q does not extend turn %d's %q", name, i, got.Text, i-1, prev)
			}
			prev = got.Text
		}
	}
	// The same conversation through either API reads the same, tool calls aside.
	o, a := Parse(openai[0], false), Parse(anthropic[0], false)
	if o.Text != a.Text {
		t.Errorf("first turn: openai %q, anthropic %q", o.Text, a.Text)
	}
}

func TestParseHuge(t *testing.T) {
	big := strings.Repeat("All work and no play makes Jack a dull boy.\\n", 200_000) // ~9 MB
	body := `{"model":"m","messages":[{"role":"user","content":"` + big + `"}]}`
	got := Parse([]byte(body), false)
	want := msg("user", strings.ReplaceAll(big, `\n`, "\n"))
	if got.Format != Chat || got.Text != want {
		t.Errorf("huge content: format %v, %d bytes of text, want %d", got.Format, len(got.Text), len(want))
	}

	session := strings.Repeat("s", 1<<20)
	got = Parse([]byte(`{"prompt":"x","prompt_cache_key":"`+session+`"}`), false)
	if got.Session != session {
		t.Errorf("1 MiB session id: got %d bytes", len(got.Session))
	}
}

func TestParseDeep(t *testing.T) {
	for _, n := range []int{100_000, MaxDepth} {
		for _, body := range []string{
			`{"prompt":"x","metadata":` + strings.Repeat(`[`, n) + strings.Repeat(`]`, n) + `}`,
			`{"prompt":"x","metadata":` + strings.Repeat(`{"a":`, n) + `1` + strings.Repeat(`}`, n) + `}`,
			strings.Repeat(`[`, n),
			`{"messages":[{"role":"user","content":[{"type":"tool_use","input":` + strings.Repeat(`[`, n) + strings.Repeat(`]`, n) + `}]}]}`,
			`{"tools":` + strings.Repeat(`[`, n) + strings.Repeat(`]`, n) + `,"messages":[]}`,
			`{"input":[{"type":"function_call","arguments":` + strings.Repeat(`{"a":`, n) + `1` + strings.Repeat(`}`, n) + `}],"instructions":""}`,
		} {
			for _, truncated := range []bool{false, true} {
				if got := Parse([]byte(body), truncated); got.Format != None {
					t.Errorf("%d levels (%.20q...): got %v, want none", n, body, got.Format)
				}
			}
		}
	}
	ok := `{"prompt":"x","metadata":` + strings.Repeat(`[`, MaxDepth-1) + strings.Repeat(`]`, MaxDepth-1) + `}`
	if got := Parse([]byte(ok), false); got.Format != Completion {
		t.Errorf("%d levels: got %v, want %v", MaxDepth, got.Format, Completion)
	}
}

// TestParseBound checks the output bound on bodies built to inflate it.
func TestParseBound(t *testing.T) {
	for _, body := range []string{
		`{"messages":[{"content":[` + strings.Repeat(`{},`, 1000) + `{}]}]}`,
		`{"messages":[` + strings.Repeat(`{},`, 1000) + `{}]}`,
		`{"system":[` + strings.Repeat(`{},`, 1000) + `{}],"messages":[]}`,
		"{\"prompt\":\"" + strings.Repeat("\xff", 1000) + "\"}",
		`{"prompt":[` + strings.Repeat(`1,`, 1000) + `1]}`,
		`{"messages":[{"tool_calls":[` + strings.Repeat(`{"function":{}},`, 1000) + `{}]}]}`,
		`{"input":[` + strings.Repeat(`{"type":""},`, 1000) + `{}]}`,
		`{"input":[` + strings.Repeat(`{},`, 1000) + `{}],"instructions":""}`,
		`{"input":[` + strings.Repeat(`{"type":"reasoning","summary":[{},{}],"content":[{}]},`, 300) + `{}]}`,
		`{"input":[{"type":"function_call_output","output":[` + strings.Repeat(`{},`, 1000) + `{}]}]}`,
		"{\"tools\":[\"" + strings.Repeat("\xff", 1000) + "\"],\"messages\":[]}",
		`{"input_ids":[` + strings.Repeat(`1,`, 1000) + `1]}`,
	} {
		got := Parse([]byte(body), false)
		if got.Format == None || len(got.Text) > 4*len(body) {
			t.Errorf("%.30q...: format %v, %d bytes of text from %d", body, got.Format, len(got.Text), len(body))
		}
	}
}

func TestParseDoesNotKeepBody(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"abc","prompt_cache_key":"s"}`)
	got := Parse(body, false)
	copy(body, bytes.Repeat([]byte("x"), len(body)))
	if got.Model != "m" || got.Text != "abc" || got.Session != "s" {
		t.Errorf("result changed with the body: %s", show(got))
	}
}

func TestCountRunes(t *testing.T) {
	for _, s := range []string{"", "a", "héllo wörld", "日本語のテキスト", "emoji 😀🎉 and \x00 and \n", strings.Repeat("abcdefg", 100) + "é", strings.Repeat("ü", 33)} {
		if got, want := countRunes(s), utf8.RuneCountInString(s); got != want {
			t.Errorf("countRunes(%q) = %d, want %d", s, got, want)
		}
	}
}

func FuzzCountRunes(f *testing.F) {
	f.Add("héllo 日本 😀")
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		if got, want := countRunes(s), utf8.RuneCountInString(s); got != want {
			t.Fatalf("countRunes(%q) = %d, want %d", s, got, want)
		}
	})
}
