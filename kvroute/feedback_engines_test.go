package kvroute

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
)

// TestFeedbackLLMSim: with the repo's simulated engine (a vLLM-like prefix cache that reports
// cached tokens), predicted and reported cached tokens agree while the tree is right; after the
// engine lost its cache (a restart telemetry did not see, another router's traffic), the next
// answer corrects the tree, and GET /kvroute/ says the engine reports usage and cached tokens.
func TestFeedbackLLMSim(t *testing.T) {
	leakCheck(t)
	sim := llmsim.New(llmsim.Config{Name: "sim1", StepFixed: -1, PrefillPerToken: -1, PerSeq: -1, MinEventInterval: -1})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	startCaddy(t, feedbackConfig(addr, ""))
	client := &http.Client{Timeout: 20 * time.Second}
	sys := strings.Repeat("You are a helpful assistant for a travel agency in Lyon. ", 40)
	conv := func(i int) string {
		return chatBody("llama-3.1-8b", sys, fmt.Sprintf("conversation %d: %s", i, strings.Repeat("what else? ", 10)))
	}
	fb := upstreamFeedback
	for i := 1; i <= 3; i++ {
		if resp, body := ask(t, client, "/v1/chat/completions", conv(i), ""); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	waitUntil(t, 5*time.Second, func() bool { return fb(addr) != nil && fb(addr).credited.Load() == 3 }, "three answers credited")
	pred, rep := fb(addr).predicted.load(), fb(addr).reported.load()
	if rep == 0 || pred == 0 || pred > 1.3*rep || rep > 1.3*pred {
		t.Fatalf("predicted %.0f cached tokens, the engine reported %.0f: want both well above 0 and within 30%%", pred, rep)
	}
	if fb(addr).misses() != 0 {
		t.Fatalf("%d misses while the tree was right", fb(addr).misses())
	}
	t.Logf("three conversations sharing a system prompt: predicted %.0f cached tokens, the engine reported %.0f", pred, rep)

	sim.Reset()
	ask(t, client, "/v1/chat/completions", conv(4), "")
	waitUntil(t, 5*time.Second, func() bool { return fb(addr).misses() == 1 }, "the miss after the engine lost its cache")
	if fb(addr).trimmed.Load() == 0 {
		t.Fatal("the tree was not corrected")
	}
	st := getStatus(t).Upstreams[addr].Feedback
	if st == nil || !st.ReportsUsage || !st.ReportsCached || st.Answers != 4 || st.Misses != 1 {
		t.Fatalf("GET /kvroute/ shows %+v; want 4 answers that report usage and cached tokens, 1 miss", st)
	}
}

// TestFeedbackLlmdSimulator: llm-d's vLLM simulator (a third-party engine) through
// llm_feedback: its chat answers report cached tokens (prompt_tokens_details), its Responses
// answers usage without them. Skipped without the simulator binary, unless KVROUTE_LLMD_BIN
// names it (.ci/run does).
func TestFeedbackLlmdSimulator(t *testing.T) {
	addr := llmdSim(t, "--enable-kvcache", "--zmq-endpoint", "", "--kv-cache-size", "4096", "--block-size", "16")
	startCaddy(t, feedbackConfig(addr, ""))
	client := &http.Client{Timeout: 20 * time.Second}
	sys := strings.Repeat("You are a helpful assistant. ", 60)
	for i := 1; i <= 2; i++ {
		if resp, body := ask(t, client, "/v1/chat/completions", chatBody("llama-3.1-8b", sys, fmt.Sprintf("hi %d", i)), ""); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	fb := upstreamFeedback(addr)
	waitUntil(t, 5*time.Second, func() bool { return fb != nil && fb.credited.Load() == 2 }, "two chat answers credited")
	if fb.reported.load() == 0 || fb.predicted.load() == 0 {
		t.Fatalf("predicted %.0f, reported %.0f cached tokens: want both above 0", fb.predicted.load(), fb.reported.load())
	}
	t.Logf("llm-d simulator, two chats sharing a system prompt: predicted %.0f cached tokens, reported %.0f", fb.predicted.load(), fb.reported.load())
	// Its tokenizer counts about 4.7 chars per token here, not 4: read as tokens at 4, the
	// prefix the engine did hold would look like a miss and be trimmed.
	if fb.misses() != 0 {
		t.Fatalf("%d misses on an engine that held what the tree predicted", fb.misses())
	}
	ask(t, client, "/v1/responses", `{"model":"llama-3.1-8b","max_output_tokens":3,"input":"`+sys+`"}`, "")
	waitUntil(t, 5*time.Second, func() bool { return fb.credited.Load() == 3 }, "the Responses answer credited")
	if fb.withCached.Load() != 2 {
		t.Fatalf("the simulator's Responses usage has no cached tokens, yet %d answers counted them", fb.withCached.Load())
	}
}

// llmdSim starts llm-d's vLLM simulator on a free loopback port with the model llama-3.1-8b,
// its dummy tokenizer, random answers and args, waits for its /health and returns its address;
// it skips the test without the binary (examples/llmdsim/bin, or KVROUTE_LLMD_BIN: .ci/run
// sets it). The simulator's log is shown when the test fails.
func llmdSim(t *testing.T, args ...string) string {
	t.Helper()
	bin := os.Getenv("KVROUTE_LLMD_BIN")
	if bin == "" {
		bin = filepath.Join("..", "examples", "llmdsim", "bin", "llm-d-inference-sim")
		if _, err := os.Stat(bin); err != nil {
			t.Skipf("no llm-d-inference-sim binary (%v)", err)
		}
	}
	leakCheck(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--model", "llama-3.1-8b",
		"--force-dummy-tokenizer", "--mode", "random", "--max-model-len", "32768"}, args...)...)
	cmd.Env = append(os.Environ(), "POD_IP=127.0.0.1")
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("simulator's log:\n%s", log.String())
		}
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	waitUntil(t, 20*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "the simulator's /health")
	return addr
}
