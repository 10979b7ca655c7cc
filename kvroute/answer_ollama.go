package kvroute

import (
	"bytes"
	"time"
)

// Ollama's own API (/api/chat, /api/generate) answers in newline-delimited JSON when it
// streams (application/x-ndjson) and in one JSON object when it does not. The last object
// carries its figures at the top level: prompt_eval_count (the prompt's tokens, cached ones
// included), prompt_eval_duration (the time it spent on the prompt, in nanoseconds: short when
// the prefix was cached), eval_count (the answer's tokens) and eval_duration. Releases up to
// v0.6.5, the one examples/ollama pins, report no cached tokens, on this API or on its OpenAI
// one. Later ones add prompt_eval_cached_count, the prompt tokens read from the prompt cache
// (Ollama's API reference: "number of prompt tokens read from the prompt cache, when
// available"; prompt_eval_duration is then the time spent on the others), and carry it into
// their OpenAI endpoint's prompt_tokens_details.cached_tokens. It is written only when not 0
// (omitempty), so an answer without it may be a release without the field or a prompt with
// nothing cached: without it the cached tokens stay unknown.

// maxDurationNS bounds a duration in nanoseconds: more than 3 hours on one prompt is no engine's.
const maxDurationNS = 1e13

// ollamaField maps a top-level key of Ollama's answer to the field it holds.
func ollamaField(path []byte) usageField {
	switch string(path) {
	case "prompt_eval_count":
		return fOllamaPromptN
	case "prompt_eval_duration":
		return fOllamaPromptNS
	case "prompt_eval_cached_count":
		return fOllamaCachedN
	case "eval_count":
		return fOutputTokens
	}
	return fNone
}

// isOllamaContentPath reports whether a non-empty string at path is generated content in an
// Ollama answer: the chat message's content, thinking or a tool call's name, generate's response.
func isOllamaContentPath(path []byte) bool {
	switch string(path) {
	case "message.content", "message.thinking", "message.tool_calls[].function.name", "response", "thinking":
		return true
	}
	return false
}

// parseField parses the number of usage field f: a duration in nanoseconds a whole number up to
// maxDurationNS, else as parseCount.
func parseField(f usageField, b []byte, long bool) (float64, bool) {
	if f != fOllamaPromptNS {
		return parseCount(b, long, f == fTimingsPromptMS)
	}
	if long || len(b) == 0 || len(b) > 14 {
		return 0, false
	}
	v := 0.0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + float64(c-'0')
	}
	return v, v <= maxDurationNS
}

// ollamaUsage is the usage of Ollama's final object: its prompt's tokens and the time it spent
// on them, and, from a release that says so, how many were cached: as llama.cpp's timings, the
// tokens it computed (the others) in the time it reports. Without prompt_eval_cached_count
// cachedKnown stays false. Its output tokens (eval_count) usageOf reads as every engine's.
func ollamaUsage(h *[numUsageFields]bool, n *[numUsageFields]float64) usage {
	u := usage{prompt: n[fOllamaPromptN]}
	if h[fOllamaPromptNS] {
		u.prefillMS = n[fOllamaPromptNS] / 1e6
	}
	if h[fOllamaCachedN] {
		u.cached, u.cachedKnown = n[fOllamaCachedN], true
		if h[fOllamaPromptNS] {
			u.computed = max(0, u.prompt-u.cached)
		}
	}
	return u
}

// ndjson splits p into lines, each a JSON document for the scanner (Ollama's stream: one
// object per line). A line over maxEvent is given up, the lines after it still read.
func (o *answerObserver) ndjson(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			o.ndjsonFeed(p)
			return
		}
		o.ndjsonFeed(p[:i])
		o.ndjsonEnd()
		p = p[i+1:]
	}
}

func (o *answerObserver) ndjsonFeed(b []byte) {
	if o.gaveUp || len(b) == 0 {
		return
	}
	if o.read+int64(len(b)) > maxEvent {
		o.gaveUp = true
		return
	}
	o.read += int64(len(b))
	o.dataLines = 1
	o.sc.write(b)
}

// ndjsonEnd takes in the line just ended; an empty line is nothing.
func (o *answerObserver) ndjsonEnd() {
	switch {
	case o.dataLines == 0 && !o.gaveUp:
		return
	case o.gaveUp || !o.sc.end():
		o.gaveUps++
	default:
		o.takeEvent(&o.res)
	}
	o.res.reset()
	o.sc.reset(&o.res)
	o.read, o.dataLines, o.gaveUp = 0, 0, false
}

// ndjsonFinish ends the stream: a last line without its newline counts when it is whole JSON.
func (o *answerObserver) ndjsonFinish() {
	if o.dataLines > 0 || o.gaveUp {
		o.ndjsonEnd()
	}
}

// coldPrefill fills in what an answer that reports its prompt but not its cached tokens (Ollama,
// on either API) can teach about prefill speed: when the decision expected nothing cached on the
// upstream (less than minMatchRunes of its text), the engine computed the whole prompt, in the
// time it reports (Ollama's prompt_eval_duration) or, without one, in the time to the first
// content (queueing included: learnAnswer keeps a median). Otherwise, or when the engine reports
// what it computed, u is returned as it is.
func coldPrefill(p *prediction, u usage, ttft time.Duration, hasTTFT bool) usage {
	if !u.ok || u.cachedKnown || u.computed > 0 || p.matched >= minMatchRunes {
		return u
	}
	switch {
	case u.prefillMS > 0:
	case hasTTFT && ttft.Seconds() >= minSampleSeconds:
		u.prefillMS = float64(ttft) / float64(time.Millisecond)
	default:
		return u
	}
	u.computed = u.prompt
	return u
}
