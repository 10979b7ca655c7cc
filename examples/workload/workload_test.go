package workload

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The shipped trace is the Mooncake release's, whole: 3,993 requests, the first as the file
// has it; KVROUTE_WORKLOADS names another copy, plain or gzip-compressed, and a directory
// without it is an error naming the file, never the shipped copy instead.
func TestMooncakeShippedAndOverride(t *testing.T) {
	t.Setenv("KVROUTE_WORKLOADS", "")
	os.Unsetenv("KVROUTE_WORKLOADS")
	t.Chdir(t.TempDir())
	reqs, err := Mooncake()
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3993 || reqs[0].InputLength != 40160 || reqs[0].OutputLength != 6 || len(reqs[0].HashIDs) != 79 {
		t.Fatalf("shipped trace: %d requests, the first %+v", len(reqs), reqs[0])
	}
	if !strings.Contains(MooncakeSource(), "shipped") {
		t.Errorf("source %q", MooncakeSource())
	}

	dir := t.TempDir()
	t.Setenv("KVROUTE_WORKLOADS", dir)
	if _, err := Mooncake(); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, TraceFile)) {
		t.Fatalf("a directory without the trace: %v, want an error naming %s", err, filepath.Join(dir, TraceFile))
	}
	line := `{"timestamp": 5, "input_length": 600, "output_length": 2, "hash_ids": [7, 8]}` + "\n"
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(line + line))
	zw.Close()
	for _, body := range [][]byte{[]byte(line), gz.Bytes()} {
		if err := os.WriteFile(filepath.Join(dir, TraceFile), body, 0o644); err != nil {
			t.Fatal(err)
		}
		reqs, err := Mooncake()
		if err != nil || len(reqs) == 0 || reqs[0].InputLength != 600 || MooncakeSource() != filepath.Join(dir, TraceFile) {
			t.Fatalf("override: %v, %+v, source %q", err, reqs, MooncakeSource())
		}
	}
}
