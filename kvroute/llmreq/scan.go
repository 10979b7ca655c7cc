package llmreq

import (
	"encoding/binary"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth bounds the nesting of arrays and objects in a body: a body whose containers nest
// deeper (the top-level object counts as one) is not JSON this package accepts, nor JSON the
// router forwards after reading it (llm_disaggregate's P/D filter stops there too). Python
// servers stop near 1000 as well, and a bound keeps a body of brackets from costing memory
// per byte.
const MaxDepth = 1000

// state says how much of a field a parse has seen.
type state uint8

const (
	absent  state = iota // not seen (or seen with a type that does not count)
	partial              // the body ended inside it
	done                 // seen whole
)

// scanner is a single-pass JSON reader over one body. It validates structure (brackets, commas,
// colons, literals, number syntax) but is lenient inside strings: control characters and invalid
// escapes are kept as they are, invalid UTF-8 becomes U+FFFD per byte, as encoding/json does.
//
// When trunc is set the body is a prefix of a longer one: reaching its end inside a value sets
// eof instead of bad, and every reader returns what it has read so far, minus any trailing bytes
// whose meaning depends on what follows (half an escape, half a UTF-8 sequence, half a number).
type scanner struct {
	b     []byte
	pos   int
	depth int
	trunc bool // b is the first bytes of a longer body
	eof   bool // the end of b was reached inside a value (only when trunc)
	bad   bool // not JSON, or nested deeper than MaxDepth

	open [MaxDepth/64 + 1]uint64 // per depth, 1 for '{', 0 for '[' (containers being skipped)
	key  []byte                  // scratch for keys with escapes
}

func (s *scanner) stop() bool { return s.eof || s.bad }

// end records that the body ended where more was expected.
func (s *scanner) end() {
	if s.trunc {
		s.eof = true
	} else {
		s.bad = true
	}
	s.pos = len(s.b)
}

// state reports how the value just read ended.
func (s *scanner) state() state {
	if s.eof {
		return partial
	}
	return done
}

// more skips whitespace and reports whether a byte follows; at the end of the body it records
// the end (see end) and reports false.
func (s *scanner) more() bool {
	s.ws()
	if s.pos < len(s.b) {
		return true
	}
	s.end()
	return false
}

func (s *scanner) ws() {
	for s.pos < len(s.b) {
		switch s.b[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// enter consumes the '{' or '[' at pos of a container the parser reads. Those nest only a few
// levels by the grammar of the formats; skipValue bounds the rest.
func (s *scanner) enter() {
	s.pos++
	s.depth++
}

// member moves to the next member of the object being read (after its '{' when first) and
// returns its key, leaving pos at the first byte of the value. It returns false when the object
// ends (its '}' consumed) or reading stops.
func (s *scanner) member(first bool) ([]byte, bool) {
	if !s.more() {
		return nil, false
	}
	c := s.b[s.pos]
	if c == '}' {
		s.pos++
		s.depth--
		return nil, false
	}
	if !first {
		if c != ',' {
			s.bad = true
			return nil, false
		}
		s.pos++
		if !s.more() {
			return nil, false
		}
		c = s.b[s.pos]
	}
	if c != '"' {
		s.bad = true
		return nil, false
	}
	key := s.readKey()
	if !s.colon() {
		return nil, false
	}
	return key, true
}

// colon consumes the ':' after a key and the space before the value.
func (s *scanner) colon() bool {
	if s.stop() {
		return false
	}
	if !s.more() {
		return false
	}
	if s.b[s.pos] != ':' {
		s.bad = true
		return false
	}
	s.pos++
	if !s.more() {
		return false
	}
	return true
}

// element moves to the next element of the array being read (after its '[' when first),
// leaving pos at its first byte. It returns false when the array ends or reading stops.
func (s *scanner) element(first bool) bool {
	if !s.more() {
		return false
	}
	c := s.b[s.pos]
	if c == ']' {
		s.pos++
		s.depth--
		return false
	}
	if !first {
		if c != ',' {
			s.bad = true
			return false
		}
		s.pos++
		if !s.more() {
			return false
		}
	}
	return true
}

// readKey reads the key string at pos. Keys without escapes are returned as a slice of the body.
func (s *scanner) readKey() []byte {
	i := s.pos + 1
	j := quoteOrBackslash(s.b, i)
	if j < len(s.b) && s.b[j] == '"' {
		s.pos = j + 1
		return s.b[i:j]
	}
	s.key = s.str(s.key[:0])
	return s.key
}

// str appends the content of the string at pos (its opening quote) to dst, unescaped.
func (s *scanner) str(dst []byte) []byte {
	b := s.b
	i := s.pos + 1
	for {
		j := plain(b, i)
		dst = append(dst, b[i:j]...)
		i = j
		if i >= len(b) {
			s.end()
			return dst
		}
		switch c := b[i]; {
		case c == '"':
			s.pos = i + 1
			return dst
		case c == '\\':
			var ok bool
			if dst, i, ok = escape(dst, b, i); !ok {
				s.end()
				return dst
			}
		default:
			j := i
			for j < len(b) && b[j] >= utf8.RuneSelf {
				r, size := utf8.DecodeRune(b[j:])
				if r == utf8.RuneError && size == 1 {
					break
				}
				j += size
			}
			dst = append(dst, b[i:j]...)
			i = j
			if i < len(b) && b[i] >= utf8.RuneSelf {
				if !utf8.FullRune(b[i:]) {
					s.end()
					return dst
				}
				dst = append(dst, "\uFFFD"...)
				i++
			}
		}
	}
}

// escape appends the character of the escape sequence at b[i] (a backslash) to dst and returns
// the index after it. ok is false when b ends before the sequence is known. An invalid escape
// keeps its backslash, and the bytes after it are read as ordinary characters.
func escape(dst, b []byte, i int) (_ []byte, next int, ok bool) {
	if i+1 >= len(b) {
		return dst, i, false
	}
	var c byte
	switch b[i+1] {
	case '"', '\\', '/':
		c = b[i+1]
	case 'b':
		c = '\b'
	case 'f':
		c = '\f'
	case 'n':
		c = '\n'
	case 'r':
		c = '\r'
	case 't':
		c = '\t'
	case 'u':
		r, n := hex4(b[i+2:])
		if n < 4 {
			if i+2+n == len(b) {
				return dst, i, false
			}
			return append(dst, '\\'), i + 1, true
		}
		i += 6
		if utf16.IsSurrogate(r) {
			if r < 0xDC00 {
				r2, n := rune(0), 0
				if i+1 < len(b) && b[i] == '\\' && b[i+1] == 'u' {
					r2, n = hex4(b[i+2:])
				}
				switch {
				case n == 4 && r2 >= 0xDC00 && r2 <= 0xDFFF:
					return utf8.AppendRune(dst, utf16.DecodeRune(r, r2)), i + 6, true
				case isPrefix(b[i:], n):
					return dst, i - 6, false
				}
			}
			r = utf8.RuneError
		}
		return utf8.AppendRune(dst, r), i, true
	default:
		return append(dst, '\\'), i + 1, true
	}
	return append(dst, c), i + 2, true
}

// isPrefix reports whether rest, the bytes after a high surrogate escape, may be the start of a
// second \uXXXX escape cut by the end of the body (n hex digits of it seen).
func isPrefix(rest []byte, n int) bool {
	switch {
	case len(rest) == 0:
		return true
	case rest[0] != '\\':
		return false
	case len(rest) == 1:
		return true
	default:
		return rest[1] == 'u' && n < 4 && 2+n == len(rest)
	}
}

// hex4 decodes up to 4 hex digits at the start of b and returns how many it read.
func hex4(b []byte) (rune, int) {
	var r rune
	for n := range 4 {
		if n >= len(b) {
			return r, n
		}
		c := b[n]
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return r, n
		}
		r = r<<4 | rune(c)
	}
	return r, 4
}

// skipValue skips the value at pos, checking its structure without copying anything.
func (s *scanner) skipValue() {
	base := s.depth
	for {
		// At the first byte of a value.
		if !s.more() {
			return
		}
		switch c := s.b[s.pos]; c {
		case '{', '[':
			s.pos++
			s.depth++
			if s.depth > MaxDepth {
				s.bad = true
				return
			}
			w, bit := s.depth/64, uint64(1)<<(s.depth%64)
			if c == '{' {
				s.open[w] |= bit
			} else {
				s.open[w] &^= bit
			}
			if !s.more() {
				return
			}
			if d := s.b[s.pos]; d == '}' && c == '{' || d == ']' && c == '[' {
				s.pos++
				s.depth--
				break
			}
			if c == '{' && !s.skipKey() {
				return
			}
			continue
		case '"':
			s.skipString()
		case 't':
			s.literal("true")
		case 'f':
			s.literal("false")
		case 'n':
			s.literal("null")
		default:
			s.number()
		}
		// After a value: close containers or move to the next value.
		for {
			if s.stop() || s.depth == base {
				return
			}
			if !s.more() {
				return
			}
			obj := s.open[s.depth/64]&(1<<(s.depth%64)) != 0
			c := s.b[s.pos]
			if c == ',' {
				s.pos++
				if obj && !s.skipKey() {
					return
				}
				break
			}
			if obj && c == '}' || !obj && c == ']' {
				s.pos++
				s.depth--
				continue
			}
			s.bad = true
			return
		}
	}
}

// skipKey skips a key and its colon.
func (s *scanner) skipKey() bool {
	if !s.more() {
		return false
	}
	if s.b[s.pos] != '"' {
		s.bad = true
		return false
	}
	s.skipString()
	return s.colon()
}

// skipString skips the string at pos.
func (s *scanner) skipString() {
	b := s.b
	i := s.pos + 1
	for {
		i = quoteOrBackslash(b, i)
		if i >= len(b) {
			s.end()
			return
		}
		if b[i] == '"' {
			s.pos = i + 1
			return
		}
		i += 2 // the escaped byte cannot end the string
	}
}

// literal skips true, false or null. A literal cut by the end of the body is skipped as far as
// it goes: whoever reads next finds the end.
func (s *scanner) literal(lit string) {
	rest := s.b[s.pos:]
	n := min(len(rest), len(lit))
	if string(rest[:n]) != lit[:n] {
		s.bad = true
		return
	}
	s.pos += n
}

// number skips the number at pos and returns it. A number that runs to the end of a truncated
// body is not returned: more digits may follow.
func (s *scanner) number() []byte {
	start := s.pos
	n := numberLen(s.b[start:])
	if n <= 0 {
		if n == 0 {
			s.bad = true
		} else {
			s.end()
		}
		return nil
	}
	s.pos += n
	if s.pos >= len(s.b) {
		s.end()
		return nil
	}
	return s.b[start:s.pos]
}

// numberLen returns the length of the JSON number at the start of b, 0 if there is none, -1 if b
// ends inside one before it is valid.
func numberLen(b []byte) int {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return -1
	}
	switch c := b[i]; {
	case c == '0':
		i++
	case '1' <= c && c <= '9':
		i = digits(b, i)
	default:
		return 0
	}
	if i < len(b) && b[i] == '.' {
		if i++; i >= len(b) {
			return -1
		}
		if !isDigit(b[i]) {
			return 0
		}
		i = digits(b, i)
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		if i++; i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) {
			return -1
		}
		if !isDigit(b[i]) {
			return 0
		}
		i = digits(b, i)
	}
	return i
}

func digits(b []byte, i int) int {
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	return i
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// appendValid appends raw to dst with each byte of invalid UTF-8 replaced by U+FFFD. With atEOF
// an incomplete sequence at the end of raw is dropped: the next bytes would complete it.
func appendValid(dst, raw []byte, atEOF bool) []byte {
	for i := 0; i < len(raw); {
		j := i
		for j < len(raw) {
			// Tool definitions and inputs are mostly ASCII: eight bytes at a time.
			for j+8 <= len(raw) && binary.LittleEndian.Uint64(raw[j:])&msb == 0 {
				j += 8
			}
			if j == len(raw) {
				break
			}
			if raw[j] < utf8.RuneSelf {
				j++
				continue
			}
			r, size := utf8.DecodeRune(raw[j:])
			if r == utf8.RuneError && size == 1 {
				break
			}
			j += size
		}
		dst = append(dst, raw[i:j]...)
		if j == len(raw) {
			break
		}
		if atEOF && !utf8.FullRune(raw[j:]) {
			break
		}
		dst = append(dst, "\uFFFD"...)
		i = j + 1
	}
	return dst
}

// Word-at-a-time search: a byte of v equal to c shows as the high bit of its byte in
// hasByte(v, c); bits above the lowest match may be false positives, never below it.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

func hasByte(v uint64, c byte) uint64 {
	x := v ^ (lsb * uint64(c))
	return (x - lsb) &^ x
}

// plain returns the index of the first '"', '\\' or non-ASCII byte at or after i, or len(b).
func plain(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		v := binary.LittleEndian.Uint64(b[i:])
		if m := (hasByte(v, '"') | hasByte(v, '\\') | v) & msb; m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c == '"' || c == '\\' || c >= utf8.RuneSelf {
			return i
		}
	}
	return i
}

// quoteOrBackslash returns the index of the first '"' or '\\' at or after i, or len(b).
func quoteOrBackslash(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		v := binary.LittleEndian.Uint64(b[i:])
		if m := (hasByte(v, '"') | hasByte(v, '\\')) & msb; m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c == '"' || c == '\\' {
			return i
		}
	}
	return i
}
