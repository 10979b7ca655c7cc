package kvroute

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"unsafe"

	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
)

// refTokens is what the filter must give, from Go's own JSON decoder: the tokens of data with
// the members pdFilter names removed (top level, and inside the objects it descends into).
func refTokens(t testing.TB, data []byte, filter bool) []any {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var out []any
	var value func(f *memberFilter, keep bool)
	value = func(f *memberFilter, keep bool) {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("reference decoder: %v", err)
		}
		if keep {
			out = append(out, tok)
		}
		switch tok {
		case json.Delim('{'):
			for dec.More() {
				k, _ := dec.Token()
				name := k.(string)
				if f != nil && f.remove[name] {
					value(nil, false)
					continue
				}
				if keep {
					out = append(out, name)
				}
				var inner *memberFilter
				if f != nil {
					inner = f.inner[name]
				}
				value(inner, keep)
			}
			end, _ := dec.Token()
			if keep {
				out = append(out, end)
			}
		case json.Delim('['):
			for dec.More() {
				value(nil, keep)
			}
			end, _ := dec.Token()
			if keep {
				out = append(out, end)
			}
		}
	}
	f := pdFilter
	if !filter {
		f = nil
	}
	value(f, true)
	return out
}

// isSubsequence: every byte of out is a byte of in, in order (nothing added or changed).
func isSubsequence(out, in []byte) bool {
	i := 0
	for _, c := range out {
		for i < len(in) && in[i] != c {
			i++
		}
		if i == len(in) {
			return false
		}
		i++
	}
	return true
}

