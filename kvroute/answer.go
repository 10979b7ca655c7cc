package kvroute

import (
	"bytes"
	"math"
	"sync"
)

// The answer observer reads an engine's answer as it passes to the client, one byte slice at a
// time, and keeps only what the router learns from: the usage object (prompt tokens, cached
// tokens), llama.cpp's timings, a Responses answer's id, and whether an event carried content
// (the first content delta). It never holds the answer: its state is a fixed-size JSON scanner
// that follows the key path of the value it is in, and matches that path against the few paths
// it reads. Text the model wrote (a client controls what the model echoes) is only ever seen as
// "a non-empty string at a content path", never read as data.

const (
	// maxPath bounds the key path the scanner follows ("response.usage.input_tokens_details.
	// cached_tokens" is 44 bytes); a value under a longer path is not one it reads.
	maxPath = 96
	// maxScanDepth bounds the nesting whose key path it follows; deeper values are checked for
	// form only, up to maxNest levels (past it the answer is given up).
	maxScanDepth = 8
	maxNest      = 64
	// maxIDLen bounds a captured string (a response id, an event type).
	maxIDLen = 128
	// maxNumLen bounds a number's text.
	maxNumLen = 32
	// maxJSONAnswer is how much of a non-streamed JSON answer is read for its usage, and
	// maxEvent how much of one SSE event: past either, the observer gives up on it (counted).
	maxJSONAnswer = 1 << 20
	maxEvent      = 1 << 20
	// maxUsageTokens: a token count above it is no engine's (a lying or broken usage object).
	maxUsageTokens = 1e8
)

// usageField names the numbers the observer reads.
type usageField uint8

const (
	fNone usageField = iota
	fPromptTokens
	fCachedTokens    // prompt_tokens_details.cached_tokens, input_tokens_details.cached_tokens
	fInputTokens     // Responses and Anthropic input_tokens
	fCacheRead       // Anthropic cache_read_input_tokens
	fCacheCreation   // Anthropic cache_creation_input_tokens
	fTimingsPromptN  // llama.cpp timings.prompt_n
	fTimingsCacheN   // llama.cpp timings.cache_n
	fTimingsPromptMS // llama.cpp timings.prompt_ms
	fOllamaPromptN   // Ollama prompt_eval_count (answer_ollama.go)
	fOllamaPromptNS  // Ollama prompt_eval_duration, nanoseconds
	fOllamaCachedN   // Ollama prompt_eval_cached_count (releases after v0.6.5)
	fOutputTokens    // completion_tokens (chat, completions), output_tokens (Responses, Anthropic), Ollama's eval_count
	numUsageFields
)

// usageFieldOf maps a key path below a usage object (or llama.cpp's timings) to the field it
// holds. prefix is the path of the usage object itself.
func usageFieldOf(path []byte) usageField {
	// The usage object sits at the top (chat, completions, Responses and Anthropic bodies), under
	// response (Responses events) or under message (Anthropic message_start).
	if f := ollamaField(path); f != fNone {
		return f
	}
	rest := path
	switch {
	case hasPrefix(rest, "usage."):
		rest = rest[len("usage."):]
	case hasPrefix(rest, "response.usage."):
		rest = rest[len("response.usage."):]
	case hasPrefix(rest, "message.usage."):
		rest = rest[len("message.usage."):]
	case hasPrefix(rest, "timings."):
		switch string(rest[len("timings."):]) {
		case "prompt_n":
			return fTimingsPromptN
		case "cache_n":
			return fTimingsCacheN
		case "prompt_ms":
			return fTimingsPromptMS
		}
		return fNone
	default:
		return fNone
	}
	switch string(rest) {
	case "prompt_tokens":
		return fPromptTokens
	case "prompt_tokens_details.cached_tokens", "input_tokens_details.cached_tokens":
		return fCachedTokens
	case "input_tokens":
		return fInputTokens
	case "cache_read_input_tokens":
		return fCacheRead
	case "cache_creation_input_tokens":
		return fCacheCreation
	case "completion_tokens", "output_tokens":
		return fOutputTokens
	}
	return fNone
}

