package llmreq

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
)

// compress encodes data as a Content-Encoding: gzip, deflate (zlib), or raw deflate ("flate").
func compress(t testing.TB, data []byte, encoding string) []byte {
	var buf bytes.Buffer
	var w io.WriteCloser
	switch encoding {
	case "gzip":
		w = gzip.NewWriter(&buf)
	case "deflate":
		w = zlib.NewWriter(&buf)
	case "flate":
		w, _ = flate.NewWriter(&buf, flate.DefaultCompression)
	default:
		t.Fatalf("no encoder for %q", encoding)
	}
	w.Write(data)
	w.Close()
	return buf.Bytes()
}

func TestDecode(t *testing.T) {
	body := chatBody(8<<10, false)
	gz := compress(t, body, "gzip")
	twoMembers := append(compress(t, body[:100], "gzip"), compress(t, body[100:], "gzip")...)
	for _, tt := range []struct {
		name      string
		in        []byte
		truncated bool
		encoding  string
		max       int64
		want      []byte
		wantTrunc bool
		wantErr   bool
	}{
		{"identity", body, false, "", 1 << 20, body, false, false},
		{"identity named", body[:10], true, " Identity", 1 << 20, body[:10], true, false},
		{"gzip", gz, false, "gzip", 1 << 20, body, false, false},
		{"x-gzip", gz, false, "X-GZIP", 1 << 20, body, false, false},
		{"gzip members", twoMembers, false, "gzip", 1 << 20, body, false, false},
		{"deflate (zlib)", compress(t, body, "deflate"), false, "deflate", 1 << 20, body, false, false},
		{"deflate (raw)", compress(t, body, "flate"), false, "deflate", 1 << 20, body, false, false},
		{"decoded longer than max", gz, false, "gzip", 1000, body[:1000], true, false},
		{"decoded exactly max", gz, false, "gzip", int64(len(body)), body, false, false},
		{"max 0", gz, false, "gzip", 0, []byte{}, true, false},
		{"compressed cut", gz[:len(gz)/2], true, "gzip", 1 << 20, nil, true, false},
		{"cut while not truncated", gz[:len(gz)/2], false, "gzip", 1 << 20, nil, false, true},
		{"corrupt", append(bytes.Clone(gz[:len(gz)/2]), bytes.Repeat([]byte{0xff}, 64)...), false, "gzip", 1 << 20, nil, false, true},
		{"bad checksum", append(bytes.Clone(gz[:len(gz)-8]), 1, 2, 3, 4, 5, 6, 7, 8), false, "gzip", 1 << 20, nil, false, true},
		{"not gzip", body, false, "gzip", 1 << 20, nil, false, true},
		{"cut in the header", gz[:5], true, "gzip", 1 << 20, nil, false, true},
		{"brotli", []byte{0x0b, 0x02}, false, "br", 1 << 20, nil, false, true},
		{"several encodings", gz, false, "gzip, gzip", 1 << 20, nil, false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, trunc, err := Decode(tt.in, tt.truncated, tt.encoding, tt.max)
			if (err != nil) != tt.wantErr || trunc != tt.wantTrunc {
				t.Fatalf("Decode: truncated %v, error %v; want truncated %v, error %v", trunc, err, tt.wantTrunc, tt.wantErr)
			}
			if tt.wantErr && got != nil {
				t.Fatalf("Decode: %d bytes with error %v, want none", len(got), err)
			}
			if tt.want != nil && !bytes.Equal(got, tt.want) {
				t.Fatalf("Decode: %d bytes %.40q, want %d bytes %.40q", len(got), got, len(tt.want), tt.want)
			}
			if !bytes.HasPrefix(body, got) {
				t.Fatalf("Decode: %d bytes that are not a prefix of the body", len(got))
			}
			if int64(len(got)) > tt.max {
				t.Fatalf("Decode: %d bytes, more than max %d", len(got), tt.max)
			}
		})
	}
}

// TestDecodeCuts: the text of a gzip body cut anywhere is a prefix of the text of the whole.
func TestDecodeCuts(t *testing.T) {
	body := []byte(prefixBodies[0])
	full := Parse(body, false)
	gz := compress(t, body, "gzip")
	for cut := range len(gz) + 1 {
		dec, trunc, err := Decode(gz[:cut], cut < len(gz), "gzip", 1<<20)
		if err != nil && cut >= 10 { // 10 bytes of gzip header
			t.Fatalf("cut at %d of %d: %v", cut, len(gz), err)
		}
		got := Parse(dec, trunc)
		if !bytes.HasPrefix(body, dec) || len(got.Text) > len(full.Text) || full.Text[:len(got.Text)] != got.Text {
			t.Fatalf("cut at %d of %d: text %q is not a prefix of %q", cut, len(gz), got.Text, full.Text)
		}
	}
}

