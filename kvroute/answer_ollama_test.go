package kvroute

import (
	"testing"
	"time"
)

// Ollama's answers, as v0.6.5 writes them: /api/chat and /api/generate streamed (NDJSON) and
// not, and its OpenAI endpoint (usage without cached tokens); then as releases that report the
// prompt tokens read from the cache write them (prompt_eval_cached_count, after
// prompt_eval_count in the final object's metrics; see ollamaField).
var ollamaAnswerCases = []struct {
	name        string
	kind        answerKind
	body        string
	want        usage
	wantContent bool
}{
	{"chat stream", answerNDJSON,
		`{"model":"tiny","created_at":"2026-12-05T08:40:00.1Z","message":{"role":"assistant","content":""},"done":false}` + "\n" +
			`{"model":"tiny","created_at":"2026-12-05T08:40:00.2Z","message":{"role":"assistant","content":" pe"},"done":false}` + "\n" +
			`{"model":"tiny","created_at":"2026-12-05T08:40:00.3Z","message":{"role":"assistant","content":""},"done_reason":"length","done":true,` +
			`"total_duration":161755423,"load_duration":1904552,"prompt_eval_count":1187,"prompt_eval_duration":151034000,"eval_count":4,"eval_duration":8015000}` + "\n",
		usage{ok: true, prompt: 1187, prefillMS: 151.034, output: 4, outputKnown: true}, true},
	{"chat stream, last line without newline", answerNDJSON,
		`{"message":{"role":"assistant","content":"x"},"done":false}` + "\n" +
			`{"message":{"role":"assistant","content":""},"done":true,"prompt_eval_count":20,"prompt_eval_duration":2000000,"eval_count":5000}`,
		usage{ok: true, prompt: 20, prefillMS: 2, output: 5000, outputKnown: true}, true},
	{"chat stream, empty content only", answerNDJSON,
		`{"message":{"role":"assistant","content":""},"done":false}` + "\r\n\n", usage{}, false},
	{"chat stream cut mid-line", answerNDJSON,
		`{"message":{"role":"assistant","content":"x"},"done":false}` + "\n" + `{"done":true,"prompt_eval_count":20,"prompt_e`,
		usage{}, true},
	{"chat json", answerJSON,
		`{"model":"tiny","created_at":"2026-12-05T08:40:00.3Z","message":{"role":"assistant","content":" pe al"},"done_reason":"length","done":true,` +
			`"total_duration":40000000,"load_duration":100000,"prompt_eval_count":1200,"prompt_eval_duration":28000000,"eval_count":4,"eval_duration":8000000}`,
		usage{ok: true, prompt: 1200, prefillMS: 28, output: 4, outputKnown: true}, false},
	{"generate stream", answerNDJSON,
		`{"model":"tiny","created_at":"2026-12-05T08:40:00.1Z","response":"ab","done":false}` + "\n" +
			`{"model":"tiny","created_at":"2026-12-05T08:40:00.2Z","response":"","done":true,"done_reason":"length","context":[1,2,3],"prompt_eval_count":9,"prompt_eval_duration":1500000,"eval_count":1}` + "\n",
		usage{ok: true, prompt: 9, prefillMS: 1.5, output: 1, outputKnown: true}, true},
	{"openai endpoint", answerSSE,
		"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\" pe\"}}]}\n\n" +
			"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":1187,\"completion_tokens\":4,\"total_tokens\":1191}}\n\n" +
			"data: [DONE]\n\n",
		usage{ok: true, prompt: 1187, output: 4, outputKnown: true}, true},
	{"a duration of 3 hours and more is a lie", answerJSON,
		`{"done":true,"prompt_eval_count":9,"prompt_eval_duration":99999999999999}`, usage{lies: true}, false},
	{"a fractional duration is a lie", answerJSON,
		`{"done":true,"prompt_eval_count":9,"prompt_eval_duration":1.5}`, usage{lies: true}, false},
	{"counts nested elsewhere are not the answer's", answerNDJSON,
		`{"message":{"content":"x","prompt_eval_count":5,"eval_count":7,"prompt_eval_cached_count":3}}` + "\n", usage{}, true},
	{"no eval_count: output unknown", answerJSON,
		`{"done":true,"prompt_eval_count":9,"prompt_eval_duration":1500000}`,
		usage{ok: true, prompt: 9, prefillMS: 1.5}, false},
	{"an eval_count that is no count is a lie", answerJSON,
		`{"done":true,"prompt_eval_count":9,"eval_count":-4}`, usage{lies: true}, false},
	// Releases with prompt_eval_cached_count: the cached tokens are read as every other engine's
	// (the prompt count includes them), and prompt_eval_duration is the time spent on the rest.
	{"chat stream with cached tokens", answerNDJSON,
		`{"model":"tiny","created_at":"2026-06-25T16:21:08.1Z","message":{"role":"assistant","content":"The"},"done":false}` + "\n" +
			`{"model":"tiny","created_at":"2026-06-25T16:21:08.3Z","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,` +
			`"total_duration":161755423,"load_duration":1904552,"prompt_eval_count":1187,"prompt_eval_cached_count":1024,"prompt_eval_duration":15103400,"eval_count":259,"eval_duration":8015000}` + "\n",
		usage{ok: true, prompt: 1187, cached: 1024, cachedKnown: true, computed: 163, prefillMS: 15.1034, output: 259, outputKnown: true}, true},
	{"generate json with cached tokens", answerJSON,
		`{"model":"tiny","created_at":"2026-06-25T16:21:08.3Z","response":"The sky is blue.","done":true,"done_reason":"stop","context":[1,2,3],` +
			`"total_duration":5043500667,"load_duration":5025959,"prompt_eval_count":26,"prompt_eval_cached_count":26,"prompt_eval_duration":325953000,"eval_count":290,"eval_duration":4709213000}`,
		usage{ok: true, prompt: 26, cached: 26, cachedKnown: true, prefillMS: 325.953, output: 290, outputKnown: true}, false},
	{"cached tokens without a duration", answerJSON,
		`{"done":true,"prompt_eval_count":40,"prompt_eval_cached_count":32,"eval_count":5}`,
		usage{ok: true, prompt: 40, cached: 32, cachedKnown: true, output: 5, outputKnown: true}, false},
	{"more cached than the prompt is a lie", answerJSON,
		`{"done":true,"prompt_eval_count":40,"prompt_eval_cached_count":41,"eval_count":5}`, usage{lies: true}, false},
}