func hasPrefix(b []byte, p string) bool { return len(b) >= len(p) && string(b[:len(p)]) == p }

// isContentPath reports whether a non-empty string (or any value, for tool calls) at path is
// generated content: chat delta content or reasoning, a completion's text, llama.cpp's
// content, a Responses output_text delta (the event's delta), a chat tool call.
func isContentPath(path []byte) bool {
	switch string(path) {
	case "choices[].delta.content", "choices[].delta.reasoning_content", "choices[].delta.reasoning",
		"choices[].text", "content", "choices[].delta.tool_calls[].function.arguments",
		"choices[].delta.tool_calls[].function.name":
		return true
	}
	return isOllamaContentPath(path)
}

// scanFrame is one level of nesting the scanner is in.
type scanFrame struct {
	object  bool
	pathLen int // len(path) at this frame's start, before its key
}

// jsonScanner follows one JSON value (a body, or one SSE event's data) byte by byte with fixed
// memory, reporting the values the observer reads to its result. A malformed value stops it
// (bad); nothing it read before is trusted then.
type jsonScanner struct {
	st      scanState
	depth   int    // nesting, including levels beyond maxScanDepth
	objects uint64 // bit d-1 set: the container at depth d is an object
	frames  [maxScanDepth]scanFrame
	path    [maxPath]byte
	pathLen int
	over    bool // the path overflowed maxPath at some frame still open (depth of overflow in overDepth)
	overAt  int

	// The token being read.
	key      bool // the string being read is a key
	esc      bool // after a backslash in a string
	uni      int  // hex digits of a \u escape still to skip
	strLen   int  // bytes of the string value so far
	capture  bool // the string value is captured (id, type)
	capBuf   [maxIDLen]byte
	capLen   int
	num      [maxNumLen]byte
	numLen   int
	lit      int // letters of a literal (true, false, null) read
	litFirst byte

	done bool // the top-level value ended
	bad  bool
	res  *scanResult
}

type scanState uint8

const (
	sValue      scanState = iota // expecting a value
	sString                      // in a string (key or value)
	sNumber                      // in a number
	sLiteral                     // in true/false/null (or an invalid literal: NaN, Infinity)
	sAfterKey                    // expecting ':'
	sAfterVal                    // expecting ',' or the container's end
	sKeyOrEnd                    // after '{': a key or '}'
	sValueOrEnd                  // after '[': a value or ']'
)

// scanResult is what one JSON value said.
type scanResult struct {
	nums    [numUsageFields]float64
	has     [numUsageFields]bool
	lies    bool // a usage number that is no count (negative, fractional, huge, NaN)
	content bool // a content path held a non-empty value
	typ     [48]byte
	typLen  int
	id      [maxIDLen]byte
	idLen   int
	respID  bool // id is a Responses id (the top-level id of a response object, or response.id of an event)
	object  [16]byte
	objLen  int
}

func (r *scanResult) reset() { *r = scanResult{} }

func (r *scanResult) typeIs(s string) bool { return string(r.typ[:r.typLen]) == s }

func (s *jsonScanner) reset(res *scanResult) {
	s.st, s.depth, s.objects, s.pathLen, s.over, s.done, s.bad = sValue, 0, 0, 0, false, false, false
	s.key, s.esc, s.uni, s.strLen, s.capture, s.capLen, s.numLen, s.lit = false, false, 0, 0, false, 0, 0, 0
	s.res = res
}

