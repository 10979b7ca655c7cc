package llmreq

import (
	"errors"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
)

// ErrBodySpent is the error a Body's reader returns once another attempt has been given the
// request: the body was longer than what ReadBody held and part of it already went to an
// earlier upstream, so it cannot be sent again whole (Caddy's request_buffers can).
var ErrBodySpent = errors.New("request body partly sent to an earlier upstream and not held whole: it cannot be sent again")

// Routable reports whether r's body may be read for routing: ReadBody waits for up to max_body
// bytes or the end of the body, which is right for an LLM request (a JSON document the client
// sends at once) and wrong for a body that streams. The rule:
//
//   - a body of known length 0, nil or http.NoBody: no (nothing to read);
//   - CONNECT, or an Upgrade header (websockets, h2c): no, the body is a stream;
//   - the Incremental header set to ?1 (draft-ietf-httpbis-incremental, which Caddy's
//     reverse_proxy honours by forwarding the body as it arrives): no;
//   - a Content-Type other than application/json or a +json type (gRPC, application/grpc+json
//     included, multipart form data, NDJSON, SSE, octet streams): no. The servers behind kvroute
//     (vLLM's and SGLang's FastAPI) only parse JSON bodies as requests;
//   - otherwise, JSON, no Content-Type at all (as some SDKs send), or
//     application/x-www-form-urlencoded, which `curl -d` sends with a JSON body unless told
//     otherwise (a form is sent whole, never streamed): yes.
//
// A JSON body that arrives slowly is still read (bounded by max_body and the server's read
// timeouts): its length alone tells nothing, since clients stream bodies of known length too.
func Routable(r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return false
	}
	if r.Method == http.MethodConnect || r.Header.Get("Upgrade") != "" {
		return false
	}
	if strings.TrimSpace(r.Header.Get("Incremental")) == "?1" {
		return false
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return true
	}
	// The media type without parameters, as mime.ParseMediaType gives it, without the map of
	// parameters it allocates on every request.
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	if strings.HasPrefix(mt, "application/grpc") {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json") || mt == "application/x-www-form-urlencoded"
}

// chunkSize is the size of the pooled chunks ReadBody reads into: it holds the bytes as they
// arrive, one chunk at a time, and copies them into one buffer of their exact size at the end.
// Memory follows the bytes received (a body that declares 4 MiB and sends 12 bytes holds one
// chunk while it waits), and the buffer kept for the request's life is never larger than the
// body.
const chunkSize = 16 << 10

type chunk = [chunkSize]byte

var chunks = sync.Pool{New: func() any { return new(chunk) }}

// ReadBody reads at most max bytes of r.Body for routing and replaces r.Body with a reader that
// yields exactly the original bytes: the read prefix, then the unread rest streamed from the
// original body. It returns the prefix and whether the body is longer than max (to know, it
// reads one byte more than max, which the new body replays too).
//
// A nil or http.NoBody body is left alone and gives (nil, false, nil). When the body fails
// while being read, ReadBody returns the bytes before the failure, true and the error, and the
// new body yields those bytes and then the same error. r.ContentLength is never changed.
// Memory follows the bytes that arrive, whatever the body declares (see chunkSize).
//
// The prefix is shared with the new body and must not be modified. Calling ReadBody again on
// the new body before it is read reuses what is buffered instead of copying it. Held returns
// what was read, for Body.Attempt.
func ReadBody(r *http.Request, max int64) (prefix []byte, truncated bool, err error) {
	return ReadBodyInto(r, max, nil)
}

// ReadBodyInto is ReadBody with the Body's storage given: into, when not nil, is a zero Body
// that becomes the one Held returns (a caller allocates it with what it keeps of the request;
// it must not be copied). When ReadBody already read r.Body, into is left alone.
func ReadBodyInto(r *http.Request, max int64, into *Body) (prefix []byte, truncated bool, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, false, nil
	}
	if max < 0 {
		max = 0
	}
	if rd, ok := r.Body.(*bodyReader); ok {
		if prefix, truncated, ok := rd.reuse(max); ok {
			return prefix, truncated, rd.b.err
		}
	}
	if into == nil {
		into = new(Body)
	}
	b := read(r.Body, max, r.ContentLength, into)
	b.first.b = b
	r.Body = &b.first
	prefix, truncated = b.prefix(max)
	return prefix, truncated, b.err
}

