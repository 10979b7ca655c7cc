package llmreq

import (
	"bytes"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
)

// source is an original request body: data in chunks of at most chunk bytes, then err (io.EOF
// when nil).
type source struct {
	data   []byte
	chunk  int
	err    error
	closed int
	reads  int
}

func (s *source) Read(p []byte) (int, error) {
	s.reads++
	if len(s.data) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		return 0, io.EOF
	}
	n := min(len(p), len(s.data))
	if s.chunk > 0 {
		n = min(n, s.chunk)
	}
	n = copy(p, s.data[:n])
	s.data = s.data[n:]
	return n, nil
}

func (s *source) Close() error { s.closed++; return nil }

func payload(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), 1))
	for i := range b {
		b[i] = byte(r.UintN(256))
	}
	return b
}

func TestReadBody(t *testing.T) {
	const max = 1000
	for _, tt := range []struct {
		name          string
		size          int
		contentLength int64 // -2: the size
		chunk         int
		wantPrefix    int
		wantTruncated bool
	}{
		{"empty", 0, -2, 0, 0, false},
		{"small", 10, -2, 0, 10, false},
		{"max-1", max - 1, -2, 0, max - 1, false},
		{"max", max, -2, 0, max, false},
		{"max+1", max + 1, -2, 0, max, true},
		{"large", 100 * max, -2, 0, max, true},
		{"chunked small", 10, -1, 3, 10, false},
		{"chunked max", max, -1, 7, max, false},
		{"chunked large", 100 * max, -1, 7, max, true},
		{"one byte reads", 3 * max, -1, 1, max, true},
		{"content length too small", 2 * max, 10, 0, max, true},
		{"content length too large", 10, 1 << 40, 0, 10, false},
		{"content length a little too large", 10, 500, 0, 10, false},
		{"content length one short", 12, 11, 0, 12, false},
		{"content length, reads of 7", 900, -2, 7, 900, false},
		{"content length too small, one byte reads", 2 * max, 10, 1, max, true},
		{"huge unknown", 1 << 20, -1, 0, max, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			data := payload(tt.size)
			src := &source{data: bytes.Clone(data), chunk: tt.chunk}
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			r.Body = src
			r.ContentLength = tt.contentLength
			if tt.contentLength == -2 {
				r.ContentLength = int64(tt.size)
			}
			cl := r.ContentLength

			prefix, truncated, err := ReadBody(r, max)
			if err != nil {
				t.Fatalf("ReadBody: %v", err)
			}
			if len(prefix) != tt.wantPrefix || truncated != tt.wantTruncated {
				t.Fatalf("ReadBody = %d bytes, truncated %v; want %d, %v", len(prefix), truncated, tt.wantPrefix, tt.wantTruncated)
			}
			if !bytes.Equal(prefix, data[:len(prefix)]) {
				t.Fatal("prefix differs from the body's first bytes")
			}
			if r.ContentLength != cl {
				t.Errorf("ContentLength changed from %d to %d", cl, r.ContentLength)
			}
			got, err := io.ReadAll(r.Body)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("restored body: %d bytes, err %v; want the %d original bytes", len(got), err, len(data))
			}
			if n, err := r.Body.Read(make([]byte, 10)); n != 0 || err != io.EOF {
				t.Errorf("read after the end = %d, %v; want 0, EOF", n, err)
			}
			// A body held whole leaves the original to the server; one streamed on closes it,
			// ending a read blocked on a slow client.
			wantClosed := 0
			if len(data) > max {
				wantClosed = 1
			}
			if err := r.Body.Close(); err != nil || src.closed != wantClosed {
				t.Errorf("Close = %v, original closed %d times; want nil, %d", err, src.closed, wantClosed)
			}
			if n, err := r.Body.Read(make([]byte, 10)); n != 0 || err != http.ErrBodyReadAfterClose && len(data) > 0 {
				t.Errorf("read after Close = %d, %v; want 0, %v", n, err, http.ErrBodyReadAfterClose)
			}
		})
	}
}