// write feeds bytes of the value; once the value is malformed (or something other than white
// space follows it) the scanner stops reading (bad).
func (s *jsonScanner) write(p []byte) {
	for i := 0; i < len(p); i++ {
		if s.bad {
			return
		}
		c := p[i]
		switch s.st {
		case sString:
			// The fast path: runs of plain bytes in a string.
			if !s.esc && s.uni == 0 && c != '"' && c != '\\' {
				j := len(p)
				if k := bytes.IndexByte(p[i:], '"'); k >= 0 {
					j = i + k
				}
				if k := bytes.IndexByte(p[i:j], '\\'); k >= 0 {
					j = i + k
				}
				s.strBytes(p[i:j])
				i = j - 1
				continue
			}
			s.strByte(c)
		case sNumber:
			if isNumByte(c) {
				if s.numLen < maxNumLen {
					s.num[s.numLen] = c
				}
				s.numLen++
				continue
			}
			s.endNumber()
			i--
		case sLiteral:
			if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' {
				s.lit++
				if s.lit > 8 {
					s.bad = true
				}
				continue
			}
			s.endLiteral()
			i--
		default:
			s.punct(c)
		}
	}
}

func isNumByte(c byte) bool {
	return c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// punct handles a byte between tokens.
func (s *jsonScanner) punct(c byte) {
	if isSpace(c) {
		return
	}
	if s.done {
		s.bad = true // trailing garbage
		return
	}
	switch s.st {
	case sValue, sValueOrEnd:
		if s.st == sValueOrEnd && c == ']' {
			s.pop()
			return
		}
		s.startValue(c)
	case sKeyOrEnd:
		switch c {
		case '}':
			s.pop()
		case '"':
			s.startKey()
		default:
			s.bad = true
		}
	case sAfterKey:
		if c != ':' {
			s.bad = true
			return
		}
		s.st = sValue
	case sAfterVal:
		obj := s.inObject()
		switch {
		case s.depth == 0:
			s.bad = true
		case c == ',' && obj:
			if f := s.top(); f != nil {
				s.pathLen = f.pathLen
			}
			s.st = sKeyOrEnd
			if s.over && s.overAt >= s.depth {
				s.over = false
			}
		case c == ',':
			s.st = sValue
		case c == '}' && obj, c == ']' && !obj:
			s.pop()
		default:
			s.bad = true
		}
	}
}

// inObject reports whether the innermost container is an object.
func (s *jsonScanner) inObject() bool {
	return s.depth > 0 && s.objects&(1<<(s.depth-1)) != 0
}

// top is the innermost followed frame, nil at the top level or beyond maxScanDepth.
func (s *jsonScanner) top() *scanFrame {
	if s.depth == 0 || s.depth > maxScanDepth {
		return nil
	}
	return &s.frames[s.depth-1]
}

func (s *jsonScanner) startValue(c byte) {
	switch {
	case c == '{' || c == '[':
		if s.depth >= maxNest {
			s.bad = true
			return
		}
		s.depth++
		if c == '{' {
			s.objects |= 1 << (s.depth - 1)
		} else {
			s.objects &^= 1 << (s.depth - 1)
		}
		if s.depth <= maxScanDepth {
			f := &s.frames[s.depth-1]
			f.object = c == '{'
			if !f.object {
				s.appendPath("[]")
			}
			f.pathLen = s.pathLen
		}
		if c == '{' {
			s.st = sKeyOrEnd
		} else {
			s.st = sValueOrEnd
		}
	case c == '"':
		s.st, s.key, s.strLen, s.capLen = sString, false, 0, 0
		s.capture = s.captures()
	case c == '-' || c >= '0' && c <= '9':
		s.st, s.numLen = sNumber, 0
		s.num[0] = c
		s.numLen = 1
	case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		s.st, s.lit = sLiteral, 1
		s.litFirst = c
	default:
		s.bad = true
	}
}

func (s *jsonScanner) startKey() {
	s.st, s.key, s.strLen = sString, true, 0
	f := s.top()
	if f == nil {
		return
	}
	s.pathLen = f.pathLen
	if s.pathLen > 0 {
		s.appendPath(".")
	}
}

// appendPath adds b to the path, or marks it overflowed.
func (s *jsonScanner) appendPath(b string) {
	if s.over {
		return
	}
	if s.pathLen+len(b) > maxPath {
		s.over, s.overAt = true, s.depth
		return
	}
	s.pathLen += copy(s.path[s.pathLen:], b)
}

func (s *jsonScanner) pop() {
	if s.depth == 0 {
		s.bad = true
		return
	}
	s.depth--
	if s.over && s.overAt > s.depth {
		s.over = false
	}
	s.afterValue()
	if f := s.top(); f != nil {
		s.pathLen = f.pathLen
	} else if s.depth == 0 {
		s.pathLen = 0
	}
}

// afterValue moves on once a value ended.
func (s *jsonScanner) afterValue() {
	if s.depth == 0 {
		s.done = true
	}
	s.st = sAfterVal
}

// livePath is the path of the value being read, or nil when it is not followed.
func (s *jsonScanner) livePath() []byte {
	if s.over || s.depth > maxScanDepth {
		return nil
	}
	return s.path[:s.pathLen]
}

// captures reports whether the string value about to be read is kept: the event type, the
// object kind, an id.
func (s *jsonScanner) captures() bool {
	switch string(s.livePath()) {
	case "type", "object", "id", "response.id":
		return true
	}
	return false
}

func (s *jsonScanner) strBytes(b []byte) {
	if s.uni > 0 || s.esc {
		for _, c := range b {
			s.strByte(c)
		}
		return
	}
	s.strLen += len(b)
	if s.key {
		if s.depth <= maxScanDepth && !s.over {
			if s.pathLen+len(b) > maxPath {
				s.over, s.overAt = true, s.depth
			} else {
				s.pathLen += copy(s.path[s.pathLen:], b)
			}
		}
		return
	}
	if s.capture {
		if s.capLen+len(b) > maxIDLen {
			s.capture = false
		} else {
			s.capLen += copy(s.capBuf[s.capLen:], b)
		}
	}
}

func (s *jsonScanner) strByte(c byte) {
	switch {
	case s.uni > 0:
		s.uni--
		s.capture = false
		return
	case s.esc:
		s.esc = false
		if c == 'u' {
			s.uni = 4
		}
		s.strLen++
		s.capture = false // ids and types carry no escapes; one that does is not read
		if s.key && !s.over && s.depth <= maxScanDepth {
			s.over, s.overAt = true, s.depth // an escaped key matches no path
		}
		return
	case c == '\\':
		s.esc = true
		return
	case c == '"':
		s.endString()
		return
	}
	s.strBytes([]byte{c})
}

func (s *jsonScanner) endString() {
	if s.key {
		s.key = false
		s.st = sAfterKey
		return
	}
	if path := s.livePath(); path != nil {
		if s.strLen > 0 && isContentPath(path) {
			s.res.content = true
		}
		if s.capture {
			s.keep(path, s.capBuf[:s.capLen])
		}
	}
	s.capture = false
	s.afterValue()
}

// keep stores a captured string at path.
func (s *jsonScanner) keep(path, v []byte) {
	r := s.res
	switch string(path) {
	case "type":
		if len(v) <= len(r.typ) {
			r.typLen = copy(r.typ[:], v)
		}
	case "object":
		if len(v) <= len(r.object) {
			r.objLen = copy(r.object[:], v)
		}
	case "id":
		r.idLen = copy(r.id[:], v)
		r.respID = false
	case "response.id":
		r.idLen = copy(r.id[:], v)
		r.respID = true
	}
}

func (s *jsonScanner) endNumber() {
	if path := s.livePath(); path != nil {
		if f := usageFieldOf(path); f != fNone {
			v, ok := parseField(f, s.num[:min(s.numLen, maxNumLen)], s.numLen > maxNumLen)
			if !ok {
				s.res.lies = true
			} else {
				s.res.nums[f], s.res.has[f] = v, true
			}
		}
	}
	s.afterValue()
}

func (s *jsonScanner) endLiteral() {
	ok := s.lit == 4 && (s.litFirst == 't' || s.litFirst == 'n') || s.lit == 5 && s.litFirst == 'f'
	if !ok {
		// NaN, Infinity (Python's json writes them) are no JSON; under a usage field they are a
		// lie, elsewhere the value is malformed.
		if path := s.livePath(); path != nil && usageFieldOf(path) != fNone {
			s.res.lies = true
		} else {
			s.bad = true
			return
		}
	}
	s.afterValue()
}

// end finishes the value: a number at the very end is complete only now. It reports whether
// the value was whole and well formed.
func (s *jsonScanner) end() bool {
	switch s.st {
	case sNumber:
		s.endNumber()
	case sLiteral:
		s.endLiteral()
	}
	return s.done && !s.bad
}

// parseCount parses a usage number: a whole count in [0, maxUsageTokens], or for a duration in
// milliseconds (ms) a finite non-negative decimal. Anything else is a lie.
func parseCount(b []byte, long, ms bool) (float64, bool) {
	if long || len(b) == 0 {
		return 0, false
	}
	v, frac, scale, seenDot, digits := 0.0, 0.0, 1.0, false, 0
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			digits++
			if seenDot {
				scale /= 10
				frac += float64(c-'0') * scale
			} else {
				v = v*10 + float64(c-'0')
			}
		case c == '.' && ms && !seenDot:
			seenDot = true
		default:
			return 0, false // a sign, an exponent, a second dot
		}
	}
	v += frac
	if digits == 0 || math.IsNaN(v) || v > maxUsageTokens {
		return 0, false
	}
	return v, true
}

