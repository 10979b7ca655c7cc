package kvroute

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
)

// A streaming JSON filter that removes a client's P/D members from a request body on its way to
// a decode engine, without holding the body (llm_disaggregate under protocol vllm, for a body
// it does not split: docs/disaggregation.md). It reads one JSON object and writes it back with
// the members its memberFilter names removed, at the top level and in the objects of the
// members it descends into; every other byte goes through unchanged (whitespace before a
// removed member goes with it). Memory is bounded whatever the body: the bytes of one member's
// start until its key is known (at most maxPending), one read's output, and the nesting: a bit
// per open container (at most llmreq.MaxDepth, as llm_prompt reads: a deeper body is refused)
// and a frame per open object the filter looks into (the filter's own depth, two levels).
//
// A body that is not one JSON object as RFC 8259 defines it (what vLLM's Python reads, minus
// its NaN and Infinity) fails the read: a body the filter cannot read is never forwarded
// whole, since an engine whose parser reads more than this one (another encoding detected
// from the first bytes, NaN) could find in it the members the filter did not see.

// memberFilter names the members of an object that are removed, and the members whose object
// value is filtered in turn.
type memberFilter struct {
	remove map[string]bool
	inner  map[string]*memberFilter
	maxKey int // the longest name above, in bytes (all ASCII)
}

func newMemberFilter(remove []string, inner map[string]*memberFilter) *memberFilter {
	f := &memberFilter{remove: make(map[string]bool, len(remove)), inner: inner}
	for _, k := range remove {
		f.remove[k] = true
		f.maxKey = max(f.maxKey, len(k))
	}
	for k := range inner {
		f.maxKey = max(f.maxKey, len(k))
	}
	return f
}

// pdFilter removes the P/D fields at the top level, and vLLM's kv_transfer_params inside
// vllm_xargs: vLLM merges vllm_xargs into the request's extra arguments, which its KV
// connector reads kv_transfer_params from (the top-level field overrides it only when given).
var pdFilter = newMemberFilter(pdFields, map[string]*memberFilter{
	"vllm_xargs": newMemberFilter([]string{"kv_transfer_params"}, nil),
})

// maxPending bounds the whitespace kept ahead of a member whose key is not known yet: more is
// dropped (insignificant in JSON), so that a body of spaces pins no memory.
const maxPending = 64 << 10

// errNotJSONObject is the read error of a body the filter cannot read as one JSON object.
var errNotJSONObject = errors.New("llm_disaggregate: the request body is not one JSON object")

// Lexical states.
const (
	jBegin      = iota // before the top-level object
	jObjStart          // after '{': a key or '}'
	jObjKey            // after ',' in an object: a key
	jColon             // after a key: ':'
	jValue             // a value
	jAfterValue        // ',' or the container's end
	jArrStart          // after '[': a value or ']'
	jEnd               // after the top-level object: whitespace only
	jStr               // in a string
	jStrEsc            // after '\' in a string
	jStrU              // in a \uXXXX escape
	jLit               // in true, false, null
	jNumMinus          // after '-'
	jNumZero           // after a leading 0
	jNumInt            // in the integer digits
	jNumDot            // after '.'
	jNumFrac           // in the fraction digits
	jNumE              // after 'e'
	jNumESign          // after the exponent's sign
	jNumExp            // in the exponent digits
)

// Where the bytes go.
const (
	sinkEmit = iota
	sinkPend // a member's start: its key decides
	sinkDrop
)

// stripFrame is an open object whose members the filter looks at. These are the outermost
// containers (the top-level object, and the members' objects its filter descends into): the
// values of any other container are never filtered, so the frames are depths 1 to
// len(pdStripper.stack).
type stripFrame struct {
	f       *memberFilter
	emitted bool // a member of this object was kept
}