func TestAnswerObserverOllama(t *testing.T) {
	for _, tc := range ollamaAnswerCases {
		t.Run(tc.name, func(t *testing.T) {
			splits := []int{len(tc.body)}
			for i := 1; i < len(tc.body); i++ {
				splits = append(splits, i)
			}
			for _, at := range splits {
				var o answerObserver
				o.begin(tc.kind, false)
				firsts := 0
				for _, part := range []string{tc.body[:at], tc.body[at:]} {
					if o.write([]byte(part)) {
						firsts++
					}
				}
				if got := o.finish(); got != tc.want {
					t.Fatalf("split at %d: got %+v, want %+v", at, got, tc.want)
				}
				if wantFirsts := map[bool]int{true: 1, false: 0}[tc.wantContent]; firsts != wantFirsts {
					t.Fatalf("split at %d: first content reported %d times, want %d", at, firsts, wantFirsts)
				}
			}
		})
	}
}

// TestAnswerObserverOllamaFirstContent: the first token of a stream is the first line with
// content, not the first byte (a role-only line comes first).
func TestAnswerObserverOllamaFirstContent(t *testing.T) {
	var o answerObserver
	o.begin(answerNDJSON, false)
	if o.write([]byte(`{"message":{"role":"assistant","content":""},"done":false}` + "\n")) {
		t.Fatal("a line without content reported as the first content")
	}
	if !o.write([]byte(`{"message":{"role":"assistant","content":"a"},"done":false}` + "\n")) {
		t.Fatal("the first line with content not reported")
	}
	if o.write([]byte(`{"message":{"role":"assistant","content":"b"},"done":false}` + "\n")) {
		t.Fatal("a second line reported as the first content")
	}
}

// TestColdPrefill: an answer without cached tokens teaches prefill speed only when the decision
// expected nothing cached: from the engine's own prompt time, else from the time to first token.
func TestColdPrefill(t *testing.T) {
	ollama := usage{ok: true, prompt: 1200, prefillMS: 150}
	openai := usage{ok: true, prompt: 1200}
	cold, warm := &prediction{matched: 0}, &prediction{matched: 5000}
	for _, tc := range []struct {
		name    string
		p       *prediction
		u       usage
		ttft    time.Duration
		hasTTFT bool
		want    usage
	}{
		{"ollama cold", cold, ollama, 0, false, usage{ok: true, prompt: 1200, prefillMS: 150, computed: 1200}},
		{"ollama warm: what it computed is unknown", warm, ollama, 0, false, ollama},
		{"openai cold, from ttft", cold, openai, 300 * time.Millisecond, true, usage{ok: true, prompt: 1200, prefillMS: 300, computed: 1200}},
		{"openai cold, ttft too short to time", cold, openai, 500 * time.Microsecond, true, openai},
		{"openai cold without a first token", cold, openai, 0, false, openai},
		{"cached tokens known: left alone", cold, usage{ok: true, prompt: 1200, cached: 0, cachedKnown: true}, time.Second, true,
			usage{ok: true, prompt: 1200, cachedKnown: true}},
		{"llama.cpp's own count: left alone", cold, usage{ok: true, prompt: 1200, computed: 100, prefillMS: 20}, time.Second, true,
			usage{ok: true, prompt: 1200, computed: 100, prefillMS: 20}},
		{"no usage", cold, usage{}, time.Second, true, usage{}},
	} {
		if got := coldPrefill(tc.p, tc.u, tc.ttft, tc.hasTTFT); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