// answerKind is how an answer is read.
type answerKind uint8

const (
	answerIgnored answerKind = iota // not read (an error status, another content type, an encoded body)
	answerJSON                      // one JSON document (a non-streamed answer)
	answerSSE                       // server-sent events, each data a JSON document
	answerNDJSON                    // newline-delimited JSON (Ollama's stream: answer_ollama.go)
)

// usage is what an answer reported: its prompt tokens and how many of them the engine found
// cached, llama.cpp's own prefill time, and a Responses answer's id.
type usage struct {
	ok          bool    // a usage object (or llama.cpp timings) was read
	prompt      float64 // prompt tokens, cached ones included
	cached      float64
	cachedKnown bool    // the engine reported cached tokens (not only the prompt's)
	prefillMS   float64 // llama.cpp timings.prompt_ms; 0 when not reported
	computed    float64 // llama.cpp timings.prompt_n: the tokens it prefilled
	lies        bool    // a usage object that cannot be true was seen (and ignored)
	respID      string  // the answer's Responses id; "" when none
	// output is the answer's output tokens (completion_tokens, output_tokens) when outputKnown.
	output      float64
	outputKnown bool
}

// answerObserver reads one answer as it passes. It is driven by the ResponseWriter wrapper
// (feedback.go), one goroutine at a time, and allocates nothing per byte.
type answerObserver struct {
	kind answerKind
	sc   jsonScanner
	res  scanResult // of the JSON document being read
	read int64      // bytes of the JSON answer, or of the SSE event, read so far

	// SSE line state.
	lineStart bool // at the start of a line
	field     [5]byte
	fieldLen  int
	inData    bool // the line is a data line (its value goes to the scanner)
	skipLine  bool // the line is another field, or a data line past the first space
	dataLines int  // data lines of the event so far
	afterCR   bool
	gaveUp    bool // the event being read is over maxEvent, or is OpenAI's [DONE]
	doneLen   int  // bytes of the event's data that matched doneMarker so far; -1: it is not
	// skim: once content flows (most events are content deltas), an event is set aside in buf,
	// a copy, and read only when it names a usage key: a search instead of a scan of every byte.
	skim bool
	buf  *[]byte

	// What the answer said so far: u, from the usage fields of its documents merged (fields,
	// has).
	contentAt bool // an event carried content
	u         usage
	fields    [numUsageFields]float64
	has       [numUsageFields]bool
	usageSeen int // documents with a usage object
	gaveUps   int // documents given up (malformed, over the bound, cut)
	wantID    bool
	responses bool // the request was a Responses request: its answer's id is kept
}

