package ollama

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"math/rand/v2"

	"github.com/ollama/ollama/fs/ggml"
)

// The tiny model's shape: a llama of 4 layers, embedding 256, 4 heads, a context of 8192, and an
// SPM vocabulary of byte tokens plus word pieces (lowercase pieces of up to three letters, with
// and without the word-start mark). Its weights are random: it writes nonsense, at a speed and
// with a prefix cache that are Ollama's own.
const (
	TinyLayers      = 4
	TinyEmbedding   = 256
	TinyHeads       = 4
	TinyFeedFwd     = 512
	TinyContext     = 8192
	tinyRopeFreq    = 10000
	tinyNormEps     = 1e-5
	wordStart       = "\u2581" // SentencePiece's word-start mark
	tokenNormal     = 1
	tokenUnknown    = 2
	tokenControl    = 3
	tokenByte       = 6
	ggmlTypeF32     = 0
	ggmlTypeF16     = 1
	tinyWeightStd   = 0.02
	tinyFileTypeF16 = 1
)

// TinyVocab is the tiny model's vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then the word
// pieces, and each token's type and score (SPM merges the pair whose token scores highest:
// longer pieces score higher).
func TinyVocab() (tokens []string, types []int32, scores []float32) {
	add := func(tok string, typ int32, score float32) {
		tokens, types, scores = append(tokens, tok), append(types, typ), append(scores, score)
	}
	add("<unk>", tokenUnknown, 0)
	add("<s>", tokenControl, 0)
	add("</s>", tokenControl, 0)
	for b := range 256 {
		add(fmt.Sprintf("<0x%02X>", b), tokenByte, 0)
	}
	const letters = "abcdefghijklmnopqrstuvwxyz"
	add(wordStart, tokenNormal, 1)
	for c := byte(' ' + 1); c < 0x7f; c++ {
		add(string(c), tokenNormal, 1)
	}
	for _, c := range letters + "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" {
		add(wordStart+string(c), tokenNormal, 2)
	}
	for _, a := range letters {
		for _, b := range letters {
			add(string(a)+string(b), tokenNormal, 2)
			add(wordStart+string(a)+string(b), tokenNormal, 3)
		}
	}
	for _, a := range letters {
		for _, b := range letters {
			for _, c := range letters {
				add(string(a)+string(b)+string(c), tokenNormal, 3)
				add(wordStart+string(a)+string(b)+string(c), tokenNormal, 4)
			}
		}
	}
	return tokens, types, scores
}