// read reads up to max+1 bytes of body into b and returns b. declared is the body's length as
// the request states it (-1: unknown).
func read(body io.ReadCloser, max, declared int64, b *Body) *Body {
	limit := int64(math.MaxInt64) // max+1 bytes tell whether the body is longer than max
	if max < limit {
		limit = max + 1
	}
	var stack [8]*chunk
	full := stack[:0] // filled chunks, in order
	cur, used := chunks.Get().(*chunk), 0
	var total int64
	var err error
	if 0 < declared && declared < limit && declared < chunkSize {
		// A body that states a length below a chunk's is read straight into a buffer of that
		// length (no more memory than a chunk while it waits, and no copy out of one); one
		// that turns out longer goes on in chunks.
		buf, e, more := readDeclared(body, int(declared))
		if !more {
			chunks.Put(cur)
			b.buf, b.rest, b.whole = buf, body, e == io.EOF
			if e != io.EOF {
				b.err = e
			}
			return b
		}
		used = copy(cur[:], buf)
		total = int64(used)
		err = e
	}
	for empty := 0; err == nil && total < limit; {
		if used == chunkSize {
			full = append(full, cur)
			cur, used = chunks.Get().(*chunk), 0
		}
		n, e := body.Read(cur[used:min(chunkSize, limit-total+int64(used))])
		used += n
		total += int64(n)
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
	var buf []byte
	if total > 0 {
		buf = make([]byte, 0, total)
	}
	for _, c := range full {
		buf = append(buf, c[:]...)
		chunks.Put(c)
	}
	buf = append(buf, cur[:used]...)
	chunks.Put(cur)
	b.buf, b.rest, b.whole = buf, body, err == io.EOF
	if err != io.EOF {
		b.err = err
	}
	return b
}

// readDeclared reads a body that states its length, n bytes, into a buffer of that length. It
// returns what it read and how reading ended: io.EOF at the body's end, another error when the
// body failed; more when the body holds more than n bytes (buf then holds n+1 of them, and
// read goes on in chunks unless the error ended it). A body that ends early gets a buffer of
// its length.
func readDeclared(body io.Reader, n int) (buf []byte, err error, more bool) {
	buf = make([]byte, n, n+1)
	buf0 := buf
	got := 0
	for empty := 0; ; {
		var k int
		if got < n {
			k, err = body.Read(buf[got:n])
		} else {
			// As long as stated: one byte more, or the end, tells whether it is longer.
			k, err = body.Read(buf[n : n+1])
		}
		got += k
		if got > n {
			return buf[:got], err, true
		}
		if err != nil {
			break
		}
		if k > 0 {
			empty = 0
		} else if empty++; empty >= 100 {
			err = io.ErrNoProgress
			break
		}
	}
	if got < n {
		buf = make([]byte, got) // never held larger than the body
		copy(buf, buf0[:got])
	}
	return buf[:got:got], err, false
}

// Body is what ReadBody read of a request body: its first bytes and, when it stopped before
// the end, the original body to stream the rest from. Safe for concurrent use: Caddy's
// transport may still read an earlier attempt's body while the next attempt is being placed.
type Body struct {
	buf   []byte        // read only; dropped once a reader streamed past it (not whole)
	rest  io.ReadCloser // the original body
	whole bool          // buf is the whole body: every attempt can get all of it
	err   error         // how the original body failed while being read, if it did

	first bodyReader // the reader ReadBody installs, allocated with the Body

	mu       sync.Mutex
	live     *bodyReader // not whole: the only reader that may read; nil once spent
	handed   bool        // not whole: bytes went to an attempt
	attempts int         // calls of Attempt
}

// Held returns the Body behind r.Body when ReadBody installed it, else nil.
func Held(r *http.Request) *Body {
	if rd, ok := r.Body.(*bodyReader); ok {
		return rd.b
	}
	return nil
}

// Whole reports whether the Body holds every byte of the request body.
func (b *Body) Whole() bool { return b.whole }

// Prefix returns what ReadBody returned for max, as long as the bytes are held (a body longer
// than what is held drops them once they have been sent on).
func (b *Body) Prefix(max int64) (prefix []byte, truncated bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.prefix(max)
}

func (b *Body) prefix(max int64) ([]byte, bool) {
	if int64(len(b.buf)) > max {
		return b.buf[:max], true
	}
	return b.buf, !b.whole
}

// Attempt prepares r for one attempt of sending the request upstream; a reverse proxy calls it
// each time it picks an upstream for r (the first time too), r being the request that attempt
// sends. When the Body is whole, r gets a fresh reader of all of it, whatever earlier attempts
// read. Otherwise only one stream of the original exists: a later attempt gets a fresh reader
// if no byte went to an earlier one (a failed dial); if bytes did, every reader of the Body
// fails from then on with ErrBodySpent, and r.Body is left alone, so that a body Caddy
// buffered itself (request_buffers) is still sent whole and any other fails the attempt
// (Caddy answers 502), as Caddy's own unbuffered bodies do. Never a body with its start cut
// off presented as complete.
func (b *Body) Attempt(r *http.Request) {
	if b.whole {
		if rd, ok := r.Body.(*bodyReader); !ok || rd.b != b || !rd.unread() {
			r.Body = &bodyReader{b: b}
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.attempts++
	if b.attempts == 1 {
		if b.live == nil {
			b.live = &b.first
		}
		return
	}
	if b.handed {
		b.live = nil
		return
	}
	rd := &bodyReader{b: b}
	b.live = rd
	r.Body = rd
}

// bodyReader yields a Body's bytes: what is held, then (not whole) the rest of the original.
type bodyReader struct {
	b      *Body
	off    int  // guarded by b.mu
	n      int  // bytes read; guarded by b.mu
	closed bool // guarded by b.mu
}

// reuse returns the Body's prefix for max when rd has not been read and holds enough.
func (rd *bodyReader) reuse(max int64) (prefix []byte, truncated, ok bool) {
	b := rd.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if rd.n != 0 || rd.closed || !(b.whole || int64(len(b.buf)) > max || b.err != nil) {
		return nil, false, false
	}
	prefix, truncated = b.prefix(max)
	return prefix, truncated, true
}

func (rd *bodyReader) unread() bool {
	rd.b.mu.Lock()
	defer rd.b.mu.Unlock()
	return rd.n == 0 && !rd.closed
}

func (rd *bodyReader) Read(p []byte) (int, error) {
	b := rd.b
	b.mu.Lock()
	switch {
	case rd.closed:
		b.mu.Unlock()
		return 0, http.ErrBodyReadAfterClose
	case !b.whole && b.live != rd && (b.live != nil || b.attempts > 0):
		b.mu.Unlock()
		return 0, ErrBodySpent
	}
	if !b.whole && b.live == nil {
		b.live = rd // read outside any reverse proxy attempt (the matcher's handler chain)
	}
	if rd.off < len(b.buf) {
		n := copy(p, b.buf[rd.off:])
		rd.off += n
		rd.n += n
		if !b.whole {
			b.handed = true
			if rd.off == len(b.buf) {
				b.buf = nil // the request may stream on for long: nothing can resend it
				rd.off = 0
			}
		}
		b.mu.Unlock()
		return n, nil
	}
	if b.whole {
		b.mu.Unlock()
		return 0, io.EOF
	}
	if b.err != nil {
		b.mu.Unlock()
		return 0, b.err
	}
	b.handed = true
	b.mu.Unlock()
	n, err := b.rest.Read(p)
	b.mu.Lock()
	rd.n += n
	b.mu.Unlock()
	return n, err
}

// Close makes later reads fail once any byte has been read, as Caddy does for an unbuffered
// body, so that a retry never sends the rest as if it were the whole body; a body longer than
// what is held also closes the original then, which ends a read blocked on a slow client.
// Before any read it does nothing: Go's transport closes a request's body when it fails to
// dial, and the retry must still have the whole body to send. The server closes the original
// body itself when the handler returns.
func (rd *bodyReader) Close() error {
	b := rd.b
	b.mu.Lock()
	if rd.n == 0 || rd.closed {
		b.mu.Unlock()
		return nil
	}
	rd.closed = true
	whole := b.whole
	b.mu.Unlock()
	if whole {
		return nil
	}
	return b.rest.Close()
}

// Hold makes buf the body of r and returns it held whole: r.Body yields it, and every Attempt
// gives a fresh reader of all of it. A handler that rewrites a request before the proxy (the
// decode leg of a disaggregated request) hands its body over this way, so that every retry
// resends the rewritten body. buf must not be modified afterwards.
func Hold(r *http.Request, buf []byte) *Body {
	b := &Body{buf: buf, whole: true}
	b.first.b = b
	r.Body = &b.first
	r.ContentLength = int64(len(buf))
	return b
}

// Stream makes rc the body of r, to be streamed once, and returns it as a Body not held: r.Body
// yields rc's bytes; Attempt gives them to the first attempt, and to a later one only if no
// byte went to an earlier one (a failed dial); Close before any read leaves rc open for that
// retry. A handler that rewrites a body as it streams (llm_disaggregate's filter of a body it
// does not hold) hands it over this way. r's length becomes unknown.
func Stream(r *http.Request, rc io.ReadCloser) *Body {
	b := &Body{rest: rc}
	b.first.b = b
	r.Body = &b.first
	r.ContentLength = -1
	return b
}