// begin sets the observer up for an answer of kind.
func (o *answerObserver) begin(kind answerKind, responses bool) {
	*o = answerObserver{kind: kind, lineStart: true, responses: responses}
	o.sc.reset(&o.res)
}

// write observes p, bytes just written to the client. It reports whether p completed the first
// content of a streamed answer (the first SSE event, or NDJSON line, carrying content). A non-streamed answer
// has no first content: its first byte comes after its whole decode.
func (o *answerObserver) write(p []byte) (first bool) {
	if len(p) == 0 {
		return false
	}
	switch o.kind {
	case answerJSON:
		if o.read >= maxJSONAnswer {
			return false
		}
		n := min(int64(len(p)), maxJSONAnswer-o.read)
		o.read += n
		o.sc.write(p[:n])
		if o.read >= maxJSONAnswer && !o.sc.done {
			o.gaveUps++
			o.sc.bad = true
		}
	case answerSSE:
		had := o.contentAt
		o.sse(p)
		first = !had && o.contentAt
	case answerNDJSON:
		had := o.contentAt
		o.ndjson(p)
		first = !had && o.contentAt
	}
	return first
}

// sse splits p into lines and events (text/event-stream: lines end in \n, \r\n or \r; an empty
// line ends an event; a data line's value, after one optional space, goes to the JSON scanner,
// several data lines of one event joined by \n).
func (o *answerObserver) sse(p []byte) {
	for i := 0; i < len(p); i++ {
		c := p[i]
		if o.afterCR {
			o.afterCR = false
			if c == '\n' {
				continue
			}
		}
		if c == '\r' || c == '\n' {
			o.afterCR = c == '\r'
			o.endLine()
			continue
		}
		if o.lineStart {
			o.lineStart, o.fieldLen, o.inData, o.skipLine = false, 0, false, false
			if len(p)-i > 5 && string(p[i:i+5]) == "data:" {
				// Nearly every line: its field name in one comparison.
				o.startData()
				i += 4
				continue
			}
		}
		switch {
		case o.skipLine:
		case o.inData:
			// Feed the run up to the line's end in one go.
			j := len(p)
			if k := bytes.IndexByte(p[i:], '\n'); k >= 0 {
				j = i + k
			}
			if k := bytes.IndexByte(p[i:j], '\r'); k >= 0 {
				j = i + k
			}
			o.data(p[i:j])
			i = j - 1
		case o.fieldLen < len(o.field):
			if c == ':' {
				if string(o.field[:o.fieldLen]) == "data" {
					o.startData()
				} else {
					o.skipLine = true
				}
				continue
			}
			o.field[o.fieldLen] = c
			o.fieldLen++
		default:
			o.skipLine = true // a field name longer than "data"
		}
	}
}