// WriteTinyModel writes the tiny model as GGUF, with Ollama's own writer (fs/ggml.WriteGGUF),
// its weights drawn from seed: the same seed gives the same bytes.
func WriteTinyModel(w io.WriteSeeker, seed uint64) error {
	tokens, types, scores := TinyVocab()
	kv := ggml.KV{
		"general.architecture":                   "llama",
		"general.name":                           "kvroute-tiny",
		"general.file_type":                      uint32(tinyFileTypeF16),
		"llama.context_length":                   uint32(TinyContext),
		"llama.embedding_length":                 uint32(TinyEmbedding),
		"llama.block_count":                      uint32(TinyLayers),
		"llama.feed_forward_length":              uint32(TinyFeedFwd),
		"llama.attention.head_count":             uint32(TinyHeads),
		"llama.attention.head_count_kv":          uint32(TinyHeads),
		"llama.attention.layer_norm_rms_epsilon": float32(tinyNormEps),
		"llama.rope.dimension_count":             uint32(TinyEmbedding / TinyHeads),
		"llama.rope.freq_base":                   float32(tinyRopeFreq),
		"llama.vocab_size":                       uint32(len(tokens)),
		"tokenizer.ggml.model":                   "llama",
		"tokenizer.ggml.tokens":                  tokens,
		"tokenizer.ggml.token_type":              types,
		"tokenizer.ggml.scores":                  scores,
		"tokenizer.ggml.unknown_token_id":        uint32(0),
		"tokenizer.ggml.bos_token_id":            uint32(1),
		"tokenizer.ggml.eos_token_id":            uint32(2),
		"tokenizer.ggml.add_bos_token":           true,
		"tokenizer.ggml.add_eos_token":           false,
	}
	// One stream for every weight, in a fixed order: the file depends on the seed only.
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	f16 := func(shape ...uint64) io.WriterTo {
		n := uint64(1)
		for _, d := range shape {
			n *= d
		}
		b := make([]byte, 2*n)
		for i := range n {
			h := halfBits(float32(rng.NormFloat64() * tinyWeightStd))
			b[2*i], b[2*i+1] = byte(h), byte(h>>8)
		}
		return bytes.NewReader(b)
	}
	ones := func(n uint64) io.WriterTo {
		b := make([]byte, 4*n)
		for i := range n {
			bits := math.Float32bits(1)
			b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(bits), byte(bits>>8), byte(bits>>16), byte(bits>>24)
		}
		return bytes.NewReader(b)
	}
	const e, ff = TinyEmbedding, TinyFeedFwd
	vocab := uint64(len(tokens))
	// Shapes are written outermost first (rows, columns), as fs/ggml's converters write them;
	// the output projection is tied to the embedding (llama.cpp uses token_embd when output is
	// absent).
	ts := []ggml.Tensor{
		{Name: "token_embd.weight", Kind: ggmlTypeF16, Shape: []uint64{vocab, e}, WriterTo: f16(vocab, e)},
		{Name: "output_norm.weight", Kind: ggmlTypeF32, Shape: []uint64{e}, WriterTo: ones(e)},
	}
	for l := range TinyLayers {
		blk := func(s string) string { return fmt.Sprintf("blk.%d.%s", l, s) }
		ts = append(ts,
			ggml.Tensor{Name: blk("attn_norm.weight"), Kind: ggmlTypeF32, Shape: []uint64{e}, WriterTo: ones(e)},
			ggml.Tensor{Name: blk("attn_q.weight"), Kind: ggmlTypeF16, Shape: []uint64{e, e}, WriterTo: f16(e, e)},
			ggml.Tensor{Name: blk("attn_k.weight"), Kind: ggmlTypeF16, Shape: []uint64{e, e}, WriterTo: f16(e, e)},
			ggml.Tensor{Name: blk("attn_v.weight"), Kind: ggmlTypeF16, Shape: []uint64{e, e}, WriterTo: f16(e, e)},
			ggml.Tensor{Name: blk("attn_output.weight"), Kind: ggmlTypeF16, Shape: []uint64{e, e}, WriterTo: f16(e, e)},
			ggml.Tensor{Name: blk("ffn_norm.weight"), Kind: ggmlTypeF32, Shape: []uint64{e}, WriterTo: ones(e)},
			ggml.Tensor{Name: blk("ffn_gate.weight"), Kind: ggmlTypeF16, Shape: []uint64{ff, e}, WriterTo: f16(ff, e)},
			ggml.Tensor{Name: blk("ffn_up.weight"), Kind: ggmlTypeF16, Shape: []uint64{ff, e}, WriterTo: f16(ff, e)},
			ggml.Tensor{Name: blk("ffn_down.weight"), Kind: ggmlTypeF16, Shape: []uint64{e, ff}, WriterTo: f16(e, ff)},
		)
	}
	return ggml.WriteGGUF(w, kv, ts)
}

// halfBits is f as an IEEE 754 half (binary16), rounded to nearest; values too small for a
// normal half flush to zero (the weights are drawn with a standard deviation of 0.02).
func halfBits(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23&0xff) - 127 + 15
	mant := b & 0x7fffff
	switch {
	case exp <= 0:
		return sign
	case exp >= 0x1f:
		return sign | 0x7c00
	}
	h := uint32(exp)<<10 | mant>>13
	if mant&0x1000 != 0 { // round half up on the first dropped bit
		h++
	}
	return sign | uint16(h)
}