func TestReadBodyNoBody(t *testing.T) {
	for _, body := range []io.ReadCloser{nil, http.NoBody} {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Body = body
		prefix, truncated, err := ReadBody(r, 100)
		if prefix != nil || truncated || err != nil || r.Body != body {
			t.Errorf("ReadBody(%v) = %q, %v, %v and body %v; want nothing and the body left alone", body, prefix, truncated, err, r.Body)
		}
	}
}

func TestReadBodyZeroMax(t *testing.T) {
	for _, max := range []int64{0, -5} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("abc"))
		prefix, truncated, err := ReadBody(r, max)
		if len(prefix) != 0 || !truncated || err != nil {
			t.Errorf("ReadBody(max %d) = %q, %v, %v; want empty, true, nil", max, prefix, truncated, err)
		}
		if got, _ := io.ReadAll(r.Body); string(got) != "abc" {
			t.Errorf("restored body %q", got)
		}
	}
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("abc"))
	if prefix, truncated, err := ReadBody(r, math.MaxInt64); string(prefix) != "abc" || truncated || err != nil {
		t.Errorf("ReadBody(max MaxInt64) = %q, %v, %v", prefix, truncated, err)
	}
}

func TestReadBodyError(t *testing.T) {
	boom := errors.New("connection reset")
	data := payload(500)
	for _, tt := range []struct {
		name          string
		max, cl       int64
		wantErr       error
		wantTruncated bool
	}{
		{"before max", 1000, -1, boom, true},
		{"before max, length stated", 1000, 500, boom, true},
		{"before max, length stated too short", 1000, 300, boom, true},
		{"after max", 100, -1, nil, true}, // the prefix is whole; the error waits for the proxy
		{"after max, length stated", 100, 500, nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := &source{data: bytes.Clone(data), chunk: 64, err: boom}
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Body, r.ContentLength = src, tt.cl

			prefix, truncated, err := ReadBody(r, tt.max)
			if err != tt.wantErr || truncated != tt.wantTruncated {
				t.Fatalf("ReadBody = %d bytes, %v, %v; want %v, %v", len(prefix), truncated, err, tt.wantTruncated, tt.wantErr)
			}
			if !bytes.Equal(prefix, data[:len(prefix)]) {
				t.Fatal("prefix differs from the body's first bytes")
			}
			var got []byte
			buf := make([]byte, 37)
			for {
				n, err := r.Body.Read(buf)
				got = append(got, buf[:n]...)
				if err != nil {
					if err != boom {
						t.Fatalf("restored body ended with %v after %d bytes, want %v", err, len(got), boom)
					}
					break
				}
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("restored body gave %d bytes before the error, want the %d original bytes", len(got), len(data))
			}
			// The error stays.
			if _, err := r.Body.Read(buf); err != boom {
				t.Errorf("read after the error: %v, want %v", err, boom)
			}
		})
	}
}

func TestReadBodyErrorWithData(t *testing.T) {
	boom := errors.New("boom")
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Body = io.NopCloser(iotest.DataErrReader(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom))))
	prefix, truncated, err := ReadBody(r, 10)
	if string(prefix) != "abc" || !truncated || err != boom {
		t.Fatalf("ReadBody = %q, %v, %v; want abc, true, boom", prefix, truncated, err)
	}
	got, err := io.ReadAll(r.Body)
	if string(got) != "abc" || err != boom {
		t.Errorf("restored body = %q, %v; want abc, boom", got, err)
	}
}

// stuck is a body that returns nothing, forever.
type stuck struct{}

func (stuck) Read([]byte) (int, error) { return 0, nil }
func (stuck) Close() error             { return nil }

func TestReadBodyNoProgress(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Body = stuck{}
	if _, _, err := ReadBody(r, 10); err != io.ErrNoProgress {
		t.Errorf("ReadBody of a stuck body: %v, want %v", err, io.ErrNoProgress)
	}
}