// startData begins a data line's value (the optional space after the colon is skipped by data).
func (o *answerObserver) startData() {
	o.inData = true
	if o.dataLines > 0 {
		o.feed([]byte{'\n'})
	}
	o.dataLines++
	o.fieldLen = -1 // the next byte may be the one optional space
}

func (o *answerObserver) data(b []byte) {
	if o.fieldLen == -1 {
		o.fieldLen = 0
		if b[0] == ' ' {
			b = b[1:]
		}
	}
	o.feed(b)
}

func (o *answerObserver) feed(b []byte) {
	if o.gaveUp || len(b) == 0 {
		return
	}
	if o.read+int64(len(b)) > maxEvent {
		o.gaveUp = true
		return
	}
	if o.dataLines == 1 && o.doneLen >= 0 && o.doneLen < len(doneMarker) {
		// OpenAI's end marker, no JSON: nothing to read. It may come in several writes: the
		// data's first bytes are matched against it as they come.
		for _, c := range b[:min(len(b), len(doneMarker)-o.doneLen)] {
			if c != doneMarker[o.doneLen] {
				o.doneLen = -1
				break
			}
			o.doneLen++
		}
		if o.doneLen == len(doneMarker) {
			o.gaveUp = true
			o.dataLines = -1
			return
		}
	}
	o.read += int64(len(b))
	if o.skim {
		if o.buf == nil {
			o.buf = eventBufs.Get().(*[]byte)
		}
		*o.buf = append(*o.buf, b...)
		return
	}
	o.sc.write(b)
}

