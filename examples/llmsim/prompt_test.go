package llmsim

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTokens(t *testing.T) {
	tests := []struct {
		text string
		want int
	}{
		{"", 0},
		{"a", 1},
		{"abcd", 1},
		{"abcde", 2},
		{"héllo wörld!", 3}, // 12 chars, more bytes
		{strings.Repeat("x", 400), 100},
	}
	for _, tt := range tests {
		if got := Tokens(tt.text); got != tt.want {
			t.Errorf("Tokens(%q) = %d, want %d", tt.text, got, tt.want)
		}
		if got := NewPrompt(tt.text, 16).Tokens; got != tt.want {
			t.Errorf("NewPrompt(%q).Tokens = %d, want %d", tt.text, got, tt.want)
		}
	}
}

func TestNewPromptBlocks(t *testing.T) {
	block := strings.Repeat("abcd", 16) // one 16-token block
	tests := []struct {
		name   string
		text   string
		blocks int
	}{
		{"empty", "", 0},
		{"partial block only", block[:63], 0},
		{"one block", block, 1},
		{"one block and a partial", block + "x", 1},
		{"three blocks", block + block + block, 3},
		{"non-ASCII three blocks", strings.Repeat("é", 64*3), 3},
		{"non-ASCII partial", strings.Repeat("日本", 40), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := len(NewPrompt(tt.text, 16).Hashes); got != tt.blocks {
				t.Errorf("blocks = %d, want %d", got, tt.blocks)
			}
		})
	}
}

func TestNewPromptSharedPrefix(t *testing.T) {
	base := strings.Repeat("the cache of a prefix ", 40) // 880 chars = 13 blocks of 64 chars and a tail
	a := NewPrompt(base+" and then one thing", 16)
	b := NewPrompt(base+" and then another thing entirely", 16)
	shared := len(base) / 64
	if !slices.Equal(a.Hashes[:shared], b.Hashes[:shared]) {
		t.Fatal("prompts sharing a prefix do not share its blocks")
	}
	// Change one char in block 5: blocks 5 and later differ, 0-4 stay.
	c := NewPrompt(base[:5*64+3]+"X"+base[5*64+4:], 16)
	for i := range len(c.Hashes) {
		if same := c.Hashes[i] == a.Hashes[i]; same != (i < 5) {
			t.Errorf("block %d: same = %v", i, same)
		}
	}
	// Same block text at another position gets another hash (the hash is chained).
	rep := NewPrompt(strings.Repeat(base[:64], 3), 16)
	if rep.Hashes[0] == rep.Hashes[1] || rep.Hashes[1] == rep.Hashes[2] {
		t.Error("equal blocks at different positions share a hash")
	}
}

func TestChatTextPrefixAcrossTurns(t *testing.T) {
	turn1 := []Message{{"system", "be brief"}, {"user", "hello"}}
	turn2 := append(slices.Clone(turn1), Message{"assistant", "hi there"}, Message{"user", "again"})
	t1, t2 := ChatText(turn1), ChatText(turn2)
	if !strings.HasPrefix(t2, t1) {
		t.Fatalf("turn 2 text does not start with turn 1 text:\n%q\n%q", t1, t2)
	}
	want := "<|system|>\nbe brief\n<|user|>\nhello\n<|assistant|>\n"
	if t1 != want {
		t.Errorf("ChatText = %q, want %q", t1, want)
	}
}

func FuzzNewPrompt(f *testing.F) {
	f.Add("hello world", " and more")
	f.Add(strings.Repeat("é", 70), "x")
	f.Add(strings.Repeat("ab", 100), strings.Repeat("日", 100))
	f.Fuzz(func(t *testing.T, a, b string) {
		if !utf8.ValidString(a) || !utf8.ValidString(b) {
			t.Skip()
		}
		pa, pab := NewPrompt(a, 4), NewPrompt(a+b, 4)
		if want := utf8.RuneCountInString(a) / 16; len(pa.Hashes) != want {
			t.Fatalf("%d blocks, want %d", len(pa.Hashes), want)
		}
		if !slices.Equal(pa.Hashes, pab.Hashes[:len(pa.Hashes)]) {
			t.Fatal("a prompt's blocks are not a prefix of its extension's")
		}
	})
}

func BenchmarkNewPrompt(b *testing.B) {
	text := strings.Repeat("the prefix cache holds blocks of tokens. ", 1500) // ~15k tokens
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		NewPrompt(text, 16)
	}
}