// TestReadBodyTwice reads a restored body again (the matcher, then the policy), before and
// after it is consumed.
func TestReadBodyTwice(t *testing.T) {
	data := payload(3000)
	for _, tt := range []struct {
		first, second int64
		wantTruncated bool
	}{
		{1000, 1000, true}, {1000, 500, true}, {1000, 2000, true}, {5000, 10000, false}, {5000, 3000, false}, {5000, 2999, true},
	} {
		src := &source{data: bytes.Clone(data), chunk: 100}
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Body = src
		if _, _, err := ReadBody(r, tt.first); err != nil {
			t.Fatal(err)
		}
		reads := src.reads
		prefix, truncated, err := ReadBody(r, tt.second)
		want := data[:min(int64(len(data)), tt.second)]
		if err != nil || truncated != tt.wantTruncated || !bytes.Equal(prefix, want) {
			t.Fatalf("ReadBody(%d) then (%d) = %d bytes, %v, %v; want %d bytes, %v", tt.first, tt.second, len(prefix), truncated, err, len(want), tt.wantTruncated)
		}
		if tt.second < tt.first && src.reads != reads {
			t.Errorf("ReadBody(%d) then (%d) read the original again", tt.first, tt.second)
		}
		if got, err := io.ReadAll(r.Body); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("restored body: %d bytes, %v", len(got), err)
		}
	}

	// Once the restored body has been read, it has nothing more to give.
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("abc"))
	ReadBody(r, 10)
	io.ReadAll(r.Body)
	if prefix, truncated, err := ReadBody(r, 10); len(prefix) != 0 || truncated || err != nil {
		t.Errorf("ReadBody of a consumed body = %q, %v, %v; want nothing", prefix, truncated, err)
	}
}

// TestReadBodyServer sends bodies through a real server, chunked and not.
func TestReadBodyServer(t *testing.T) {
	data := payload(200_000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cl := r.ContentLength
		prefix, truncated, err := ReadBody(r, 65536)
		if err != nil || !truncated || !bytes.Equal(prefix, data[:65536]) || r.ContentLength != cl {
			http.Error(w, "bad prefix", http.StatusInternalServerError)
			return
		}
		got, err := io.ReadAll(r.Body)
		if err != nil || !bytes.Equal(got, data) {
			http.Error(w, "bad body", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	for _, body := range []io.Reader{bytes.NewReader(data), io.MultiReader(bytes.NewReader(data))} {
		resp, err := http.Post(srv.URL, "application/json", body)
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("server: %s %s", resp.Status, msg)
		}
	}
}

// A transport that fails to dial closes the request body without reading it; a retry must still
// send the whole body.
func TestReadBodyCloseBeforeReadKeepsBody(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 1000)
	src := &source{data: data, chunk: 512}
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Body = src
	if _, truncated, err := ReadBody(r, 100); err != nil || !truncated {
		t.Fatalf("ReadBody: truncated %v, err %v", truncated, err)
	}
	if err := r.Body.Close(); err != nil || src.closed != 0 {
		t.Fatalf("Close before any read: err %v, original closed %d times; want nil, 0", err, src.closed)
	}
	got, err := io.ReadAll(r.Body)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after an early Close: %d bytes, err %v; want the %d original bytes", len(got), err, len(data))
	}
	if err := r.Body.Close(); err != nil || src.closed != 1 {
		t.Fatalf("Close after reading: err %v, closed %d; want nil, 1", err, src.closed)
	}
}

// readSome reads up to n bytes of body.
func readSome(t *testing.T, body io.Reader, n int) []byte {
	t.Helper()
	got, err := io.ReadAll(io.LimitReader(body, int64(n)))
	if err != nil {
		t.Fatalf("reading %d bytes: %v", n, err)
	}
	return got
}

