package llmreq

import (
	"encoding/binary"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// Format is the API a request body is written for, as told by its fields.
type Format uint8

const (
	None           Format = iota // not an LLM request this package understands
	Chat                         // OpenAI /v1/chat/completions (messages)
	Messages                     // Anthropic /v1/messages (messages + system, or Anthropic-only fields)
	Completion                   // OpenAI /v1/completions (prompt)
	Generate                     // SGLang /generate (text or input_ids)
	Responses                    // OpenAI /v1/responses (instructions, tools, input)
	OllamaChat                   // Ollama /api/chat (messages, with Ollama's fields or path)
	OllamaGenerate               // Ollama /api/generate (prompt, with system, Ollama's fields or path)
)

var formatNames = [...]string{
	None:           "none",
	Chat:           "openai_chat",
	Messages:       "anthropic_messages",
	Completion:     "openai_completion",
	Generate:       "sglang_generate",
	Responses:      "openai_responses",
	OllamaChat:     "ollama_chat",
	OllamaGenerate: "ollama_generate",
}

func (f Format) String() string {
	if int(f) < len(formatNames) {
		return formatNames[f]
	}
	return "Format(" + strconv.Itoa(int(f)) + ")"
}

// Request is what routing needs from an LLM request body.
type Request struct {
	Format Format
	// Model is the body's model field; "" when absent or not a string.
	Model string
	// Text is the routing text (see the package documentation); "" when none. It is valid UTF-8.
	Text string
	// Runes is the length of Text in runes (Unicode code points).
	Runes int
	// Session is the body field prompt_cache_key (OpenAI); "" when absent. It is kept whole,
	// however long: the caller bounds it.
	Session string
	// PreviousResponseID is a Responses follow-up's previous_response_id (the stored response it
	// continues); "" when absent. Kept whole, like Session.
	PreviousResponseID string
	// MaxTokens is max_completion_tokens, else max_tokens, else max_output_tokens (Responses),
	// else SGLang's sampling_params.max_new_tokens, else Ollama's options.num_predict; 0 when
	// absent or not a whole number in [1, 2^31-1].
	MaxTokens int
	// Stream is the body's stream field: false unless it is true, except in Ollama's own API
	// (OllamaChat, OllamaGenerate), which streams unless it is false.
	Stream bool
	// Truncated says the body was cut at the read limit; Text is a prefix of the full text.
	Truncated bool
}

// Parse extracts the LLM request from body.
//
// truncated says body is only the first bytes of a longer body: Parse then recovers what it can
// (the model if seen, the messages read so far, including the partial text of the message being
// read) instead of failing. The Text of a truncated body is a prefix of the Text of the whole
// body when both have the same Format, no key appears twice in an object, and Anthropic's
// system, if any, comes before messages.
//
// A body that is not a JSON object, or is not JSON (cut short while truncated is false, nested
// deeper than 1000 levels, trailing garbage), gives the zero Request. A JSON object without
// messages, prompt or text gives Format None but still fills Model, Session, MaxTokens and
// Stream. When a key appears twice the last one counts, as in the Python servers behind it.
//
// Parse never panics, runs in one pass, and its output is at most 4 times len(body) bytes.
func Parse(body []byte, truncated bool) Request {
	return ParseAs(body, truncated, None)
}

// ParseAs is Parse for a body sent to the API hint names, as Hint tells it from the request's
// path and headers: Messages labels a chat body Messages (an Anthropic body may have no field
// only Anthropic has), Responses reads an input that no Responses-only field tells from the
// input of embeddings. The fields still decide: a body with messages is a chat body whatever
// the hint. Other hints change nothing.
func ParseAs(body []byte, truncated bool, hint Format) Request {
	p := parsers.Get().(*parser)
	defer p.release()
	p.scanner = scanner{b: body, trunc: truncated, key: p.key}
	p.hint = hint
	r := p.parse()
	r.Runes = countRunes(r.Text)
	return r
}

// countRunes counts the runes of valid UTF-8 text eight bytes at a time: every byte that is not
// a continuation byte (10xxxxxx) starts a rune. utf8.RuneCountInString takes about 1 ns a byte,
// a fair share of a routing decision on long prompts.
func countRunes(s string) int {
	const lo = 0x0101010101010101
	cont := 0
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := binary.LittleEndian.Uint64([]byte(s[i : i+8]))
		if w&(lo*0x80) == 0 {
			continue // all ASCII
		}
		cont += bits.OnesCount64((w >> 7) &^ (w >> 6) & lo)
	}
	for ; i < len(s); i++ {
		if s[i]&0xC0 == 0x80 {
			cont++
		}
	}
	return len(s) - cont
}

var parsers = sync.Pool{New: func() any { return new(parser) }}

// keepScratch is the largest scratch buffer a pooled parser keeps between calls.
const keepScratch = 256 << 10

func (p *parser) release() {
	p.scanner.b = nil
	for _, b := range []*[]byte{
		&p.key, &p.model, &p.session, &p.prev, &p.num, &p.role, &p.content, &p.tools, &p.name, &p.args,
		&p.typ, &p.fname, &p.fargs, &p.fin, &p.output, &p.summary,
		&p.msgs, &p.sys, &p.prompt, &p.text, &p.defs, &p.instr, &p.input, &p.ids, &p.images, &p.gimages, &p.ctxIDs,
		&p.lv[0].name, &p.lv[0].nested, &p.lv[1].name, &p.lv[1].nested,
	} {
		if cap(*b) > keepScratch {
			*b = nil
		} else {
			*b = (*b)[:0]
		}
	}
	parsers.Put(p)
}

// Hint tells the API a request is sent to from its path and headers, for ParseAs: Messages for
// a path ending in /v1/messages or a request with an anthropic-version header (Anthropic's
// SDKs send it), Responses for a path ending in /v1/responses, OllamaChat and OllamaGenerate
// for paths ending in /api/chat and /api/generate, None otherwise.
func Hint(r *http.Request) Format {
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case strings.HasSuffix(path, "/v1/messages") || r.Header.Get("Anthropic-Version") != "": // the canonical key: looked up without a copy
		return Messages
	case strings.HasSuffix(path, "/v1/responses"):
		return Responses
	case strings.HasSuffix(path, "/api/chat"):
		return OllamaChat
	case strings.HasSuffix(path, "/api/generate"):
		return OllamaGenerate
	}
	return None
}
