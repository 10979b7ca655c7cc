package cluster

import (
	"bytes"
	"testing"
)

func TestOwnLog(t *testing.T) {
	var l ownLog
	l.init(1000)
	rec := func(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }
	l.add([]logEntry{{seq: 1, rec: rec('a', 100)}, {seq: 2, rec: rec('b', 100), model: "m", sessionKey: "s"}})
	l.add([]logEntry{{seq: 3, rec: rec('c', 100), model: "m", sessionKey: "s"}, {seq: 3, rec: rec('d', 100), model: "m2", sessionKey: "s"}})
	// The newer binding of (m, s) replaced the older.
	if got := l.since(0); len(got) != 3 || got[1].rec[0] != 'c' {
		t.Fatalf("since(0): %d records", len(got))
	}
	if got := l.since(2); len(got) != 2 {
		t.Errorf("since(2): %d records, want 2", len(got))
	}
	l.forget("s")
	if got := l.since(0); len(got) != 1 || got[0].rec[0] != 'a' {
		t.Errorf("after forget: %d records", len(got))
	}
	// Bytes stay bounded: the oldest go first.
	for i := 0; i < 100; i++ {
		l.add([]logEntry{{seq: uint64(10 + i), rec: rec('x', 300)}})
	}
	if b, _ := l.size(); b > 1000 {
		t.Errorf("log holds %d bytes, bound 1000", b)
	}
	if got := l.since(0); len(got) != 3 || len(l.entries) > 8 {
		t.Errorf("after many adds: %d live, %d slots", len(got), len(l.entries))
	}
	l.reset()
	if got := l.since(0); len(got) != 0 {
		t.Errorf("after reset: %d records", len(got))
	}
}
