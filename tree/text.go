package tree

import (
	"math/bits"
	"unicode/utf8"
)

// Text is compared in units: a unit is one rune as utf8.DecodeRuneInString decodes it, so a
// valid encoding is one unit and each byte of an invalid or truncated encoding is one unit of
// its own (the same rule utf8.RuneCountInString counts by). Two units are equal when their
// bytes are. A valid U+FFFD and an invalid byte both decode to RuneError but differ in bytes,
// so they are different units.
//
// Decoding is greedy from the left and looks only at a unit's own bytes, with one exception: a
// truncated encoding at the very end of a string ("\xe4\xbd") is one unit per byte there, but
// the same bytes followed by "\xa0" form one unit. Nodes whose text ends that way are marked
// open and compared unit by unit at their end.

const hiBits = 0x8080808080808080

// load64 reads s[i:i+8] little-endian; the compiler turns it into one load.
func load64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// firstKey returns the first unit of a non-empty s packed big-endian into a uint32, zero
// padded. The packing is unique per unit: the continuation bytes of a multi-byte unit are
// never zero, so no longer unit packs like a one-byte one.
func firstKey(s string) uint32 {
	c := s[0]
	if c < utf8.RuneSelf {
		return uint32(c) << 24
	}
	_, size := utf8.DecodeRuneInString(s)
	k := uint32(c) << 24
	for i := 1; i < size; i++ {
		k |= uint32(s[i]) << (24 - 8*i)
	}
	return k
}

// countUnits returns the number of units in s.
func countUnits(s string) int {
	n, i := 0, 0
	for i < len(s) {
		if i+8 <= len(s) && load64(s, i)&hiBits == 0 {
			i += 8
			n += 8
			continue
		}
		if s[i] < utf8.RuneSelf {
			i++
		} else {
			_, size := utf8.DecodeRuneInString(s[i:])
			i += size
		}
		n++
	}
	return n
}

// unitPrefix returns the length in bytes of the first n units of s (all of s when it has
// fewer).
func unitPrefix(s string, n int) int {
	i := 0
	for n > 0 && i < len(s) {
		if n >= 8 && i+8 <= len(s) && load64(s, i)&hiBits == 0 {
			i += 8
			n -= 8
			continue
		}
		if s[i] < utf8.RuneSelf {
			i++
		} else {
			_, size := utf8.DecodeRuneInString(s[i:])
			i += size
		}
		n--
	}
	return i
}

// openTail reports whether s ends in a truncated encoding that more bytes could complete.
// Such an encoding starts with a lead byte (never a continuation byte, so always a unit
// start) in the last three bytes.
func openTail(s string) bool {
	for i := max(0, len(s)-3); i < len(s); i++ {
		if s[i] >= 0xC0 && !utf8.FullRuneInString(s[i:]) {
			return true
		}
	}
	return false
}

// mismatch returns the index of the first byte where a and b differ, or the length of the
// shorter one.
func mismatch(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	// Long equal runs go through the runtime's vectorised string comparison.
	for i+64 <= n && a[i:i+64] == b[i:i+64] {
		i += 64
	}
	for i+8 <= n {
		if x := load64(a, i) ^ load64(b, i); x != 0 {
			return i + bits.TrailingZeros64(x)/8
		}
		i += 8
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// common returns the longest common prefix of a and b made of whole equal units, in bytes and
// in units.
func common(a, b string) (nb, nu int) {
	l := mismatch(a, b)
	i := 0
	for i < l {
		if i+8 <= l && load64(a, i)&hiBits == 0 {
			i += 8
			nu += 8
			continue
		}
		if a[i] < utf8.RuneSelf {
			i++
			nu++
			continue
		}
		_, sa := utf8.DecodeRuneInString(a[i:])
		_, sb := utf8.DecodeRuneInString(b[i:])
		if sa != sb || i+sa > l {
			break
		}
		i += sa
		nu++
	}
	return i, nu
}
