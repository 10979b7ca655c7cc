package llmsim

import "strings"

// vocab holds 4-char tokens: one output token is exactly one entry, so a reply of n tokens
// has 4n chars and re-tokenizes to n tokens.
var vocab = [...]string{
	"the ", "and ", "that", " is ", "of a", "cach", "e hi", "ts. ", "The ", "mode",
	"l re", "ads ", "pref", "ix, ", "then", " dec", "odes", " one", " tok", "en. ",
	"Rout", "ing ", "keep", "s ke", "ys w", "arm.", " So ", "it g", "oes.", " Yes",
}

// replyText returns n tokens of deterministic filler text, a function of seed.
func replyText(seed uint64, n int) string {
	var sb strings.Builder
	sb.Grow(n * CharsPerToken)
	for range n {
		seed = seed*6364136223846793005 + 1442695040888963407
		sb.WriteString(vocab[(seed>>33)%uint64(len(vocab))])
	}
	return sb.String()
}
