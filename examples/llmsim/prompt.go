package llmsim

import (
	"math/bits"
	"strings"
	"unicode/utf8"
)

// CharsPerToken is the simulator's tokenizer: every 4 chars (code points) of the prompt text are
// one token, and a shorter tail is one more.
const CharsPerToken = 4

// DefaultBlockTokens is vLLM's default KV cache block size, in tokens.
const DefaultBlockTokens = 16

// Message is one chat message as the simulator serializes it.
type Message struct {
	Role    string
	Content string
}

// ChatText serializes chat messages into the prompt text the simulator tokenizes. Each message
// is written as "<|role|>\n" + content + "\n" in order, followed by the generation prompt
// "<|assistant|>\n", like a chat template: turn n+1 of a conversation (which resends turn n's
// messages and the answer) starts with the text of turn n, so it can hit turn n's blocks.
func ChatText(msgs []Message) string {
	n := len("<|assistant|>\n")
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content) + 6
	}
	var sb strings.Builder
	sb.Grow(n)
	for _, m := range msgs {
		sb.WriteString("<|")
		sb.WriteString(m.Role)
		sb.WriteString("|>\n")
		sb.WriteString(m.Content)
		sb.WriteByte('\n')
	}
	sb.WriteString("<|assistant|>\n")
	return sb.String()
}

// Tokens returns the number of tokens of text: its chars divided by CharsPerToken, rounded up.
func Tokens(text string) int {
	return (utf8.RuneCountInString(text) + CharsPerToken - 1) / CharsPerToken
}

// Prompt is a prompt text as the prefix cache sees it: its token count and the chained hashes
// of its full blocks (a partial last block is never cached, as in vLLM).
type Prompt struct {
	Tokens      int
	BlockTokens int
	Hashes      []uint64
}

// NewPrompt tokenizes text and hashes its full blocks of blockTokens tokens
// (DefaultBlockTokens when blockTokens <= 0). Block i's hash depends on the text of blocks 0..i,
// so two prompts share block hashes exactly as long as they share a prefix of whole blocks.
func NewPrompt(text string, blockTokens int) Prompt {
	if blockTokens <= 0 {
		blockTokens = DefaultBlockTokens
	}
	blockChars := blockTokens * CharsPerToken
	p := Prompt{BlockTokens: blockTokens}
	chars := utf8.RuneCountInString(text)
	p.Tokens = (chars + CharsPerToken - 1) / CharsPerToken
	n := chars / blockChars
	if n == 0 {
		return p
	}
	p.Hashes = make([]uint64, n)
	var parent uint64
	if chars == len(text) { // ASCII: a char is a byte
		for i := range n {
			parent = hashBlock(parent, text[i*blockChars:(i+1)*blockChars])
			p.Hashes[i] = parent
		}
		return p
	}
	start, count, i := 0, 0, 0
	for off := range text {
		if count == blockChars {
			parent = hashBlock(parent, text[start:off])
			p.Hashes[i] = parent
			i++
			start, count = off, 0
		}
		count++
	}
	if i < n { // the last full block ends at the end of text
		p.Hashes[i] = hashBlock(parent, text[start:])
	}
	return p
}

// hashBlock hashes one block of text chained with its parent's hash. It reads 8 bytes at a
// time: prompts of tens of thousands of tokens are hashed on every request.
func hashBlock(parent uint64, s string) uint64 {
	const (
		k1 = 0x9E3779B97F4A7C15
		k2 = 0xC2B2AE3D27D4EB4F
	)
	h := (parent ^ k2) * k1
	h ^= uint64(len(s))
	for len(s) >= 8 {
		w := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
			uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
		h = bits.RotateLeft64(h^(w*k2), 31) * k1
		s = s[8:]
	}
	for i := 0; i < len(s); i++ {
		h = bits.RotateLeft64(h^(uint64(s[i])*k2), 31) * k1
	}
	// Final avalanche (splitmix64's) so that near-identical blocks get unrelated hashes.
	h ^= h >> 30
	h *= 0xBF58476D1CE4E5B9
	h ^= h >> 27
	h *= 0x94D049BB133111EB
	return h ^ h>>31
}