func checkStrip(t *testing.T, in []byte) {
	out, err := stripPD(in)
	// checkPDPrefix finds the same syntax errors, and running out is none.
	if cerr := checkPDPrefix(in); (cerr != nil) != (err != nil && !strings.Contains(err.Error(), "ends early")) {
		t.Fatalf("checkPDPrefix(%q) = %v, stripPD's error %v", in, cerr, err)
	}
	// The same bytes read one at a time, through the streaming reader, its frame stack
	// checked after every read.
	s := newPDStripper(iotest.OneByteReader(bytes.NewReader(in)), nil)
	var streamed []byte
	var serr error
	buf := make([]byte, 7)
	for {
		n, rerr := s.Read(buf)
		streamed = append(streamed, buf[:n]...)
		checkFrames(t, s)
		if rerr != nil {
			if rerr != io.EOF {
				serr = rerr
			}
			break
		}
	}
	if (err == nil) != (serr == nil) || (err == nil && !bytes.Equal(out, streamed)) {
		t.Fatalf("stripPD and the streamed filter disagree on %q: %q (%v) against %q (%v)", in, out, err, streamed, serr)
	}
	trimmed := bytes.TrimLeft(in, " \t\r\n")
	// Deeper than llmreq.MaxDepth is not JSON the router reads (llm_prompt refuses it too).
	valid := json.Valid(in) && len(trimmed) > 0 && trimmed[0] == '{' && nesting(in) <= llmreq.MaxDepth
	if !valid {
		if err == nil {
			t.Fatalf("%q is not one JSON object, and the filter read it without an error (gave %q)", in, out)
		}
		if !errors.Is(err, errNotJSONObject) {
			t.Fatalf("error %v, want errNotJSONObject", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("a JSON object refused: %v\n%q", err, in)
	}
	if !json.Valid(out) {
		t.Fatalf("valid JSON in, invalid out:\n%q\n%q", in, out)
	}
	if !isSubsequence(out, in) {
		t.Fatalf("the output has bytes the input has not (in order):\n%q\n%q", in, out)
	}
	want := refTokens(t, in, true)
	if got := refTokens(t, out, false); !reflect.DeepEqual(got, want) {
		t.Fatalf("output is not the input without the P/D members:\nin   %q\nout  %q\ngot  %v\nwant %v", in, out, got, want)
	}
}

// maxFrameBytes bounds the filter's frame stack, whatever the body: the frames of the objects
// it filters (pdFilter's two levels), however deep the body nests.
const maxFrameBytes = 1 << 10

// checkFrames fails when the filter's frame stack is over its bound.
func checkFrames(t testing.TB, s *pdStripper) {
	t.Helper()
	if n := cap(s.stack) * int(unsafe.Sizeof(stripFrame{})); n > maxFrameBytes {
		t.Fatalf("the filter's frame stack holds %d bytes (%d frames), over %d", n, cap(s.stack), maxFrameBytes)
	}
}

// nesting returns how deep the arrays and objects of a valid JSON body nest.
func nesting(body []byte) int {
	dec := json.NewDecoder(bytes.NewReader(body))
	depth, deepest := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			deepest = max(deepest, depth)
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}

// deepBodies are JSON objects nesting exactly n levels (the top-level object counts), through
// arrays, objects, and the objects the filter descends into (vllm_xargs).
func deepBodies(n int) []string {
	return []string{
		`{"a":` + strings.Repeat(`[`, n-1) + strings.Repeat(`]`, n-1) + `}`,
		strings.Repeat(`{"a":`, n-1) + `{}` + strings.Repeat(`}`, n-1),
		`{"vllm_xargs":{"kv_transfer_params":` + strings.Repeat(`[`, n-2) + strings.Repeat(`]`, n-2) + `,"b":` + strings.Repeat(`{"c":`, n-3) + `1` + strings.Repeat(`}`, n-3) + `}}`,
	}
}

func TestStripPD(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{}`, `{}`},
		{` { } `, ` { } `},
		{`{"a":1}`, `{"a":1}`},
		{`{"kv_transfer_params":{"do_remote_prefill":true}}`, `{}`},
		{`{"kv_transfer_params":1,"a":1}`, `{"a":1}`},
		{`{"a":1,"kv_transfer_params":1}`, `{"a":1}`},
		{`{"a":1, "kv_transfer_params" : [1,{"x":"}"}] ,"b":2}`, `{"a":1,"b":2}`},
		{`{"kv\u005ftransfer_params":{},"bootstrap_room":7,"bootstrap_host":"h","a":"kv_transfer_params"}`, `{"a":"kv_transfer_params"}`},
		{`{"kv_transfer_params":1,"kv_transfer_params":2}`, `{}`},
		{`{"vllm_xargs":{"kv_transfer_params":"x","k":[1]},"n":{"kv_transfer_params":1}}`, `{"vllm_xargs":{"k":[1]},"n":{"kv_transfer_params":1}}`},
		{`{"vllm_xargs":{"kv_transfer_params":"x"}}`, `{"vllm_xargs":{}}`},
		{`{"vllm_xargs":[{"kv_transfer_params":"x"}]}`, `{"vllm_xargs":[{"kv_transfer_params":"x"}]}`},
		{`{"a_very_long_key_that_is_not_a_pd_field":-0.5e+3,"b":true,"c":null,"d":false}`, `{"a_very_long_key_that_is_not_a_pd_field":-0.5e+3,"b":true,"c":null,"d":false}`},
		{`{"é":1,"bootstrap_port":2}`, `{"é":1}`},
	} {
		out, err := stripPD([]byte(c.in))
		if err != nil || string(out) != c.want {
			t.Errorf("stripPD(%s) = %s, %v; want %s", c.in, out, err, c.want)
		}
		checkStrip(t, []byte(c.in))
	}
	for _, bad := range []string{
		``, ` `, `[]`, `1`, `"x"`, `{`, `{"a":1`, `{"a":1}x`, `{"a":1}{}`, `{"a":NaN}`, `{"a":Infinity}`,
		`{"a":-Infinity}`, "\xef\xbb\xbf{}", "{\x00\"\x00}\x00", `{"a":01}`, `{"a":1.}`, `{"a":"\x01"}`,
		`{"a":"\q"}`, `{"a":"\u12G4"}`, `{,"a":1}`, `{"a":1,}`, `{"a" 1}`, `{'a':1}`, `{"a":tru}`,
	} {
		if out, err := stripPD([]byte(bad)); err == nil {
			t.Errorf("stripPD(%q) = %q: want an error", bad, out)
		}
		checkStrip(t, []byte(bad))
	}
	// Nesting: up to llmreq.MaxDepth levels read, one more refused (as llm_prompt does).
	for _, in := range deepBodies(llmreq.MaxDepth) {
		if _, err := stripPD([]byte(in)); err != nil {
			t.Errorf("%d levels (%.40s...): %v", llmreq.MaxDepth, in, err)
		}
		checkStrip(t, []byte(in))
	}
	for _, in := range deepBodies(llmreq.MaxDepth + 1) {
		if _, err := stripPD([]byte(in)); !errors.Is(err, errNotJSONObject) {
			t.Errorf("%d levels (%.40s...): error %v, want errNotJSONObject", llmreq.MaxDepth+1, in, err)
		}
		checkStrip(t, []byte(in))
	}
}

// issueDeepBody is issue 40's body: a chat request whose last member opens n arrays.
func issueDeepBody(n int64) io.Reader {
	return io.MultiReader(strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"x":`), io.LimitReader(repeatReader('['), n))
}

// TestStripPDDeepNestingMemory: a body of 8 MiB of '[' (8 KiB gzip-compressed) made the filter
// hold one frame per bracket, 229 MiB, allocating 1.1 GiB on the way (issue 40). It is refused
// at llmreq.MaxDepth levels, having allocated what any body costs: the read buffer, one read's
// output, a few frames.
func TestStripPDDeepNestingMemory(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := newPDStripper(issueDeepBody(8<<20), nil)
	n, err := io.Copy(io.Discard, s)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, errNotJSONObject) {
		t.Fatalf("8 MiB of '[': %d bytes out, error %v; want errNotJSONObject", n, err)
	}
	checkFrames(t, s)
	// The buffers are 32 KiB each; anything near a byte per bracket is the defect.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Fatalf("the filter allocated %d KiB on 8 MiB of '[', want at most 1024 KiB", alloc>>10)
	}
	if _, err := stripPD(append([]byte(`{"x":`), bytes.Repeat([]byte("["), 1<<20)...)); !errors.Is(err, errNotJSONObject) {
		t.Fatalf("stripPD of 1 MiB of '[': %v, want errNotJSONObject", err)
	}
}

