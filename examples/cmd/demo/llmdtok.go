package main

import (
	"encoding/binary"
	"hash/fnv"
	"strings"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// llmdPrompt returns a resolved call's prompt as llm-d-inference-sim's prefix cache sees it
// with --force-dummy-tokenizer, for the reference hit ratio of an llmd fleet: chat messages
// rendered as "### role: content\n", split into word and punctuation tokens (each with the
// blanks after it), and chained hashes of full blocks of blockTokens tokens.
func llmdPrompt(c workload.Call, blockTokens int) llmsim.Prompt {
	text := c.Prompt
	if c.API == workload.APIChat {
		var b strings.Builder
		for _, m := range c.Messages {
			b.WriteString("### ")
			b.WriteString(m.Role)
			b.WriteString(": ")
			b.WriteString(m.Content)
			b.WriteString("\n")
		}
		text = b.String()
	}
	p := llmsim.Prompt{BlockTokens: blockTokens}
	h := fnv.New64a()
	var parent [8]byte
	inBlock := 0
	h.Write(parent[:])
	for tok := range dummyTokens(text) {
		p.Tokens++
		h.Write([]byte(tok))
		h.Write([]byte{0})
		if inBlock++; inBlock == blockTokens {
			sum := h.Sum64()
			p.Hashes = append(p.Hashes, sum)
			binary.LittleEndian.PutUint64(parent[:], sum)
			h.Reset()
			h.Write(parent[:])
			inBlock = 0
		}
	}
	return p
}

// dummyPunct are the one-char tokens of llm-d's dummy tokenizer, whose regular expression is
// (\{|\}|:|,|-|\.|\?|\!|;|@|#|\$|%|\^|&|\*|\(|\)|\+|\-|_|~|/|\\|>|<|\[|\]|=|"|'|\w+)(\s*).
const dummyPunct = "{}:,-.?!;@#$%^&*()+_~/\\><[]=\"'"

// dummyTokens yields the tokens of llm-d's dummy tokenizer, equivalent to its regular
// expression (leftmost-first: "_" alone is punctuation, inside a word it is a word char) and
// much faster on the Mooncake trace's long prompts.
func dummyTokens(s string) func(yield func(string) bool) {
	return func(yield func(string) bool) {
		i := 0
		for i < len(s) {
			start := i
			switch c := s[i]; {
			case strings.IndexByte(dummyPunct, c) >= 0:
				i++
			case isWordByte(c):
				for i < len(s) && isWordByte(s[i]) {
					i++
				}
			default:
				i++ // not a token start: skipped
				continue
			}
			for i < len(s) && isSpaceByte(s[i]) {
				i++
			}
			if !yield(s[start:i]) {
				return
			}
		}
	}
}

// isWordByte is RE2's \w: [0-9A-Za-z_].
func isWordByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_'
}

// isSpaceByte is RE2's \s: [\t\n\f\r ].
func isSpaceByte(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r'
}
