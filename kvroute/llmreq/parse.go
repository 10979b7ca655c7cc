package llmreq

import (
	"hash/crc32"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The routing text's separators (see the package documentation). JSON strings must escape
// these control characters, so real prompts practically never contain them.
const (
	roleEnd     = '\x1f'   // unit separator: ends a message's role
	messageEnd  = '\x1e'   // record separator: ends a message
	placeholder = "\uFFFC" // starts the stand-in for a non-text part
)

// partLevels is how deep content parts nest (a tool_result's content is one level down).
const partLevels = 2

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type parser struct {
	scanner

	hint Format // what the request's path or headers say it is (None: nothing)

	// Scratch buffers, reused across calls through the pool.
	model, session, num     []byte
	prev                    []byte // previous_response_id
	role, content, tools    []byte // the message being read
	typ, fname, fargs, fin  []byte // the Responses input item being read
	output, summary         []byte // ... its output (function_call_output) or summary (reasoning)
	name, args              []byte // the tool call being read
	msgs, sys, prompt, text []byte // top-level routing fields
	defs, instr, input, ids []byte // tools definitions, Responses instructions and input, input_ids
	images, gimages, ctxIDs []byte // a message's images; Ollama generate's images and context
	lv                      [partLevels]struct{ name, nested []byte }
}

// fields is what parse collects from the top-level object.
type fields struct {
	model, session, msgs, sys, prompt, text state
	prev                                    state
	defs, instr, input, ids                 state
	images, ctx                             state // Ollama generate's images and context

	defs0, defs1 int // where the tools definitions are in the body

	maxTokens, maxCompletion, maxOutput, maxNew int
	numPredict                                  int // Ollama's options.num_predict
	stream, anthropic                           bool
	// streamFalse says stream is false: Ollama's own API streams unless it is. ollama says a
	// field only Ollama's API has was seen; raw, that /api/generate's raw is true (the prompt
	// goes to the model as written, without the template).
	streamFalse, ollama, raw bool
	// responses says a field only the Responses API has was seen; items, that input holds an
	// object (an input item). Either tells input from the input of embeddings or moderations.
	responses, items bool
}

func (p *parser) parse() Request {
	p.ws()
	if p.pos >= len(p.b) || p.b[p.pos] != '{' {
		return Request{}
	}
	var f fields
	p.enter()
	for first := true; ; first = false {
		key, ok := p.member(first)
		if !ok {
			break
		}
		switch c := p.b[p.pos]; string(key) {
		case "model":
			p.model, f.model = p.stringValue(p.model)
		case "prompt_cache_key":
			p.session, f.session = p.stringValue(p.session)
		case "messages":
			f.msgs = absent
			if c != '[' {
				p.skipValue()
				break
			}
			p.msgs, _ = p.messages(p.msgs[:0], &f)
			f.msgs = p.state()
		case "system":
			f.sys = absent
			if c != '"' && c != '[' {
				p.skipValue()
				break
			}
			p.sys = p.contentValue(p.sys[:0], 0, &f)
			f.sys = p.state()
		case "tools":
			// The definitions as sent: chat templates render them, and the model reads them,
			// ahead of the conversation.
			f.defs = absent
			if c != '[' {
				p.skipValue()
				break
			}
			f.defs0 = p.pos
			p.skipValue()
			f.defs1 = p.pos
			f.defs = p.state()
		case "instructions":
			f.responses = true
			p.instr, f.instr = p.stringValue(p.instr)
		case "input":
			f.input = absent
			switch c {
			case '"':
				// A string input is one user message.
				p.input = append(append(p.input[:0], "user"...), roleEnd)
				p.input = p.str(p.input)
				if f.input = p.state(); f.input == done {
					p.input = append(p.input, messageEnd)
				}
			case '[':
				p.input, f.items = p.messages(p.input[:0], &f)
				f.input = p.state()
			default:
				p.skipValue()
			}
		case "max_output_tokens":
			f.responses = true
			f.maxOutput = p.tokens()
		case "previous_response_id":
			f.responses = true
			p.prev, f.prev = p.stringValue(p.prev)
		case "reasoning", "include", "conversation", "truncation", "max_tool_calls":
			f.responses = true
			p.skipValue()
		case "input_ids":
			p.ids, f.ids = p.promptValue(p.ids[:0])
		case "prompt":
			p.prompt, f.prompt = p.promptValue(p.prompt[:0])
		case "text":
			p.text, f.text = p.promptValue(p.text[:0])
		case "max_tokens":
			f.maxTokens = p.tokens()
		case "max_completion_tokens":
			f.maxCompletion = p.tokens()
		case "sampling_params":
			f.maxNew = p.samplingParams()
		case "stream":
			f.stream, f.streamFalse = c == 't', c == 'f'
			p.skipValue()
		case "options":
			f.ollama = true
			f.numPredict = p.objectTokens("num_predict")
		case "keep_alive", "format", "think", "template":
			f.ollama = true
			p.skipValue()
		case "raw":
			f.ollama = true
			f.raw = c == 't'
			p.skipValue()
		case "images":
			f.ollama = true
			p.gimages = p.imageList(p.gimages[:0], true)
			f.images = p.state()
		case "context":
			f.ollama = true
			f.ctx = absent
			if c != '[' {
				p.skipValue()
				break
			}
			p.ctxIDs = p.tokenList(p.ctxIDs[:0])
			f.ctx = p.state()
		case "anthropic_version", "stop_sequences":
			f.anthropic = true
			p.skipValue()
		default:
			p.skipValue()
		}
		if p.stop() {
			break
		}
	}
	if !p.stop() {
		p.ws()
		if p.pos != len(p.b) {
			p.bad = true
		}
	}
	if p.bad {
		return Request{}
	}

	req := Request{Truncated: p.trunc}
	if f.model == done {
		req.Model = string(p.model)
	}
	if f.session == done {
		req.Session = string(p.session)
	}
	if f.prev == done {
		req.PreviousResponseID = string(p.prev)
	}
	switch {
	case f.maxCompletion > 0:
		req.MaxTokens = f.maxCompletion
	case f.maxTokens > 0:
		req.MaxTokens = f.maxTokens
	case f.maxOutput > 0:
		req.MaxTokens = f.maxOutput
	case f.maxNew > 0:
		req.MaxTokens = f.maxNew
	default:
		req.MaxTokens = f.numPredict
	}
	req.Stream = f.stream
	responses := p.hint == Responses || f.responses || f.items
	// Ollama's /api/generate: a prompt with a system prompt (OpenAI completions have none) or a
	// field only Ollama has, or sent to /api/generate; a cut body without its prompt yet, once
	// its system prompt, context or images are read.
	generate := f.msgs == absent && (f.prompt != absent && (f.ollama || f.sys != absent || p.hint == OllamaGenerate) ||
		p.trunc && (f.ollama || p.hint == OllamaGenerate) && (f.sys != absent || f.ctx != absent || f.images != absent))
	switch {
	case generate:
		req.Format = OllamaGenerate
		req.Text = p.generateText(&f)
	case f.msgs != absent || p.trunc && f.sys != absent:
		req.Format = p.chatFormat(&f)
		req.Text = p.routingText(p.sys, f.sys, &f, p.msgs, f.msgs)
	case responses && (f.input != absent || f.instr != absent):
		req.Format = Responses
		req.Text = p.routingText(p.instr, f.instr, &f, p.input, f.input)
	case p.trunc && f.defs != absent:
		// Cut with only tool definitions read: the conversation comes after them.
		if req.Format = p.chatFormat(&f); responses {
			req.Format = Responses
		}
		req.Text = p.routingText(nil, absent, &f, nil, absent)
	case f.prompt != absent:
		req.Format = Completion
		req.Text = string(p.prompt)
	case f.text != absent:
		req.Format = Generate
		req.Text = string(p.text)
	case f.ids != absent:
		req.Format = Generate
		req.Text = string(p.ids)
	}
	if req.Format == OllamaChat || req.Format == OllamaGenerate {
		req.Stream = !f.streamFalse
	}
	return req
}

// chatFormat tells Anthropic messages from OpenAI chat: by the fields only Anthropic has, else
// by the path or headers (an Anthropic body may have neither system nor tool blocks).
func (p *parser) chatFormat(f *fields) Format {
	if f.anthropic || f.sys != absent || p.hint == Messages {
		return Messages
	}
	if f.ollama || p.hint == OllamaChat {
		return OllamaChat
	}
	return Chat
}

// generateText is the routing text of an Ollama /api/generate body, in the order Ollama's
// template sees it: the context (an earlier answer's token ids, as a message of role
// "context"), the system prompt as a system message, each image as a user message, then the
// prompt as a user message; a chat of [system, user] reads the same. A raw prompt goes to the
// model as written: it is the text. A field the body ends inside ends the text.
func (p *parser) generateText(f *fields) string {
	if f.raw {
		return string(p.prompt)
	}
	var sb strings.Builder
	sb.Grow(len("context") + len(p.ctxIDs) + len("system") + len(p.sys) + len(p.gimages) + len("user") + len(p.prompt) + 8)
	msg := func(role string, body []byte, st state) bool {
		sb.WriteString(role)
		sb.WriteByte(roleEnd)
		sb.Write(body)
		if st == partial {
			return false
		}
		sb.WriteByte(messageEnd)
		return true
	}
	if f.ctx != absent && !msg("context", p.ctxIDs, f.ctx) {
		return sb.String()
	}
	if f.sys != absent && !msg("system", p.sys, f.sys) {
		return sb.String()
	}
	if f.images != absent {
		sb.Write(p.gimages)
		if f.images == partial {
			return sb.String()
		}
	}
	if f.prompt != absent {
		msg("user", p.prompt, f.prompt)
	}
	return sb.String()
}

// imageList appends the placeholders of an array of images (Ollama sends each as a base64
// string): each one's placeholder, joined by "\n", or with messages each as a user message.
// An image the body ends inside gives nothing.
func (p *parser) imageList(dst []byte, messages bool) []byte {
	if p.b[p.pos] != '[' {
		p.skipValue()
		return dst
	}
	p.enter()
	start := len(dst)
	for first := true; p.element(first); first = false {
		v := p.pos
		p.skipValue()
		if p.stop() {
			break
		}
		if messages {
			dst = append(dst, "user"...)
			dst = append(dst, roleEnd)
			dst = appendPlaceholder(dst, p.b[v:p.pos])
			dst = append(dst, messageEnd)
			continue
		}
		if len(dst) > start {
			dst = append(dst, '\n')
		}
		dst = appendPlaceholder(dst, p.b[v:p.pos])
	}
	return dst
}

// routingText joins what comes ahead of the conversation, a system prompt (Anthropic's system,
// the Responses instructions) serialized as a system message and the tool definitions as a
// message with role "tools", and the conversation (messages or input). A field the body ends
// inside ends the text: everything after it in the text comes after it in the body.
func (p *parser) routingText(sys []byte, sysSt state, f *fields, conv []byte, convSt state) string {
	if convSt == absent {
		conv = nil
	}
	if sysSt == absent && f.defs == absent {
		return string(conv)
	}
	// The tools go into the text from the body, as written, when they are valid UTF-8 (they
	// practically always are), else through appendValid.
	defs := p.b[f.defs0:f.defs1]
	if !utf8.Valid(defs) {
		p.defs = appendValid(p.defs[:0], defs, f.defs == partial)
		defs = p.defs
	}
	var sb strings.Builder
	sb.Grow(len("system") + len(sys) + len("tools") + len(defs) + len(conv) + 4)
	if sysSt != absent {
		sb.WriteString("system")
		sb.WriteByte(roleEnd)
		sb.Write(sys)
		if sysSt == partial {
			return sb.String()
		}
		sb.WriteByte(messageEnd)
	}
	if f.defs != absent {
		sb.WriteString("tools")
		sb.WriteByte(roleEnd)
		sb.Write(defs)
		if f.defs == partial {
			return sb.String()
		}
		sb.WriteByte(messageEnd)
	}
	sb.Write(conv)
	return sb.String()
}

// stringValue reads a string value into buf; any other value makes the field absent.
func (p *parser) stringValue(buf []byte) ([]byte, state) {
	if p.b[p.pos] != '"' {
		p.skipValue()
		return buf[:0], absent
	}
	buf = p.str(buf[:0])
	return buf, p.state()
}

// word reads a short string value (a role, a type) and returns it without a copy when it is
// ASCII without escapes, as such values are: a view of the body, capacity cut to its length;
// else it unescapes it into *scratch, as str does. Any other value makes the field absent.
// The view must not outlive the parse, nor be kept in the parser.
func (p *parser) word(scratch *[]byte) ([]byte, state) {
	if p.b[p.pos] != '"' {
		p.skipValue()
		return nil, absent
	}
	i := p.pos + 1
	if j := plain(p.b, i); j < len(p.b) && p.b[j] == '"' {
		p.pos = j + 1
		return p.b[i:j:j], done
	}
	*scratch = p.str((*scratch)[:0])
	return *scratch, p.state()
}

// tokens reads a token count: a whole number in [1, 2^31-1], as a JSON number or a string
// holding one (Python servers coerce "12" to 12); 0 otherwise.
func (p *parser) tokens() int {
	var raw []byte
	switch c := p.b[p.pos]; {
	case c == '"':
		p.num = p.str(p.num[:0])
		raw = p.num
		if numberLen(raw) != len(raw) {
			return 0
		}
	case c == '-' || isDigit(c):
		raw = p.number()
	default:
		p.skipValue()
		return 0
	}
	if p.stop() || len(raw) == 0 {
		return 0
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || v < 1 || v > math.MaxInt32 || v != math.Trunc(v) {
		return 0
	}
	return int(v)
}

// samplingParams reads SGLang's sampling_params and returns its max_new_tokens.
func (p *parser) samplingParams() int { return p.objectTokens("max_new_tokens") }

// objectTokens reads an object (SGLang's sampling_params, Ollama's options) and returns the
// token count under key.
func (p *parser) objectTokens(want string) int {
	if p.b[p.pos] != '{' {
		p.skipValue()
		return 0
	}
	n := 0
	p.enter()
	for first := true; ; first = false {
		key, ok := p.member(first)
		if !ok {
			break
		}
		if string(key) == want {
			n = p.tokens()
		} else {
			p.skipValue()
		}
		if p.stop() {
			break
		}
	}
	return n
}

// promptValue reads a completion prompt or a /generate text: a string; or an array whose
// strings, numbers (token ids, as written) and arrays of numbers (token id lists, ids joined by
// spaces) are joined by newlines, except that two numbers in a row are joined by a space.
// Other values make the field absent.
func (p *parser) promptValue(dst []byte) ([]byte, state) {
	switch p.b[p.pos] {
	case '"':
		dst = p.str(dst)
		return dst, p.state()
	case '[':
	default:
		p.skipValue()
		return dst, absent
	}
	p.enter()
	const (
		none = iota
		str
		num
		list
	)
	prev := none
	for first := true; p.element(first); first = false {
		kind, mark := none, len(dst)
		switch c := p.b[p.pos]; {
		case c == '"':
			kind = str
		case c == '-' || isDigit(c):
			kind = num
		case c == '[':
			kind = list
		}
		if kind == none {
			p.skipValue()
		} else {
			switch {
			case prev == num && kind == num:
				dst = append(dst, ' ')
			case prev != none:
				dst = append(dst, '\n')
			}
			prev = kind
			switch kind {
			case str:
				dst = p.str(dst)
			case num:
				if n := p.number(); n != nil {
					dst = append(dst, n...)
				} else {
					dst = dst[:mark] // cut by the end of the body
				}
			case list:
				dst = p.tokenList(dst)
			}
		}
		if p.stop() {
			break
		}
	}
	return dst, p.state()
}

// tokenList appends the numbers of an array, joined by spaces; other elements are skipped.
func (p *parser) tokenList(dst []byte) []byte {
	p.enter()
	n := 0
	for first := true; p.element(first); first = false {
		if c := p.b[p.pos]; c == '-' || isDigit(c) {
			if num := p.number(); num != nil {
				if n > 0 {
					dst = append(dst, ' ')
				}
				n++
				dst = append(dst, num...)
			}
		} else {
			p.skipValue()
		}
		if p.stop() {
			break
		}
	}
	return dst
}

// messages appends the routing text of a messages array, or of a Responses input array, and
// reports whether it holds an object.
func (p *parser) messages(dst []byte, f *fields) (_ []byte, objects bool) {
	p.enter()
	for first := true; p.element(first); first = false {
		if p.b[p.pos] == '{' {
			objects = true
			dst = p.message(dst, f)
		} else {
			p.skipValue()
		}
		if p.stop() {
			break
		}
	}
	return dst, objects
}

// message appends role, roleEnd, content, a newline and the tool calls (when both are
// non-empty), and messageEnd. Keys may come in any order, so the parts are gathered first.
// When the body ends inside the message, it appends the longest part of that serialization
// that no later byte can change.
//
// A Responses input item without a role whose type is not "message" is written by item
// instead, and only once it is read whole: its type, which may come last, decides its text.
func (p *parser) message(dst []byte, f *fields) []byte {
	start := p.pos
	p.enter()
	content, tools, images := p.content[:0], p.tools[:0], p.images[:0]
	name, args, in := p.fname[:0], p.fargs[:0], p.fin[:0]
	var role, typ []byte // views: of the body, or of p.role and p.typ
	output, summary := p.output[:0], p.summary[:0]
	var roleSt, contentSt, toolsSt, typSt state
	for first := true; ; first = false {
		key, ok := p.member(first)
		if !ok {
			break
		}
		switch string(key) {
		case "role":
			// A role that is not a string counts as the empty role.
			role, roleSt = p.word(&p.role)
			if roleSt == absent && !p.stop() {
				roleSt = done
			}
		case "content":
			content = p.contentValue(content[:0], 0, f)
			contentSt = p.state()
		case "tool_calls":
			tools = p.toolCalls(tools[:0])
			toolsSt = p.state()
		case "images": // Ollama's: after the content and tool calls, only once read whole
			images = p.imageList(images[:0], false)
		case "type":
			typ, typSt = p.word(&p.typ)
		case "name":
			name, _ = p.stringValue(name)
		case "arguments": // function_call
			args = p.rawOrString(args[:0])
		case "input": // custom_tool_call
			in = p.rawOrString(in[:0])
		case "output":
			output = p.contentValue(output[:0], 0, f)
		case "summary":
			summary = p.contentValue(summary[:0], 0, f)
		default:
			p.skipValue()
		}
		if p.stop() {
			break
		}
	}
	p.content, p.tools, p.images = content, tools, images
	p.fname, p.fargs, p.fin, p.output, p.summary = name, args, in, output, summary
	if p.bad {
		return dst
	}
	if roleSt == absent && typSt == done && string(typ) != "message" {
		if p.eof {
			return dst
		}
		return p.item(dst, typ, start)
	}
	if p.eof && roleSt != done {
		return dst
	}
	dst = append(dst, role...)
	dst = append(dst, roleEnd)
	if p.eof && contentSt == absent {
		return dst
	}
	dst = append(dst, content...)
	if p.eof && (contentSt != done || toolsSt == absent) {
		return dst
	}
	if len(tools) > 0 {
		if len(content) > 0 {
			dst = append(dst, '\n')
		}
		dst = append(dst, tools...)
	}
	if p.eof {
		return dst
	}
	if len(images) > 0 {
		if len(content) > 0 || len(tools) > 0 {
			dst = append(dst, '\n')
		}
		dst = append(dst, images...)
	}
	return append(dst, messageEnd)
}

// item appends a Responses input item other than a message, read whole: a function call as
// the assistant's name(arguments), its output as a tool message, a reasoning item as role
// "reasoning" with its summary and content texts; any other item (item_reference,
// web_search_call, ...) as its type and the placeholder of its JSON.
func (p *parser) item(dst, typ []byte, start int) []byte {
	switch string(typ) {
	case "function_call", "custom_tool_call":
		args := p.fargs
		if string(typ) == "custom_tool_call" {
			args = p.fin
		}
		dst = append(dst, "assistant"...)
		dst = append(dst, roleEnd)
		dst = append(dst, p.fname...)
		dst = append(dst, '(')
		dst = append(dst, args...)
		dst = append(dst, ')')
	case "function_call_output", "custom_tool_call_output":
		dst = append(dst, "tool"...)
		dst = append(dst, roleEnd)
		dst = append(dst, p.output...)
	case "reasoning":
		dst = append(dst, "reasoning"...)
		dst = append(dst, roleEnd)
		dst = append(dst, p.summary...)
		if len(p.summary) > 0 && len(p.content) > 0 {
			dst = append(dst, '\n')
		}
		dst = append(dst, p.content...)
	default:
		dst = append(dst, typ...)
		dst = append(dst, roleEnd)
		dst = appendPlaceholder(dst, p.b[start:p.pos])
	}
	return append(dst, messageEnd)
}

// rawOrString appends a string value unescaped, any other value as written.
func (p *parser) rawOrString(dst []byte) []byte {
	if p.b[p.pos] == '"' {
		return p.str(dst)
	}
	v := p.pos
	p.skipValue()
	return appendValid(dst, p.b[v:p.pos], p.eof)
}

// contentValue appends the text of a message content (or of Anthropic's system): a string,
// null, an array of parts whose contributions are joined by newlines, or a single part object.
// Strings in a parts array count as text parts.
func (p *parser) contentValue(dst []byte, level int, f *fields) []byte {
	switch p.b[p.pos] {
	case '"':
		return p.str(dst)
	case '{':
		return p.part(dst, level, f)
	case '[':
	default:
		p.skipValue()
		return dst
	}
	p.enter()
	start := len(dst)
	for first := true; p.element(first); first = false {
		mark := len(dst)
		if mark > start {
			dst = append(dst, '\n')
		}
		sep := len(dst)
		switch p.b[p.pos] {
		case '"':
			dst = p.str(dst)
		case '{':
			dst = p.part(dst, level, f)
		default:
			p.skipValue()
		}
		if len(dst) == sep {
			dst = dst[:mark]
		}
		if p.stop() {
			break
		}
	}
	return dst
}

type partKind uint8

const (
	untyped partKind = iota
	textPart
	toolUse
	toolResult
	otherPart
)

func kindOf(typ []byte) partKind {
	switch string(typ) {
	case "text", "input_text", "output_text", "summary_text", "reasoning_text":
		return textPart
	case "tool_use", "server_tool_use":
		return toolUse
	case "tool_result":
		return toolResult
	}
	return otherPart
}

// part appends the contribution of one content part, decided by its type: text parts their text,
// Anthropic tool_use blocks name(input JSON), tool_result blocks their content's text, and any
// other part (image, audio, file, document, thinking...) a placeholder weighted by its size
// (appendPlaceholder), so that different images do not look alike. A part without a type is
// text when it has a text field, else a placeholder.
func (p *parser) part(dst []byte, level int, f *fields) []byte {
	start := p.pos
	p.enter()
	mark := len(dst)
	sc := &p.lv[level]
	name, nested := sc.name[:0], sc.nested[:0]
	kind := untyped
	var kindSt, textSt, nameSt, inputSt state
	var input0, input1 int
	for first := true; ; first = false {
		key, ok := p.member(first)
		if !ok {
			break
		}
		switch string(key) {
		case "type":
			kind = otherPart
			if typ, st := p.word(&p.num); st != absent {
				kind = kindOf(typ)
			}
			kindSt = p.state()
		case "text":
			// The text goes straight to dst, where nothing else of the part is: it stays if
			// the part is text, and is cut off below otherwise.
			dst = dst[:mark]
			textSt = absent
			if p.b[p.pos] == '"' {
				dst = p.str(dst)
				textSt = p.state()
			} else {
				p.skipValue()
			}
		case "name":
			name, nameSt = p.stringValue(name)
		case "input":
			input0 = p.pos
			p.skipValue()
			input1 = p.pos
			inputSt = p.state()
		case "content":
			if level+1 < partLevels {
				nested = p.contentValue(nested[:0], level+1, f)
			} else {
				p.skipValue()
			}
		default:
			p.skipValue()
		}
		if p.stop() {
			break
		}
	}
	sc.name, sc.nested = name, nested
	if p.bad {
		return dst[:mark]
	}
	if kind == toolUse || kind == toolResult {
		f.anthropic = true
	}
	if p.eof {
		if kindSt != done {
			return dst[:mark]
		}
		switch kind {
		case textPart:
			return dst
		case toolUse:
			dst = append(dst[:mark], name...)
			if nameSt != done {
				return dst
			}
			dst = append(dst, '(')
			if inputSt != absent {
				dst = appendValid(dst, p.b[input0:input1], inputSt == partial)
			}
			return dst
		case toolResult:
			return append(dst[:mark], nested...)
		}
		return append(dst[:mark], placeholder...)
	}
	switch kind {
	case textPart:
		return dst
	case untyped:
		if textSt == done {
			return dst
		}
	case toolUse:
		dst = append(dst[:mark], name...)
		dst = append(dst, '(')
		dst = appendValid(dst, p.b[input0:input1], false)
		return append(dst, ')')
	case toolResult:
		return append(dst[:mark], nested...)
	}
	return appendPlaceholder(dst[:mark], p.b[start:p.pos])
}

// bytesPerChar is how many bytes of a non-text part's JSON stand for one char of prefill: a
// token (4 chars) per 256 bytes. Vision encoders spend about a token per 500-750 pixels
// (Claude: w×h/750; Qwen2-VL: 28×28 pixels), and a photo's JPEG takes about 0.2 bytes a pixel,
// 0.27 in base64: a 1092×1092 photo of some 330 KB of base64 comes to 1,300 tokens against
// Claude's 1,590. PNG screenshots and audio weigh more than they cost; a URL or file id,
// whose content is not in the body, weighs only what it is written as.
const bytesPerChar = 64

// appendPlaceholder appends the stand-in for a non-text part written as raw: U+FFFC, then
// max(8, len(raw)/bytesPerChar) lowercase hex digits drawn from a digest of raw (the first 8
// are its CRC-32C), so that a part weighs in the tree what it costs to prefill, the same part
// matches whole and a different one does not. It takes max(11, 3 + len(raw)/64) bytes.
func appendPlaceholder(dst, raw []byte) []byte {
	const hex = "0123456789abcdef"
	sum := crc32.Checksum(raw, castagnoli)
	dst = append(dst, placeholder...)
	for shift := 28; shift >= 0; shift -= 4 {
		dst = append(dst, hex[sum>>shift&0xf])
	}
	n := len(raw)/bytesPerChar - 8
	if n <= 0 {
		return dst
	}
	// The rest is a splitmix64 stream seeded with 64 bits of digest: CRC-32C and CRC-32 (both
	// run in hardware at several GB/s, so a megabyte image costs well under a millisecond).
	x := uint64(sum)<<32 | uint64(crc32.ChecksumIEEE(raw))
	for n > 0 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		for i := 0; i < 16 && n > 0; i, n = i+1, n-1 {
			dst = append(dst, hex[z&0xf])
			z >>= 4
		}
	}
	return dst
}

// toolCalls appends OpenAI tool calls, one name(arguments) each, joined by newlines.
func (p *parser) toolCalls(dst []byte) []byte {
	if p.b[p.pos] != '[' {
		p.skipValue()
		return dst
	}
	p.enter()
	start := len(dst)
	for first := true; p.element(first); first = false {
		mark := len(dst)
		if mark > start {
			dst = append(dst, '\n')
		}
		sep := len(dst)
		if p.b[p.pos] == '{' {
			dst = p.toolCall(dst)
		} else {
			p.skipValue()
		}
		if len(dst) == sep {
			dst = dst[:mark]
		}
		if p.stop() {
			break
		}
	}
	return dst
}

// toolCall appends the function of one tool call; a call without a function adds nothing.
func (p *parser) toolCall(dst []byte) []byte {
	p.enter()
	name, args := p.name[:0], p.args[:0]
	var fnSt, nameSt, argsSt state
	for first := true; ; first = false {
		key, ok := p.member(first)
		if !ok {
			break
		}
		if string(key) != "function" || p.b[p.pos] != '{' {
			if string(key) == "function" {
				fnSt = absent
			}
			p.skipValue()
		} else {
			name, args, nameSt, argsSt = p.function(name[:0], args[:0])
			fnSt = p.state()
		}
		if p.stop() {
			break
		}
	}
	p.name, p.args = name, args
	if p.bad || fnSt == absent {
		return dst
	}
	dst = append(dst, name...)
	if fnSt == partial && nameSt != done {
		return dst
	}
	dst = append(dst, '(')
	if fnSt == partial && argsSt != absent {
		return append(dst, args...)
	}
	if fnSt == partial {
		return dst
	}
	dst = append(dst, args...)
	return append(dst, ')')
}

// function reads a tool call's function: its name, and its arguments (a string holding JSON,
// unescaped; or JSON written inline, as is).
func (p *parser) function(name, args []byte) (_, _ []byte, nameSt, argsSt state) {
	p.enter()
	for first := true; ; first = false {
		key, ok := p.member(first)
		if !ok {
			break
		}
		switch string(key) {
		case "name":
			name, nameSt = p.stringValue(name)
		case "arguments":
			args = p.rawOrString(args[:0])
			argsSt = p.state()
		default:
			p.skipValue()
		}
		if p.stop() {
			break
		}
	}
	return name, args, nameSt, argsSt
}