// bomb is a gzip stream, generated as it is read, that decodes to n MiB of zeros: a header, one
// compressed MiB of zeros (a non-final block ending byte-aligned) n times, an empty final block.
// Its trailer is not valid: no reader gets that far.
func bomb(t testing.TB, n int) io.Reader {
	var block bytes.Buffer
	zw, _ := flate.NewWriter(&block, flate.BestCompression)
	zw.Write(make([]byte, 1<<20))
	zw.Flush()
	parts := []io.Reader{bytes.NewReader([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff})}
	for range n {
		parts = append(parts, bytes.NewReader(block.Bytes()))
	}
	parts = append(parts, bytes.NewReader([]byte{1, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0}))
	return io.MultiReader(parts...)
}

// TestDecodeBomb: 10 GiB of zeros in some 10 MB of gzip cost, beyond what reading a plain body
// of the same length costs, at most max_body and a small constant.
func TestDecodeBomb(t *testing.T) {
	const maxBody = 1 << 20
	allocated := func(f func()) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	request := func(body io.Reader) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		r.Body, r.ContentLength = io.NopCloser(body), -1
		r.Header.Set("Content-Encoding", "gzip")
		return r
	}
	plain := allocated(func() {
		if _, _, err := ReadBody(request(io.LimitReader(zeros{}, 10<<20)), maxBody); err != nil {
			t.Error(err)
		}
	})
	var decoded []byte
	var truncated bool
	r := request(bomb(t, 10<<10)) // built outside the count: it holds 10,240 readers
	bombed := allocated(func() {
		prefix, trunc, err := ReadBody(r, maxBody)
		if err != nil {
			t.Error(err)
		}
		decoded, truncated, err = Decode(prefix, trunc, r.Header.Get("Content-Encoding"), maxBody)
		if err != nil {
			t.Error(err)
		}
	})
	if len(decoded) != maxBody || !truncated || bytes.ContainsFunc(decoded, func(r rune) bool { return r != 0 }) {
		t.Errorf("decoded %d bytes (truncated %v), want %d zeros, truncated", len(decoded), truncated, maxBody)
	}
	const slack = 256 << 10 // the gzip reader's window and tables, twice
	if bombed > plain+maxBody+slack {
		t.Errorf("a 10 GiB bomb allocated %d bytes, a plain body %d: %d more, want at most max_body %d + %d",
			bombed, plain, bombed-plain, maxBody, slack)
	}
	t.Logf("plain body: %d bytes allocated; bomb: %d", plain, bombed)
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(prefixBodies[1]), 50, uint8(0), int64(1<<20))
	f.Add([]byte(prefixBodies[0]), 1000, uint8(1), int64(100))
	f.Add([]byte(prefixBodies[2]), 30, uint8(2), int64(1<<20))
	f.Add([]byte("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"), 9, uint8(3), int64(7))
	encodings := []string{"gzip", "deflate", "flate"}
	f.Fuzz(func(t *testing.T, data []byte, cut int, mode uint8, limit int64) {
		enc := encodings[int(mode/2)%len(encodings)]
		header := enc
		if header == "flate" {
			header = "deflate"
		}
		if mode%2 == 1 {
			// Arbitrary bytes as a compressed stream: no panic, bounded output.
			got, _, _ := Decode(data, cut%2 == 0, header, limit)
			if int64(len(got)) > max(limit, 0) {
				t.Fatalf("Decode of %d arbitrary bytes: %d bytes out, max %d", len(data), len(got), limit)
			}
			return
		}
		z := compress(t, data, enc)
		if cut < 0 || cut > len(z) {
			cut = len(z)
		}
		got, trunc, err := Decode(z[:cut], cut < len(z), header, limit)
		if int64(len(got)) > max(limit, 0) || !bytes.HasPrefix(data, got) {
			t.Fatalf("Decode(%s, cut %d of %d, max %d) = %d bytes, not a bounded prefix of the %d", enc, cut, len(z), limit, len(got), len(data))
		}
		if cut == len(z) && limit >= int64(len(data)) && (err != nil || trunc || !bytes.Equal(got, data)) {
			t.Fatalf("Decode(%s of %d bytes, max %d): %d bytes, truncated %v, %v", enc, len(data), limit, len(got), trunc, err)
		}
	})
}
