package ollamafleet

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// start starts n instances, or skips without KVROUTE_OLLAMA_BIN (.ci/run sets it).
func start(t *testing.T, n int, cfg Config) *Fleet {
	t.Helper()
	bin, model, ok := Binary()
	if !ok {
		t.Skip("KVROUTE_OLLAMA_BIN not set (.ci/run builds Ollama from examples/ollama and sets it)")
	}
	cfg.Bin, cfg.Model = bin, model
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f, err := Start(ctx, cfg, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i := range f.Addrs {
				if b, err := readTail(f.Log(i), 4<<10); err == nil {
					t.Logf("w%d log (end):\n%s", i, b)
				}
			}
		}
		f.Close()
	})
	return f
}

func postT(t *testing.T, url, body string) (*http.Response, []byte, time.Duration) {
	t.Helper()
	t0 := time.Now()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s: %s", url, resp.Status, b)
	}
	return resp, b, time.Since(t0)
}

// TestTinyModelServes: an instance serves the tiny model on Ollama's API and its OpenAI one,
// lists it, has no /metrics, and answers a repeated long prompt faster than the first time
// (its prefix cache).
func TestTinyModelServes(t *testing.T) {
	f := start(t, 1, Config{})
	base := "http://" + f.Addrs[0]
	long := strings.Repeat("the quick brown fox jumps over the lazy dog and runs away ", 100)
	chat := `{"model":"tiny","messages":[{"role":"user","content":"` + long + `"}],"options":{"num_predict":4}}`
	resp, b, cold := postT(t, base+"/api/chat", chat)
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("/api/chat streams as %q", ct)
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	last := lines[len(lines)-1]
	for _, k := range []string{`"done":true`, `"prompt_eval_count":`, `"prompt_eval_duration":`} {
		if !bytes.Contains(last, []byte(k)) {
			t.Errorf("the last line lacks %s: %s", k, last)
		}
	}
	t.Logf("/api/chat stream, %d lines:\n%s", len(lines), b)
	_, b, warm := postT(t, base+"/api/chat", strings.Replace(chat, `{"model"`, `{"stream":false,"model"`, 1))
	t.Logf("/api/chat whole: %s", b)
	t.Logf("the same prompt: %v cold, %v again", cold, warm)
	if warm > cold*7/10 {
		t.Errorf("a repeated prompt took %v, the first %v: no prefix cache?", warm, cold)
	}
	_, b, _ = postT(t, base+"/api/generate", `{"model":"tiny","system":"S","prompt":"hello","options":{"num_predict":3}}`)
	t.Logf("/api/generate stream:\n%s", b)
	resp, b, _ = postT(t, base+"/v1/chat/completions", `{"model":"tiny","max_tokens":3,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	t.Logf("/v1/chat/completions stream (%s):\n%s", resp.Header.Get("Content-Type"), b)
	for _, path := range []string{"/v1/models", "/api/tags", "/metrics"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("GET %s: %s %s", path, resp.Status, b)
		if want := path != "/metrics"; (resp.StatusCode == http.StatusOK) != want {
			t.Errorf("GET %s: %s", path, resp.Status)
		}
	}
}