// pdStripper is the filter as an io.ReadCloser over src.
type pdStripper struct {
	src   io.Reader
	close func() error
	check bool // only the syntax: nothing is kept
	buf   []byte
	out   []byte // filtered bytes not yet read
	off   int
	pend  []byte
	mode  int
	depth int                            // containers open
	objs  [llmreq.MaxDepth/64 + 1]uint64 // bit d-1 set: the container at depth d is an object
	stack []stripFrame                   // the filtered objects open, depths 1 to len(stack)
	st    int
	err   error
	eof   bool

	lit     string // the rest of a literal
	uLeft   int    // hex digits left of a \u escape
	uVal    rune
	strKey  bool // the string is an object's key
	capture bool // it is a key of a filtered object, its member not decided yet
	key     []byte
	keyOff  bool          // the key cannot be one the filter names (too long, not ASCII)
	nextF   *memberFilter // the filter of the value about to start
}

func newPDStripper(src io.Reader, close func() error) *pdStripper {
	return &pdStripper{src: src, close: close}
}

// stripPD filters a whole body.
func stripPD(body []byte) ([]byte, error) {
	s := newPDStripper(bytes.NewReader(body), nil)
	s.out = make([]byte, 0, len(body))
	s.feed(body)
	if s.err == nil && s.st != jEnd {
		s.err = fmt.Errorf("%w: it ends early", errNotJSONObject)
	}
	return s.out, s.err
}

// checkPDPrefix reports a syntax error in the start of a body (running out is no error).
func checkPDPrefix(prefix []byte) error {
	s := newPDStripper(nil, nil)
	s.check = true
	s.feed(prefix)
	return s.err
}

func (s *pdStripper) Read(p []byte) (int, error) {
	for s.off == len(s.out) {
		if s.err != nil {
			return 0, s.err
		}
		if s.eof {
			if s.st != jEnd {
				s.err = fmt.Errorf("%w: it ends early", errNotJSONObject)
				continue
			}
			return 0, io.EOF
		}
		if s.buf == nil {
			s.buf = make([]byte, 32<<10)
		}
		s.out, s.off = s.out[:0], 0
		n, err := s.src.Read(s.buf)
		s.feed(s.buf[:n])
		if err == io.EOF {
			s.eof = true
		} else if err != nil && s.err == nil {
			s.err = err
		}
	}
	n := copy(p, s.out[s.off:])
	s.off += n
	return n, nil
}

func (s *pdStripper) Close() error {
	if s.close != nil {
		return s.close()
	}
	return nil
}

func (s *pdStripper) feed(b []byte) {
	for i := 0; i < len(b) && s.err == nil; {
		if s.st == jStr && !s.capture {
			// The run of plain bytes in a string (most of a prompt) at once.
			j := i
			for j < len(b) && !strSpecial[b[j]] {
				j++
			}
			if j > i {
				s.putRun(b[i:j])
				i = j
				continue
			}
		}
		if s.step(b[i]) {
			i++
		}
	}
}

// strSpecial are the bytes a string's run stops at: its end, an escape, a control byte.
var strSpecial = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

func (s *pdStripper) putRun(p []byte) {
	if s.check {
		return
	}
	switch s.mode {
	case sinkEmit:
		s.out = append(s.out, p...)
	case sinkPend:
		s.pend = append(s.pend, p...)
	}
}

func (s *pdStripper) put(c byte) {
	if s.check {
		return
	}
	switch s.mode {
	case sinkEmit:
		s.out = append(s.out, c)
	case sinkPend:
		if len(s.pend) < maxPending || !isSpace(c) {
			s.pend = append(s.pend, c)
		}
	}
}

func (s *pdStripper) fail(c byte) bool {
	s.err = fmt.Errorf("%w: unexpected byte %q", errNotJSONObject, c)
	return true
}

// filtered returns the innermost container's frame when the filter looks into it, else nil.
func (s *pdStripper) filtered() *stripFrame {
	if s.depth == 0 || s.depth != len(s.stack) {
		return nil
	}
	return &s.stack[s.depth-1]
}

// inObject reports whether the innermost container is an object.
func (s *pdStripper) inObject() bool {
	d := s.depth - 1
	return s.objs[d/64]&(1<<(d%64)) != 0
}

