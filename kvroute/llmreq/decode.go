package llmreq

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Decode returns the body that the first bytes of a request body (prefix, as ReadBody returns
// them; truncated when the body is longer) stand for under the request's Content-Encoding, for
// Parse. It decodes gzip (x-gzip) and deflate (zlib, as HTTP means it, or raw deflate, as some
// clients send it); "" and identity return prefix as it is. The body to forward is untouched:
// only the routing sees the decoded bytes.
//
// At most max bytes are decoded, into one buffer of the size decoded (counted, never what the
// stream claims): a decompression bomb costs max bytes, the decompressor's state (some 50 KB)
// and the time to decode max bytes twice. truncated is true when the decoded body is longer
// than max or prefix was truncated. A corrupt stream (whose bytes before the fault may already
// be garbage), or another encoding (br, zstd, a list of several), gives nil and an error: the
// request routes without text, and the upstream judges the body.
func Decode(prefix []byte, truncated bool, encoding string, max int64) (decoded []byte, _ bool, err error) {
	encoding = strings.ToLower(strings.TrimSpace(encoding))
	if encoding == "" || encoding == "identity" {
		return prefix, truncated, nil
	}
	max = clamp(max)
	open, err := decoder(prefix, encoding)
	if err != nil {
		return nil, false, err
	}
	// Count first, through io.Discard's small pooled buffer, then decode again into a buffer
	// of that size: growing a buffer by doubling would hold up to 1.5 × max at once.
	zr, err := open()
	if err != nil {
		return nil, false, fmt.Errorf("content-encoding %s: %w", encoding, err)
	}
	n, end := io.CopyN(io.Discard, zr, max+1)
	buf := make([]byte, n)
	if zr, err = open(); err != nil {
		return nil, false, fmt.Errorf("content-encoding %s: %w", encoding, err)
	}
	if _, err := io.ReadFull(zr, buf); err != nil {
		return nil, false, fmt.Errorf("content-encoding %s: second pass: %w", encoding, err)
	}
	switch {
	case n > max:
		return buf[:max], true, nil
	case end == io.EOF:
		return buf, truncated, nil
	case truncated && errors.Is(end, io.ErrUnexpectedEOF):
		return buf, true, nil // the stream is cut where prefix is
	}
	return nil, false, fmt.Errorf("content-encoding %s: after %d bytes: %w", encoding, n, end)
}

// clamp bounds max to [0, 2^62]: a buffer of it, plus the byte that tells truncation, can be
// asked for without overflow (and is never allocated: only what is decoded is).
func clamp(n int64) int64 {
	return min(1<<62, max(0, n))
}

// decoder returns a function that opens a new decoder over prefix.
func decoder(prefix []byte, encoding string) (func() (io.Reader, error), error) {
	switch encoding {
	case "gzip", "x-gzip":
		return func() (io.Reader, error) { return gzip.NewReader(bytes.NewReader(prefix)) }, nil
	case "deflate":
		// A zlib stream starts with a header (method 8, deflate; check bits making it a multiple
		// of 31) that a raw deflate stream seldom has.
		if len(prefix) >= 2 && prefix[0]&0x0f == 8 && (uint(prefix[0])<<8|uint(prefix[1]))%31 == 0 {
			return func() (io.Reader, error) { return zlib.NewReader(bytes.NewReader(prefix)) }, nil
		}
		return func() (io.Reader, error) { return flate.NewReader(bytes.NewReader(prefix)), nil }, nil
	}
	return nil, fmt.Errorf("content-encoding %q: not decoded for routing", encoding)
}
