// Package workload turns request traces into prompt text for benchmarks, tests and the demo.
//
// The Mooncake trace (traces/mooncake_synthetic_trace.jsonl.gz, embedded: Mooncake) describes
// prompts as lists of prefix-chained block hash ids, one per 512 tokens. Block maps each id to a
// deterministic block of English-like text, so two requests whose id lists share a prefix
// produce prompts that share the same prefix of text, and two different ids diverge at their
// first char. Every part of the project that needs Mooncake prompts uses this mapping.
package workload

import (
	"bufio"
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	// CharsPerToken is the project's token estimate: chars / 4.
	CharsPerToken = 4
	// BlockTokens is the number of tokens one Mooncake hash id stands for.
	BlockTokens = 512
	// BlockChars is the length of one full block of text, in chars.
	BlockChars = BlockTokens * CharsPerToken
)

// TraceFile is the Mooncake trace's file name in a workloads directory (KVROUTE_WORKLOADS).
const TraceFile = "mooncake_synthetic_trace.jsonl"

// mooncakeGz is the Mooncake trace the repository ships (traces/README.md says where it comes
// from; Apache-2.0, its license beside it), gzip-compressed: a fresh clone runs the demo's
// Mooncake workload and the simulator's card with nothing else on the machine.
//
//go:embed traces/mooncake_synthetic_trace.jsonl.gz
var mooncakeGz []byte

// Mooncake returns the Mooncake trace: the one the repository ships, or, when the environment
// variable KVROUTE_WORKLOADS names a directory, that directory's TraceFile (an error when it is
// not there: a directory named on purpose is never passed over for the shipped copy).
func Mooncake() ([]Request, error) {
	if dir := os.Getenv("KVROUTE_WORKLOADS"); dir != "" {
		return LoadMooncake(filepath.Join(dir, TraceFile))
	}
	return readMooncake(bytes.NewReader(mooncakeGz), "traces/"+TraceFile+".gz")
}

// MooncakeSource says where Mooncake reads the trace from.
func MooncakeSource() string {
	if dir := os.Getenv("KVROUTE_WORKLOADS"); dir != "" {
		return filepath.Join(dir, TraceFile)
	}
	return "the trace shipped in examples/workload/traces"
}

// Request is one line of a Mooncake trace.
type Request struct {
	Timestamp    time.Duration // since the trace start
	InputLength  int           // prompt tokens
	OutputLength int           // output tokens
	HashIDs      []int
}

type traceLine struct {
	Timestamp    int64 `json:"timestamp"`
	InputLength  int   `json:"input_length"`
	OutputLength int   `json:"output_length"`
	HashIDs      []int `json:"hash_ids"`
}

// LoadMooncake reads a Mooncake-format JSONL trace from a file, plain or gzip-compressed.
func LoadMooncake(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readMooncake(f, path)
}

// readMooncake reads a Mooncake-format JSONL trace, gzip-compressed or not (told by its first
// bytes); name is where it comes from, for errors.
func readMooncake(r io.Reader, name string) ([]Request, error) {
	br := bufio.NewReader(r)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		defer zr.Close()
		r = zr
	} else {
		r = br
	}
	var out []Request
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var tl traceLine
		if err := json.Unmarshal([]byte(line), &tl); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		if tl.InputLength < 0 || tl.OutputLength < 0 {
			return nil, fmt.Errorf("%s:%d: negative length", name, n)
		}
		out = append(out, Request{
			Timestamp:    time.Duration(tl.Timestamp) * time.Millisecond,
			InputLength:  tl.InputLength,
			OutputLength: tl.OutputLength,
			HashIDs:      tl.HashIDs,
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return out, nil
}

var words = strings.Fields(`the a of and to in is that for it as with was on be by at this
from or an are which have not has but had were their they one all can there been if more when
will would who so no model token cache prefix request server batch memory layer attention
router upstream latency energy prompt context window decode prefill kernel tensor weight
system user assistant answer question document section table figure result method data
value function return error state time first last next number order level group point`)

var blocks sync.Map // int -> string

// Block returns the text of hash id id: BlockChars chars of ASCII words, starting with a
// marker unique to the id, the same on every call and in every process.
func Block(id int) string {
	if b, ok := blocks.Load(id); ok {
		return b.(string)
	}
	var sb strings.Builder
	sb.Grow(BlockChars + 16)
	sb.WriteString("[block ")
	sb.WriteString(strconv.Itoa(id))
	sb.WriteString("] ")
	AppendWords(&sb, uint64(id)*0x9E3779B97F4A7C15+0x632BE59BD9B4E019, BlockChars)
	b := sb.String()[:BlockChars]
	blocks.Store(id, b)
	return b
}

// AppendWords appends to sb words drawn from the state s (splitmix64), a sentence's end now and
// then, until sb holds at least until bytes: the same words for the same s, in every process.
func AppendWords(sb *strings.Builder, s uint64, until int) {
	for sb.Len() < until {
		s = Splitmix(s)
		sb.WriteString(words[s%uint64(len(words))])
		if s>>32%13 == 0 {
			sb.WriteString(". ")
		} else {
			sb.WriteByte(' ')
		}
	}
}

// Splitmix is one step of splitmix64: a deterministic generator whose results do not change
// with the Go version, which math/rand does not promise.
func Splitmix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

// Prompt returns the request's prompt text: its blocks in order, the last one cut in
// proportion to InputLength, so the prompt has InputLength*CharsPerToken chars (fewer when
// the trace lists fewer blocks than InputLength needs).
func (r Request) Prompt() string {
	if len(r.HashIDs) == 0 {
		return ""
	}
	total := r.InputLength * CharsPerToken
	var sb strings.Builder
	sb.Grow(total)
	for i, id := range r.HashIDs {
		b := Block(id)
		if i == len(r.HashIDs)-1 {
			if rest := total - sb.Len(); rest >= 0 && rest < len(b) {
				b = b[:rest]
			}
		}
		sb.WriteString(b)
	}
	return sb.String()
}