// push opens a container, filtered by f (nil: not looked into); false when that nests deeper
// than llmreq.MaxDepth: what llm_prompt does not read is not forwarded either, and the
// nesting's memory stays bounded.
func (s *pdStripper) push(obj bool, f *memberFilter) bool {
	if s.depth == llmreq.MaxDepth {
		s.err = fmt.Errorf("%w: it nests deeper than %d levels", errNotJSONObject, llmreq.MaxDepth)
		return false
	}
	d := s.depth
	if obj {
		s.objs[d/64] |= 1 << (d % 64)
	} else {
		s.objs[d/64] &^= 1 << (d % 64)
	}
	s.depth++
	if f != nil && len(s.stack) == d {
		s.stack = append(s.stack, stripFrame{f: f})
	}
	return true
}

// keep ends a pending member as kept: its bytes go out, without the comma that led it when no
// member of its object went out before it.
func (s *pdStripper) keep() {
	fr := s.filtered()
	p := s.pend
	if !fr.emitted && len(p) > 0 && p[0] == ',' {
		p = p[1:]
	}
	if !s.check {
		s.out = append(s.out, p...)
	}
	s.pend = s.pend[:0]
	s.mode = sinkEmit
	fr.emitted = true
}

// decideKey ends a filtered object's key: its member is removed or kept.
func (s *pdStripper) decideKey() {
	s.capture = false
	f := s.filtered().f
	name := string(s.key)
	if !s.keyOff && f.remove[name] {
		s.pend = s.pend[:0]
		s.mode = sinkDrop
		return
	}
	s.keep()
	if !s.keyOff {
		s.nextF = f.inner[name]
	}
}

// step takes one byte; false: the byte ends a number and is taken again in the next state.
func (s *pdStripper) step(c byte) bool {
	switch s.st {
	case jBegin, jEnd:
		if isSpace(c) {
			s.put(c)
			return true
		}
		if s.st == jEnd || c != '{' {
			return s.fail(c)
		}
		s.open(c, pdFilter)
		return true
	case jObjStart, jObjKey:
		switch {
		case isSpace(c):
			s.put(c)
		case c == '"':
			s.put(c)
			s.st = jStr
			s.strKey = true
			s.capture = s.filtered() != nil && s.mode == sinkPend
			s.key, s.keyOff = s.key[:0], false
		case c == '}' && s.st == jObjStart:
			if s.mode == sinkPend {
				s.keep() // an empty object: its whitespace
				s.filtered().emitted = false
			}
			s.closeC(c)
		default:
			return s.fail(c)
		}
		return true
	case jColon:
		switch {
		case isSpace(c):
			s.put(c)
		case c == ':':
			s.put(c)
			s.st = jValue
		default:
			return s.fail(c)
		}
		return true
	case jValue, jArrStart:
		if isSpace(c) {
			s.put(c)
			return true
		}
		if c == ']' && s.st == jArrStart {
			s.closeC(c)
			return true
		}
		f := s.nextF
		s.nextF = nil
		switch {
		case c == '{':
			if s.mode == sinkDrop {
				f = nil // a removed member's value: nothing of it goes out
			}
			s.open(c, f)
		case c == '[':
			if s.push(false, nil) {
				s.put(c)
				s.st = jArrStart
			}
		case c == '"':
			s.put(c)
			s.strKey, s.capture = false, false
			s.st = jStr
		case c == '-':
			s.put(c)
			s.st = jNumMinus
		case c == '0':
			s.put(c)
			s.st = jNumZero
		case c >= '1' && c <= '9':
			s.put(c)
			s.st = jNumInt
		case c == 't':
			s.put(c)
			s.lit, s.st = "rue", jLit
		case c == 'f':
			s.put(c)
			s.lit, s.st = "alse", jLit
		case c == 'n':
			s.put(c)
			s.lit, s.st = "ull", jLit
		default:
			return s.fail(c)
		}
		return true
	case jAfterValue:
		fr, obj := s.filtered(), s.inObject()
		switch {
		case isSpace(c):
			s.put(c)
		case c == ',':
			if fr != nil {
				s.pend = s.pend[:0]
				s.mode = sinkPend
			}
			s.put(c)
			if obj {
				s.st = jObjKey
			} else {
				s.st = jValue
			}
		case c == '}' && obj, c == ']' && !obj:
			if fr != nil {
				s.mode = sinkEmit // after a removed member
			}
			s.closeC(c)
		default:
			return s.fail(c)
		}
		return true
	case jStr:
		switch {
		case c == '"':
			s.put(c)
			s.endString()
		case c == '\\':
			s.put(c)
			s.st = jStrEsc
		case c < 0x20:
			return s.fail(c)
		default:
			s.put(c)
			s.keyByte(c)
		}
		return true
	case jStrEsc:
		s.put(c)
		var d byte
		switch c {
		case '"', '\\', '/':
			d = c
		case 'b':
			d = '\b'
		case 'f':
			d = '\f'
		case 'n':
			d = '\n'
		case 'r':
			d = '\r'
		case 't':
			d = '\t'
		case 'u':
			s.st, s.uLeft, s.uVal = jStrU, 4, 0
			return true
		default:
			return s.fail(c)
		}
		s.st = jStr
		s.keyByte(d)
		return true
	case jStrU:
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return s.fail(c)
		}
		s.put(c)
		s.uVal = s.uVal<<4 | rune(v)
		if s.uLeft--; s.uLeft == 0 {
			s.st = jStr
			s.keyByte(byte(min(s.uVal, 0x80))) // 0x80: not ASCII, no name the filter has
		}
		return true
	case jLit:
		if c != s.lit[0] {
			return s.fail(c)
		}
		s.put(c)
		if s.lit = s.lit[1:]; s.lit == "" {
			s.st = jAfterValue
		}
		return true
	}
	return s.number(c)
}