// doneMarker is the data of OpenAI's last event; data that starts with it is not read.
const doneMarker = "[DONE]"

// eventBufs holds the buffers events are set aside in while the observer skims (skim).
var eventBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// skimmed reports whether an event set aside names a key worth reading once the answer's
// content flows: "usage" (chat, completions, Responses' response.completed, Anthropic's
// message_delta) or llama.cpp's "timings". Both have a 'g', rarer in events than the quotes a
// substring search would stop at: one IndexByte pass finds them.
func skimmed(b []byte) bool {
	for i := 0; ; {
		k := bytes.IndexByte(b[i:], 'g')
		if k < 0 {
			return false
		}
		j := i + k
		if j >= 4 && j+3 <= len(b) && string(b[j-4:j+3]) == `"usage"` ||
			j >= 6 && j+3 <= len(b) && string(b[j-6:j+3]) == `"timings"` {
			return true
		}
		i = j + 1
	}
}

func (o *answerObserver) endLine() {
	if o.lineStart {
		o.endEvent()
		return
	}
	o.lineStart = true
	if o.fieldLen > 0 && !o.inData && !o.skipLine && string(o.field[:o.fieldLen]) == "data" {
		o.startData() // "data" with no colon: an empty value
	}
	o.inData, o.skipLine = false, false
}

// endEvent takes in the event just ended.
func (o *answerObserver) endEvent() {
	if o.skim && o.dataLines > 0 && !o.gaveUp {
		if o.buf != nil && skimmed(*o.buf) {
			o.sc.write(*o.buf)
		} else {
			o.dataLines = -1 // nothing worth reading: no JSON parsed, none counted
		}
	}
	if o.buf != nil {
		*o.buf = (*o.buf)[:0]
	}
	o.skim = o.contentAt
	if o.dataLines != 0 {
		switch {
		case o.dataLines < 0: // [DONE]
		case o.gaveUp || !o.sc.end():
			o.gaveUps++
		default:
			o.takeEvent(&o.res)
		}
	}
	o.res.reset()
	o.sc.reset(&o.res)
	o.read, o.dataLines, o.gaveUp, o.doneLen = 0, 0, false, 0
}

// takeEvent takes in one whole SSE event's JSON.
func (o *answerObserver) takeEvent(r *scanResult) {
	if r.content || contentEvent(r) {
		o.contentAt = true
	}
	o.take(r)
}

// contentEvent reports whether an event's type says it carries generated content (Responses'
// output deltas, Anthropic's content_block_delta); the first such event is the first token.
func contentEvent(r *scanResult) bool {
	switch string(r.typ[:r.typLen]) {
	case "content_block_delta", "response.output_text.delta", "response.reasoning_text.delta",
		"response.function_call_arguments.delta", "response.refusal.delta", "response.reasoning_summary_text.delta":
		return true
	}
	return false
}

