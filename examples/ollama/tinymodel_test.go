package ollama

import (
	"bytes"
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"

	"github.com/ollama/ollama/fs/ggml"
)

func writeTiny(t *testing.T, seed uint64) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteTinyModel(f, seed); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The same seed writes the same bytes; another seed other weights in a file of the same size.
func TestTinyModelDeterministic(t *testing.T) {
	a, b, c := writeTiny(t, 1), writeTiny(t, 1), writeTiny(t, 2)
	if !bytes.Equal(a, b) {
		t.Fatalf("seed 1 twice: %x and %x differ", sha256.Sum256(a), sha256.Sum256(b))
	}
	if bytes.Equal(a, c) {
		t.Fatal("seeds 1 and 2 wrote the same bytes")
	}
	if len(a) != len(c) {
		t.Fatalf("seeds 1 and 2: %d and %d bytes", len(a), len(c))
	}
	t.Logf("%d bytes, sha256 %x", len(a), sha256.Sum256(a))
}

// Ollama's own reader takes the file back: a llama with the shape and vocabulary written.
func TestTinyModelDecodes(t *testing.T) {
	b := writeTiny(t, 1)
	m, _, err := ggml.Decode(bytes.NewReader(b), -1)
	if err != nil {
		t.Fatal(err)
	}
	kv := m.KV()
	if got := kv.Architecture(); got != "llama" {
		t.Errorf("architecture %q", got)
	}
	if got := kv.BlockCount(); got != TinyLayers {
		t.Errorf("block count %d", got)
	}
	if got := kv.EmbeddingLength(); got != TinyEmbedding {
		t.Errorf("embedding %d", got)
	}
	if got := kv.ContextLength(); got != TinyContext {
		t.Errorf("context %d", got)
	}
	tokens, _, _ := TinyVocab()
	if got := len(kv.Strings("tokenizer.ggml.tokens")); got != len(tokens) {
		t.Errorf("%d tokens, want %d", got, len(tokens))
	}
	if got, want := len(m.Tensors().Items()), 2+9*TinyLayers; got != want {
		t.Errorf("%d tensors, want %d", got, want)
	}
	for _, tok := range []string{"<0x0A>", "\u2581the", "ing"} {
		found := false
		for _, s := range tokens {
			found = found || s == tok
		}
		if !found {
			t.Errorf("vocabulary lacks %q", tok)
		}
	}
}