// TestBodyAttemptWhole is a retry after the first upstream read part of a body held whole and
// answered 500: the next attempt gets every byte, while the first attempt's transport may
// still be reading its own reader in another goroutine.
func TestBodyAttemptWhole(t *testing.T) {
	data := payload(300_000)
	for _, cl := range []int64{int64(len(data)), -1} {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Body, r.ContentLength = &source{data: bytes.Clone(data), chunk: 4096}, cl
		if _, truncated, err := ReadBody(r, 1<<20); truncated || err != nil {
			t.Fatalf("ReadBody: truncated %v, %v", truncated, err)
		}
		b := Held(r)
		if b == nil || !b.Whole() {
			t.Fatalf("Held = %v", b)
		}
		b.Attempt(r)
		first := r.Body
		if got := readSome(t, first, 1024); !bytes.Equal(got, data[:1024]) {
			t.Fatal("first attempt's bytes differ")
		}
		done := make(chan []byte)
		go func() { // the first attempt's transport, still reading
			got, _ := io.ReadAll(first)
			done <- got
		}()
		b.Attempt(r)
		if r.Body == first {
			t.Fatal("the retry got the first attempt's reader")
		}
		got, err := io.ReadAll(r.Body)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("retry: %d bytes, %v; want the %d original bytes", len(got), err, len(data))
		}
		if rest := <-done; !bytes.Equal(rest, data[1024:]) {
			t.Errorf("first reader gave %d more bytes, want %d", len(rest), len(data)-1024)
		}
		first.Close()
		if n, err := first.Read(make([]byte, 8)); n != 0 || err != http.ErrBodyReadAfterClose {
			t.Errorf("first reader after Close: %d, %v", n, err)
		}
		// A third attempt after a full read gets it all again.
		b.Attempt(r)
		if got, err := io.ReadAll(r.Body); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("third attempt: %d bytes, %v", len(got), err)
		}
	}
}

// TestBodyAttemptSpent is a retry after part of a body longer than max went upstream: it
// cannot be sent again, so every read fails; never the rest presented as the whole body.
func TestBodyAttemptSpent(t *testing.T) {
	data := payload(300_000)
	for _, closeFirst := range []bool{true, false} {
		src := &source{data: bytes.Clone(data), chunk: 4096}
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Body, r.ContentLength = src, -1
		if _, truncated, err := ReadBody(r, 100_000); !truncated || err != nil {
			t.Fatalf("ReadBody: truncated %v, %v", truncated, err)
		}
		b := Held(r)
		b.Attempt(r)
		first := r.Body
		readSome(t, first, 1024)
		if closeFirst {
			first.Close() // Caddy's transport, once the upstream answered
			if src.closed != 1 {
				t.Errorf("original closed %d times after a partial read", src.closed)
			}
		}
		b.Attempt(r)
		if r.Body != first {
			t.Fatal("a body that is not held whole was replaced")
		}
		got, err := io.ReadAll(r.Body)
		want := ErrBodySpent
		if closeFirst {
			want = http.ErrBodyReadAfterClose
		}
		if len(got) != 0 || err != want {
			t.Errorf("retry read %d bytes, %v; want 0, %v", len(got), err, want)
		}
		// A body Caddy buffered itself (request_buffers) replaces ours: it is left alone.
		r.Body = io.NopCloser(bytes.NewReader(data))
		b.Attempt(r)
		if got, _ := io.ReadAll(r.Body); !bytes.Equal(got, data) {
			t.Errorf("a body of the caller's own was changed on retry")
		}
	}
}

// TestBodyAttemptAfterFailedDial: the transport closed the first attempt's body without reading
// it, so the next attempt can still send all of it, and the old reader is dead.
func TestBodyAttemptAfterFailedDial(t *testing.T) {
	data := payload(300_000)
	src := &source{data: bytes.Clone(data), chunk: 4096}
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Body, r.ContentLength = src, int64(len(data))
	ReadBody(r, 100_000)
	b := Held(r)
	b.Attempt(r)
	first := r.Body
	first.Close()
	b.Attempt(r)
	if r.Body == first {
		t.Fatal("no fresh reader after a failed dial")
	}
	if n, err := first.Read(make([]byte, 8)); n != 0 || err != ErrBodySpent {
		t.Errorf("old reader: %d, %v; want 0, %v", n, err, ErrBodySpent)
	}
	if got, err := io.ReadAll(r.Body); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("retry after a failed dial: %d bytes, %v", len(got), err)
	}
	if src.closed != 0 {
		t.Errorf("original closed %d times", src.closed)
	}
}

