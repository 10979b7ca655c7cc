package llmsim

import (
	"fmt"
	"strings"
	"testing"
)

// blocksText returns n full 16-token blocks of text, distinct for each tag.
func blocksText(tag string, n int) string {
	var sb strings.Builder
	for i := range n {
		fmt.Fprintf(&sb, "%-64.64s", fmt.Sprintf("[%s block %d]", tag, i))
	}
	return sb.String()
}

func TestBlockCacheLookup(t *testing.T) {
	sys := blocksText("sys", 4)
	tests := []struct {
		name  string
		seed  []string // prompts accessed first
		query string
		want  int // cached tokens
	}{
		{"cold", nil, sys + "hi", 0},
		{"same prompt again", []string{sys + "hi"}, sys + "hi", 64},
		{"shared prefix", []string{sys + blocksText("a", 2)}, sys + blocksText("b", 2), 64},
		{"longer than seen", []string{sys}, sys + blocksText("c", 3) + "tail", 64},
		// A fully cached prompt of whole blocks still computes its last token: one block less.
		{"fully cached, whole blocks", []string{sys}, sys, 48},
		{"fully cached plus a partial block", []string{sys + "x"}, sys + "x", 64},
		{"diverges in the first block", []string{sys}, "X" + sys[1:], 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewBlockCache(100)
			for _, s := range tt.seed {
				c.Access(NewPrompt(s, 16))
			}
			if got := c.Lookup(NewPrompt(tt.query, 16)); got != tt.want {
				t.Errorf("Lookup = %d tokens, want %d", got, tt.want)
			}
		})
	}
}

func TestBlockCacheEviction(t *testing.T) {
	c := NewBlockCache(6)
	a := NewPrompt(blocksText("a", 4), 16)
	b := NewPrompt(blocksText("b", 4), 16)
	c.Insert(a)
	c.Insert(b) // 8 blocks into 6: two of a's go, its tail first
	if got := c.Len(); got != 6 {
		t.Fatalf("Len = %d, want 6", got)
	}
	if got := c.Evictions(); got != 2 {
		t.Errorf("Evictions = %d, want 2", got)
	}
	if got := c.Lookup(a); got != 2*16 {
		t.Errorf("a hits %d tokens, want its first 2 blocks (32): the tail is evicted first", got)
	}
	if got := c.Lookup(b); got != 3*16 {
		t.Errorf("b hits %d tokens, want 48", got)
	}
	// Inserting a again evicts b's tail, never a's own cached head.
	c.Insert(a)
	if got := c.Lookup(a); got != 3*16 {
		t.Errorf("after inserting a again, a hits %d tokens, want 48", got)
	}
	if got := c.Lookup(b); got != 2*16 {
		t.Errorf("after inserting a again, b hits %d tokens, want its first 2 blocks (32)", got)
	}
	c.Reset()
	if c.Len() != 0 || c.Evictions() != 0 || c.Lookup(a) != 0 {
		t.Error("Reset left state behind")
	}
}

func TestBlockCachePromptLargerThanCapacity(t *testing.T) {
	c := NewBlockCache(3)
	p := NewPrompt(blocksText("big", 10)+"x", 16)
	c.Insert(p)
	if got := c.Lookup(p); got != 3*16 {
		t.Errorf("hits %d tokens, want the first 3 blocks (48)", got)
	}
}

func TestBlockCacheUnlimited(t *testing.T) {
	c := NewBlockCache(0)
	for i := range 50 {
		c.Insert(NewPrompt(blocksText(fmt.Sprint(i), 100), 16))
	}
	if c.Len() != 5000 || c.Evictions() != 0 {
		t.Errorf("Len = %d, Evictions = %d; want 5000, 0", c.Len(), c.Evictions())
	}
}

func BenchmarkBlockCacheAccess(b *testing.B) {
	c := NewBlockCache(4096)
	prompts := make([]Prompt, 64)
	for i := range prompts {
		prompts[i] = NewPrompt(blocksText("shared", 32)+blocksText(fmt.Sprint(i), 64), 16)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.Access(prompts[i%len(prompts)])
		i++
	}
}