// take folds one document's usage into the answer's, field by field: a field the document
// reports replaces the earlier value, unless it is a 0 after a count; a field it leaves out (or
// nulls) keeps the earlier value. vLLM's continuous usage repeats a growing object, its details
// perhaps only in the last; Anthropic's message_delta repeats message_start's counts, each
// field optional (a delta with input_tokens alone replaced the whole usage and lost the cached
// tokens); an OpenAI final usage may leave out details an earlier chunk gave.
func (o *answerObserver) take(r *scanResult) {
	if r.idLen > 0 && o.responses && (r.respID || string(r.object[:r.objLen]) == "response") {
		if id := r.id[:r.idLen]; o.u.respID != string(id) {
			o.u.respID = string(id)
		}
	}
	if r.lies {
		o.u.lies = true
		return
	}
	fields, has, changed := o.fields, o.has, false
	for f := fNone + 1; f < numUsageFields; f++ {
		if r.has[f] && (!has[f] || r.nums[f] != 0) {
			fields[f], has[f], changed = r.nums[f], true, true
		}
	}
	if !changed {
		return
	}
	u, ok := usageOf(&fields, &has)
	if !ok {
		// Nothing to make a usage of yet (only timings.prompt_ms, say): kept for later.
		o.fields, o.has = fields, has
		return
	}
	if u.cached > u.prompt || u.prompt > maxUsageTokens {
		o.u.lies = true
		return
	}
	o.fields, o.has = fields, has
	u.ok = true
	u.lies, u.respID = o.u.lies, o.u.respID
	o.u = u
	o.usageSeen++
}

// usageOf makes a usage of the fields read; false when they hold no prompt count.
func usageOf(n *[numUsageFields]float64, h *[numUsageFields]bool) (usage, bool) {
	var u usage
	switch {
	case h[fPromptTokens]:
		u.prompt = n[fPromptTokens]
		u.cached, u.cachedKnown = n[fCachedTokens], h[fCachedTokens]
	case h[fInputTokens] && (h[fCacheRead] || h[fCacheCreation]):
		// Anthropic: input_tokens leaves out what was read from or written to the cache.
		u.prompt = n[fInputTokens] + n[fCacheRead] + n[fCacheCreation]
		u.cached, u.cachedKnown = n[fCacheRead], h[fCacheRead]
	case h[fInputTokens]:
		u.prompt = n[fInputTokens]
		u.cached, u.cachedKnown = n[fCachedTokens], h[fCachedTokens]
	case h[fTimingsPromptN] && h[fTimingsCacheN]:
		u.prompt = n[fTimingsPromptN] + n[fTimingsCacheN]
		u.cached, u.cachedKnown = n[fTimingsCacheN], true
	case h[fOllamaPromptN]:
		u = ollamaUsage(h, n)
	default:
		return u, false
	}
	if h[fTimingsPromptN] && h[fTimingsPromptMS] {
		u.computed, u.prefillMS = n[fTimingsPromptN], n[fTimingsPromptMS]
	}
	if h[fOutputTokens] && n[fOutputTokens] >= 0 && n[fOutputTokens] <= maxUsageTokens {
		u.output, u.outputKnown = n[fOutputTokens], true
	}
	return u, true
}

// finish ends the answer: a JSON answer counts only when it was whole; an SSE event cut short
// (no empty line after it) does not count. It returns what the answer reported.
func (o *answerObserver) finish() usage {
	switch o.kind {
	case answerJSON:
		switch {
		case o.sc.end():
			o.take(&o.res)
		case o.read > 0 && o.read < maxJSONAnswer:
			o.gaveUps++ // cut short or malformed
		}
	case answerNDJSON:
		o.ndjsonFinish()
	case answerSSE:
		if o.dataLines > 0 {
			o.gaveUps++ // an event cut short: never taken in
		}
		if o.buf != nil {
			if cap(*o.buf) <= 64<<10 {
				*o.buf = (*o.buf)[:0]
				eventBufs.Put(o.buf)
			}
			o.buf = nil
		}
	}
	return o.u
}