// number takes a byte of a number, or ends it.
func (s *pdStripper) number(c byte) bool {
	digit := c >= '0' && c <= '9'
	next := -1
	switch s.st {
	case jNumMinus:
		switch {
		case c == '0':
			next = jNumZero
		case digit:
			next = jNumInt
		default:
			return s.fail(c)
		}
	case jNumZero, jNumInt:
		switch {
		case digit && s.st == jNumInt:
			next = jNumInt
		case c == '.':
			next = jNumDot
		case c == 'e' || c == 'E':
			next = jNumE
		}
	case jNumDot:
		if !digit {
			return s.fail(c)
		}
		next = jNumFrac
	case jNumFrac:
		switch {
		case digit:
			next = jNumFrac
		case c == 'e' || c == 'E':
			next = jNumE
		}
	case jNumE:
		switch {
		case c == '+' || c == '-':
			next = jNumESign
		case digit:
			next = jNumExp
		default:
			return s.fail(c)
		}
	case jNumESign, jNumExp:
		switch {
		case digit:
			next = jNumExp
		case s.st == jNumESign:
			return s.fail(c)
		}
	}
	if next < 0 {
		s.st = jAfterValue // the number ended before c
		return false
	}
	s.put(c)
	s.st = next
	return true
}

// keyByte adds a decoded byte of a key being captured. A key that cannot be a name the filter
// has (longer than all, or not ASCII) is decided at once: its member stays, and the rest of
// the key goes out as it comes (a key pins at most 6 bytes a name's byte, escaped).
func (s *pdStripper) keyByte(d byte) {
	if !s.capture {
		return
	}
	if d >= 0x80 || len(s.key) >= s.filtered().f.maxKey {
		s.keyOff = true
		s.decideKey()
		return
	}
	s.key = append(s.key, d)
}

func (s *pdStripper) endString() {
	if !s.strKey {
		s.st = jAfterValue
		return
	}
	s.st = jColon
	s.strKey = false
	if s.capture {
		s.decideKey()
	}
}

// open starts an object, filtered by f (nil: its members are not looked at).
func (s *pdStripper) open(c byte, f *memberFilter) {
	if !s.push(true, f) {
		return
	}
	s.put(c)
	if f != nil {
		s.mode = sinkPend
		s.pend = s.pend[:0]
	}
	s.st = jObjStart
}

// closeC ends the innermost container.
func (s *pdStripper) closeC(c byte) {
	s.put(c)
	if s.depth == len(s.stack) {
		s.stack = s.stack[:s.depth-1]
	}
	s.depth--
	if s.depth == 0 {
		s.st = jEnd
	} else {
		s.st = jAfterValue
	}
}
