package llmreq

import (
	"hash/crc32"
	"math"
	"strconv"
	"strings"
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

	// Scratch buffers, reused across calls through the pool.
	model, session, num     []byte
	role, content, tools    []byte // the message being read
	name, args              []byte // the tool call being read
	msgs, sys, prompt, text []byte // top-level routing fields
	lv                      [partLevels]struct{ name, nested []byte }
}

// fields is what parse collects from the top-level object.
type fields struct {
	model, session, msgs, sys, prompt, text state

	maxTokens, maxCompletion, maxNew int
	stream, anthropic                bool
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
			p.msgs = p.messages(p.msgs[:0], &f)
			f.msgs = p.state()
		case "system":
			f.sys = absent
			if c != '"' && c != '[' {
				p.skipValue()
				break
			}
			p.sys = p.contentValue(p.sys[:0], 0, &f)
			f.sys = p.state()
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
			f.stream = c == 't'
			p.skipValue()
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
	switch {
	case f.maxCompletion > 0:
		req.MaxTokens = f.maxCompletion
	case f.maxTokens > 0:
		req.MaxTokens = f.maxTokens
	default:
		req.MaxTokens = f.maxNew
	}
	req.Stream = f.stream
	switch {
	case f.msgs != absent || p.trunc && f.sys != absent:
		req.Format = Chat
		if f.anthropic || f.sys != absent {
			req.Format = Messages
		}
		req.Text = p.chatText(&f)
	case f.prompt != absent:
		req.Format = Completion
		req.Text = string(p.prompt)
	case f.text != absent:
		req.Format = Generate
		req.Text = string(p.text)
	}
	return req
}

// chatText joins Anthropic's system, serialized as a system message, and the messages.
func (p *parser) chatText(f *fields) string {
	if f.sys == absent {
		return string(p.msgs)
	}
	var sb strings.Builder
	sb.Grow(len("system") + len(p.sys) + len(p.msgs) + 2)
	sb.WriteString("system")
	sb.WriteByte(roleEnd)
	sb.Write(p.sys)
	if f.sys == done {
		// A system cut short must end the text: the messages come after all of it.
		sb.WriteByte(messageEnd)
		if f.msgs != absent {
			sb.Write(p.msgs)
		}
	}
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
func (p *parser) samplingParams() int {
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
		if string(key) == "max_new_tokens" {
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

// messages appends the routing text of a messages array.
func (p *parser) messages(dst []byte, f *fields) []byte {
	p.enter()
	for first := true; p.element(first); first = false {
		if p.b[p.pos] == '{' {
			dst = p.message(dst, f)
		} else {
			p.skipValue()
		}
		if p.stop() {
			break
		}
	}
	return dst
}

// message appends role, roleEnd, content, a newline and the tool calls (when both are
// non-empty), and messageEnd. Keys may come in any order, so the parts are gathered first.
// When the body ends inside the message, it appends the longest part of that serialization
// that no later byte can change.
func (p *parser) message(dst []byte, f *fields) []byte {
	p.enter()
	role, content, tools := p.role[:0], p.content[:0], p.tools[:0]
	var roleSt, contentSt, toolsSt state
	for first := true; ; first = false {
		key, ok := p.member(first)
		if !ok {
			break
		}
		switch string(key) {
		case "role":
			// A role that is not a string counts as the empty role.
			role, roleSt = p.stringValue(role)
			if roleSt == absent && !p.stop() {
				roleSt = done
			}
		case "content":
			content = p.contentValue(content[:0], 0, f)
			contentSt = p.state()
		case "tool_calls":
			tools = p.toolCalls(tools[:0])
			toolsSt = p.state()
		default:
			p.skipValue()
		}
		if p.stop() {
			break
		}
	}
	p.role, p.content, p.tools = role, content, tools
	if p.bad {
		return dst
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
	return append(dst, messageEnd)
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
	case "text", "input_text", "output_text":
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
// other part (image, audio, file, document, thinking...) a placeholder: U+FFFC and the CRC-32C
// of the part's JSON in 8 hex digits, so that different images do not look alike. A part without
// a type is text when it has a text field, else a placeholder.
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
			if p.b[p.pos] == '"' {
				p.num = p.str(p.num[:0])
				kind = kindOf(p.num)
			} else {
				p.skipValue()
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

func appendPlaceholder(dst, raw []byte) []byte {
	const hex = "0123456789abcdef"
	sum := crc32.Checksum(raw, castagnoli)
	dst = append(dst, placeholder...)
	for shift := 28; shift >= 0; shift -= 4 {
		dst = append(dst, hex[sum>>shift&0xf])
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
			args = args[:0]
			if p.b[p.pos] == '"' {
				args = p.str(args)
			} else {
				start := p.pos
				p.skipValue()
				args = appendValid(args, p.b[start:p.pos], p.eof)
			}
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
