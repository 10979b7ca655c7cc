package llmreq

import (
	"io"
	"math"
	"net/http"
)

// firstRead is the buffer ReadBody starts with when the body's length is unknown.
const firstRead = 16 << 10

// ReadBody reads at most max bytes of r.Body for routing and replaces r.Body with a reader that
// yields exactly the original bytes: the read prefix, then the unread rest streamed from the
// original body, which its Close closes. It returns the prefix and whether the body is longer
// than max (to know, it reads one byte more than max, which the new body replays too).
//
// A nil or http.NoBody body is left alone and gives (nil, false, nil). When the body fails
// while being read, ReadBody returns the bytes before the failure, true and the error, and the
// new body yields those bytes and then the same error. r.ContentLength is never changed.
//
// The prefix is shared with the new body and must not be modified. Calling ReadBody again on
// the new body before it is read reuses what is buffered instead of copying it.
func ReadBody(r *http.Request, max int64) (prefix []byte, truncated bool, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, false, nil
	}
	if max < 0 {
		max = 0
	}
	limit := int64(math.MaxInt64) // max+1 bytes tell whether the body is longer than max
	if max < limit {
		limit = max + 1
	}
	if rb, ok := r.Body.(*replay); ok && rb.off == 0 {
		switch {
		case int64(len(rb.buf)) > max:
			return rb.buf[:max], true, nil
		case rb.err == io.EOF:
			return rb.buf, false, nil
		case rb.err != nil:
			return rb.buf, true, rb.err
		}
	}

	size := int64(firstRead)
	if r.ContentLength >= 0 && r.ContentLength < math.MaxInt64 {
		size = r.ContentLength + 1
	}
	if size > limit {
		size = limit
	}
	buf := make([]byte, 0, size)
	for empty := 0; int64(len(buf)) < limit; {
		if len(buf) == cap(buf) {
			size = 2*int64(cap(buf)) + firstRead
			if size > limit {
				size = limit
			}
			grown := make([]byte, len(buf), size)
			copy(grown, buf)
			buf = grown
		}
		n, e := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if e != nil {
			err = e
			break
		}
		if n > 0 {
			empty = 0
		} else if empty++; empty >= 100 {
			err = io.ErrNoProgress
			break
		}
	}
	r.Body = &replay{buf: buf, rest: r.Body, err: err}
	switch {
	case int64(len(buf)) > max:
		return buf[:max], true, nil
	case err == nil || err == io.EOF:
		return buf, false, nil
	}
	return buf, true, err
}

// replay is a request body restored by ReadBody.
type replay struct {
	buf  []byte
	off  int
	rest io.ReadCloser // the original body
	err  error         // how the original body ended while being buffered, if it did
}

func (b *replay) Read(p []byte) (int, error) {
	if b.off < len(b.buf) {
		n := copy(p, b.buf[b.off:])
		b.off += n
		if b.off == len(b.buf) {
			b.buf = nil // the request may stream on for long; the caller holds its prefix
		}
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	return b.rest.Read(p)
}

// Close closes the original body once any of the replay has been read. Before that it does
// nothing: Go's transport closes a request's body when it fails to dial, and a reverse proxy
// that retries on another upstream must still have the whole body to send (the server closes
// the original body itself when the handler returns).
func (b *replay) Close() error {
	if b.off == 0 && len(b.buf) > 0 {
		return nil
	}
	return b.rest.Close()
}