// TestReadBodyMemoryFollowsBytes: a client that declares 4 MiB and sends 12 bytes costs 12
// bytes, not the declared length.
func TestReadBodyMemoryFollowsBytes(t *testing.T) {
	for _, cl := range []int64{4 << 20, 1000, -1} {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Body = io.NopCloser(io.MultiReader(strings.NewReader(`{"model":"m"`), iotest.ErrReader(io.ErrUnexpectedEOF)))
		r.ContentLength = cl
		prefix, _, err := ReadBody(r, 4<<20)
		if err != io.ErrUnexpectedEOF || string(prefix) != `{"model":"m"` {
			t.Fatalf("ReadBody = %q, %v", prefix, err)
		}
		if cap(prefix) != len(prefix) {
			t.Errorf("content-length %d: %d bytes allocated for 12 received", cl, cap(prefix))
		}
	}
	// The buffer kept is the body's size, however it arrived.
	data := payload(1<<20 + 7)
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Body, r.ContentLength = &source{data: bytes.Clone(data), chunk: 1000}, -1
	prefix, _, _ := ReadBody(r, 4<<20)
	if !bytes.Equal(prefix, data) || cap(prefix) != len(data) {
		t.Errorf("1 MiB in 1000-byte reads: %d bytes, capacity %d", len(prefix), cap(prefix))
	}
}

func TestRoutable(t *testing.T) {
	for _, tt := range []struct {
		method, ct string
		header     string // "Name: value"
		cl         int64
		want       bool
	}{
		{"POST", "", "", 10, true},
		{"POST", "application/json", "", -1, true},
		{"POST", "application/json; charset=utf-8", "", 10, true},
		{"POST", "Application/JSON", "", 10, true},
		{"POST", "application/vnd.api+json", "", 10, true},
		{"POST", "application/grpc", "", -1, false},
		{"POST", "application/grpc+json", "", -1, false},
		{"POST", "application/x-ndjson", "", -1, false},
		{"POST", "text/event-stream", "", -1, false},
		{"POST", "application/octet-stream", "", 10, false},
		{"POST", "multipart/form-data; boundary=x", "", 10, false},
		{"POST", "application/x-www-form-urlencoded", "", 10, true}, // what curl -d sends
		{"POST", "multipart/form-data; boundary=x", "", 10, false},
		{"POST", "garbage;;;", "", 10, false},
		{"POST", "application/json", "Incremental: ?1", -1, false},
		{"POST", "application/json", "Incremental: ?0", -1, true},
		{"POST", "", "Upgrade: websocket", -1, false},
		{"CONNECT", "", "", -1, false},
		{"POST", "application/json", "", 0, false},
	} {
		r := httptest.NewRequest(tt.method, "/", strings.NewReader("{}"))
		r.ContentLength = tt.cl
		if tt.ct != "" {
			r.Header.Set("Content-Type", tt.ct)
		}
		if name, value, ok := strings.Cut(tt.header, ": "); ok {
			r.Header.Set(name, value)
		}
		if got := Routable(r); got != tt.want {
			t.Errorf("Routable(%s %q %q length %d) = %v", tt.method, tt.ct, tt.header, tt.cl, got)
		}
	}
	r := httptest.NewRequest("POST", "/", nil)
	r.Body = http.NoBody
	if Routable(r) {
		t.Error("Routable(NoBody)")
	}
	// It runs on every request: no allocation.
	r = httptest.NewRequest("POST", "/", strings.NewReader("{}"))
	r.Header.Set("Content-Type", "application/json; charset=utf-8")
	if n := testing.AllocsPerRun(100, func() { Routable(r) }); n != 0 {
		t.Errorf("Routable allocates %v times", n)
	}
}

// TestReadBodyInto: the Body given is the one Held returns, and the body reads back whole;
// a body read already keeps its Body.
func TestReadBodyInto(t *testing.T) {
	data := payload(3000)
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Body, r.ContentLength = &source{data: bytes.Clone(data), chunk: 100}, int64(len(data))
	var into Body
	prefix, truncated, err := ReadBodyInto(r, 1000, &into)
	if err != nil || !truncated || !bytes.Equal(prefix, data[:1000]) {
		t.Fatalf("ReadBodyInto = %d bytes, %v, %v; want the first 1000, true, nil", len(prefix), truncated, err)
	}
	if Held(r) != &into {
		t.Fatal("Held is not the Body given")
	}
	var other Body
	if _, _, err := ReadBodyInto(r, 1000, &other); err != nil || Held(r) != &into {
		t.Fatalf("read again: %v, Held changed: %v", err, Held(r) != &into)
	}
	if got, err := io.ReadAll(r.Body); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("restored body: %d bytes, %v; want the %d original bytes", len(got), err, len(data))
	}
}
