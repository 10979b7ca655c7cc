package llmreq

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"
)

func FuzzParse(f *testing.F) {
	for _, tt := range parseTests {
		f.Add([]byte(tt.body), len(tt.body)/2, uint8(None))
	}
	for _, tt := range truncatedTests {
		f.Add([]byte(tt.body), len(tt.body), uint8(None))
	}
	for _, body := range prefixBodies {
		f.Add([]byte(body), len(body)/3, uint8(None))
	}
	for _, tt := range sdkTests {
		body := sdkBody(f, tt.file)
		f.Add(body, len(body)/2, uint8(tt.hint))
	}
	f.Fuzz(func(t *testing.T, body []byte, cut int, h uint8) {
		hint := Format(h % uint8(len(formatNames)))
		full := ParseAs(body, false, hint)
		if full.Truncated || !utf8.ValidString(full.Text) || len(full.Text) > 4*len(body) {
			t.Fatalf("Parse(%q) = %s", body, show(full))
		}
		if full.Format == None && full.Text != "" {
			t.Fatalf("Parse(%q) = %s: text without a format", body, show(full))
		}
		ref, ok := refParseAs(body, hint)
		dups, late := keyOrder(body)
		if ok && !dups && ref != full {
			t.Fatalf("Parse(%q)\n got %s\n ref %s", body, show(full), show(ref))
		}

		if cut < 0 || cut > len(body) {
			cut = len(body) / 2
		}
		part := ParseAs(body[:cut], true, hint)
		if !utf8.ValidString(part.Text) || len(part.Text) > 4*cut {
			t.Fatalf("Parse(%q, true) = %s", body[:cut], show(part))
		}
		if full.Format != None && ok && !dups && !late && part.Format == full.Format {
			if !strings.HasPrefix(full.Text, part.Text) {
				t.Fatalf("Parse(%q, true).Text = %q\nnot a prefix of %q, the text of %q", body[:cut], part.Text, full.Text, body)
			}
			if part.Model != "" && part.Model != full.Model {
				t.Fatalf("Parse(%q, true).Model = %q, want %q or none", body[:cut], part.Model, full.Model)
			}
		}
	})
}

// FuzzString checks string unescaping against encoding/json.
func FuzzString(f *testing.F) {
	for _, s := range []string{`"a\nb"`, `"\ud83d\ude00"`, `"\ud800\u0041"`, `"\udc00"`, "\"\xff\xe4\x41\"", `"é"`, `"\u00e9\/"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, quoted []byte) {
		s := scanner{b: quoted}
		if len(quoted) == 0 || quoted[0] != '"' {
			return
		}
		got := s.str(nil)
		var want string
		if json.Unmarshal(quoted, &want) != nil {
			return
		}
		if s.bad || s.pos != len(bytes.TrimRight(quoted, " \t\r\n")) || string(got) != want {
			t.Fatalf("str(%q) = %q (bad %v, at %d), encoding/json says %q", quoted, got, s.bad, s.pos, want)
		}
	})
}

func FuzzReadBody(f *testing.F) {
	f.Add([]byte(""), int64(0), uint8(0))
	f.Add([]byte("abc"), int64(2), uint8(1))
	f.Add([]byte(strings.Repeat("x", 5000)), int64(4096), uint8(7))
	f.Fuzz(func(t *testing.T, data []byte, limit int64, chunk uint8) {
		src := &source{data: bytes.Clone(data), chunk: int(chunk)}
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Body, r.ContentLength = src, -1
		if chunk%2 == 0 {
			r.ContentLength = int64(len(data))
		}
		prefix, truncated, err := ReadBody(r, limit)
		if err != nil {
			t.Fatal(err)
		}
		want := min(int64(len(data)), max(limit, 0))
		if int64(len(prefix)) != want || truncated != (int64(len(data)) > max(limit, 0)) || !bytes.Equal(prefix, data[:want]) {
			t.Fatalf("ReadBody(%d bytes, max %d) = %d bytes, truncated %v", len(data), limit, len(prefix), truncated)
		}
		got, err := io.ReadAll(r.Body)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("restored %d bytes (%v), want the %d original bytes", len(got), err, len(data))
		}
	})
}