// TestStripPDBoundedMemory: a 64 MiB prompt streams through with a few KiB at a time, behind
// members nesting as deep as the router reads (its frame stack bounded too); a body nesting
// deeper fails with the same few KiB.
func TestStripPDBoundedMemory(t *testing.T) {
	deep := deepBodies(llmreq.MaxDepth)
	members := `"a":` + deep[0][len(`{"a":`):len(deep[0])-1] + `,"b":` + deep[1][len(`{"a":`):len(deep[1])-1]
	body := io.MultiReader(strings.NewReader(`{"kv_transfer_params":{"x":1},`+members+`,"prompt":"`),
		io.LimitReader(repeatReader('a'), 64<<20), strings.NewReader(`","bootstrap_room":1,"max_tokens":3}`))
	s := newPDStripper(body, nil)
	var n int64
	var tail []byte
	buf := make([]byte, 16<<10)
	for {
		k, err := s.Read(buf)
		n += int64(k)
		if k > 0 {
			tail = append(tail, buf[:k]...)
			if len(tail) > 64 {
				tail = tail[len(tail)-64:]
			}
		}
		if cap(s.out) > 64<<10 || cap(s.pend) > 64<<10 {
			t.Fatalf("the filter holds %d + %d bytes", cap(s.out), cap(s.pend))
		}
		checkFrames(t, s)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if want := int64(len(`{`+members+`,"prompt":"`)+64<<20) + int64(len(`","max_tokens":3}`)); n != want || !strings.HasSuffix(string(tail), `aaa","max_tokens":3}`) {
		t.Errorf("%d bytes out ending %q, want %d", n, tail, want)
	}

	s = newPDStripper(issueDeepBody(64<<20), nil)
	for {
		_, err := s.Read(buf)
		if cap(s.out) > 64<<10 || cap(s.pend) > 64<<10 {
			t.Fatalf("the filter holds %d + %d bytes", cap(s.out), cap(s.pend))
		}
		checkFrames(t, s)
		if err != nil {
			if !errors.Is(err, errNotJSONObject) {
				t.Fatalf("64 MiB of '[': error %v, want errNotJSONObject", err)
			}
			break
		}
	}
}

type repeatReader byte

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}

// FuzzStripPD: for any input, the filter and the streamed filter agree; a JSON object comes out
// valid, with exactly the P/D members removed and no byte added or changed; anything else,
// nesting deeper than llmreq.MaxDepth included, is refused; the frame stack stays within its
// bound however deep the input nests.
func FuzzStripPD(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","kv_transfer_params":{"do_remote_prefill":true},"messages":[{"role":"user","content":"x"}]}`,
		`{"vllm_xargs":{"kv_transfer_params":"x","k":[1,2.5e-3]},"bootstrap_room":[1,2],"a":null}`,
		`{"kv\u005ftransfer_params":{}, "bootstrap_host" : "h" , "b":"\"\\\/\b\f\n\r\t\u00e9"}`,
		` {"a":[true,false,{"bootstrap_port":1}],"disagg_prefill_dp_rank":0,"bootstrap_pair_key":"k"} `,
		`{"a":NaN,"kv_transfer_params":1}`,
	} {
		f.Add([]byte(s))
	}
	// Nesting at the bound and past it: refused past llmreq.MaxDepth, with the frame stack
	// bounded whatever the depth (checkStrip).
	for _, n := range []int{llmreq.MaxDepth, llmreq.MaxDepth + 1, 4 * llmreq.MaxDepth} {
		for _, s := range deepBodies(n) {
			f.Add([]byte(s))
		}
	}
	f.Add([]byte(`{"model":"m","x":` + strings.Repeat(`[`, 20000)))
	f.Fuzz(func(t *testing.T, in []byte) {
		checkStrip(t, in)
	})
}

// benchBody is a 1 MiB chat request with client P/D fields.
func benchBody() []byte {
	return []byte(`{"model":"m","kv_transfer_params":{"do_remote_prefill":true},"messages":[{"role":"user","content":"` +
		strings.Repeat(`a long document to prefill, with \"quotes\" and \u00e9scapes. `, 1<<20/64) + `"}],"max_tokens":50}`)
}

// BenchmarkStripPD: the filter over a 1 MiB body, streamed; against Go's own syntax check
// (json.Valid) of the same body, in the same run.
func BenchmarkStripPD(b *testing.B) {
	body := benchBody()
	b.Run("filter", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := io.Copy(io.Discard, newPDStripper(bytes.NewReader(body), nil)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Valid", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if !json.Valid(body) {
				b.Fatal("invalid")
			}
		}
	})
}
