package telemetry

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLlmdSimulatorLive reads llm-d's vLLM simulator (llm-d-inference-sim, the third-party
// engine of the demo) while it runs and queues requests. It needs the binary that
// examples/llmdsim builds (see its doc.go), or KVROUTE_LLMD_BIN; it is skipped without one,
// unless KVROUTE_LLMD_BIN names it (.ci/run does: CI must not skip it).
// With KVROUTE_LLMD_CAPTURE=1 it writes the page it read to testdata/llmd_sim_v0.10.2.txt.
func TestLlmdSimulatorLive(t *testing.T) {
	bin := os.Getenv("KVROUTE_LLMD_BIN")
	if bin != "" {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("KVROUTE_LLMD_BIN: %v", err)
		}
	} else {
		bin = filepath.Join("..", "..", "examples", "llmdsim", "bin", "llm-d-inference-sim")
		if _, err := os.Stat(bin); err != nil {
			t.Skipf("no llm-d-inference-sim binary (%v)", err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	const slots = 2
	// The demo's flags (examples/cmd/demo/llmd.go), with slow decoding so that requests stay
	// running and waiting while the page is read.
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--model", "llama-3.1-8b", "--force-dummy-tokenizer",
		"--enable-kvcache", "--zmq-endpoint", "", "--mode", "random", "--kv-cache-size", strconv.Itoa(llmdBlocks),
		"--block-size", "16", "--max-num-seqs", strconv.Itoa(slots), "--max-model-len", "32768",
		"--inter-token-latency", "100ms")
	cmd.Env = append(os.Environ(), "POD_IP=127.0.0.1")
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the simulator is killed, then the requests it was serving end.
	var wg sync.WaitGroup
	var finished atomic.Bool
	t.Cleanup(wg.Wait)
	t.Cleanup(func() {
		finished.Store(true)
		cmd.Process.Kill()
		cmd.Wait()
	})
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	waitFor(t, "the simulator's /health", func() bool {
		resp, err := http.Get(base + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	const requests = 5
	for i := range requests {
		wg.Go(func() {
			body := fmt.Sprintf(`{"ignore_eos":true,"model":"llama-3.1-8b","max_tokens":40,"messages":[{"role":"user","content":"question %d %s"}]}`,
				i, strings.Repeat("words ", 100))
			resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				if !finished.Load() {
					t.Error(err)
				}
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	var page []byte
	var r Reading
	waitFor(t, fmt.Sprintf("%d running and %d waiting", slots, requests-slots), func() bool {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return false
		}
		page, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return false
		}
		r, err = Parse(bytes.NewReader(page), 0)
		return err == nil && r.Running == slots && r.Waiting == requests-slots
	})
	if r.Engine != EngineVLLM || r.KVCapacityTokens != llmdBlocks*16 || !r.Known.Has(HasKVUsage) || r.Ignored != 0 {
		t.Errorf("reading %+v\n%s", r, log.String())
	}
	if os.Getenv("KVROUTE_LLMD_CAPTURE") == "1" {
		if err := os.WriteFile(filepath.Join("testdata", "llmd_sim_v0.10.2.txt"), page, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The Scraper reads it too, as kvroute would.
	s := newScraper(t, Options{Interval: 20 * time.Millisecond})
	if err := s.Add(Target{Key: "llmd", URL: base + "/metrics"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a scrape", func() bool { snap := s.Snapshot("llmd"); return snap != nil && snap.Outcome == OutcomeOK })
	if got := s.Snapshot("llmd").Reading; got.KVCapacityTokens != llmdBlocks*16 {
		t.Errorf("scraped %+v", got)
	}
}
