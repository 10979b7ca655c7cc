package kvroute

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The decision trace through Caddy: with kv_cache_aware's logger at debug level, every
// decision writes one line with Caddy's id of the request (the one header_up sends the
// upstream as X-Request-Id), the chosen upstream and every candidate's load and match as the
// router saw them; never the prompt.
func TestDecisionTrace(t *testing.T) {
	var mu sync.Mutex
	got := map[string]string{} // X-Request-Id -> the upstream that received it
	var addrs []string
	for range 3 {
		var addr string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/chat/completions" {
				http.NotFound(w, r)
				return
			}
			mu.Lock()
			got[r.Header.Get("X-Request-Id")] = addr
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintln(w, `{"choices":[]}`)
		}))
		t.Cleanup(srv.Close)
		addr = strings.TrimPrefix(srv.URL, "http://")
		addrs = append(addrs, addr)
	}
	logPath := filepath.Join(t.TempDir(), "trace.jsonl")
	startCaddy(t, fmt.Sprintf(`{
	admin %s
	http_port %d
	https_port %s
	grace_period 1s
	log kvtrace {
		output file %s
		format json
		level DEBUG
		include http.reverse_proxy.selection_policies.kv_cache_aware
	}
}
localhost:%d {
	@llm llm_prompt
	reverse_proxy @llm %s {
		lb_policy kv_cache_aware
		header_up X-Request-Id {http.request.uuid}
	}
}
`, adminAddr, httpPort, httpsPort, logPath, httpPort, strings.Join(addrs, " ")))
	client := &http.Client{Timeout: 10 * time.Second}
	const secret = "TRACESECRET"
	system := strings.Repeat("You are a careful assistant who "+secret+" answers. ", 40)
	for i := range 6 {
		resp, err := client.Post(baseURL+"/v1/chat/completions", "application/json",
			strings.NewReader(chatBody("m", system, fmt.Sprintf("question %d", i))))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	type cand struct {
		Upstream   string  `json:"upstream"`
		Load       int64   `json:"load"`
		MatchChars int     `json:"match_chars"`
		Predicted  float64 `json:"predicted_ttft_ms"`
	}
	type line struct {
		Msg        string `json:"msg"`
		Path       string `json:"path"`
		Upstream   string `json:"upstream"`
		RequestID  string `json:"request_id"`
		Prompt     int    `json:"prompt_chars"`
		Candidates []cand `json:"candidates"`
	}
	var lines []line
	deadline := time.Now().Add(5 * time.Second)
	for len(lines) < 6 && time.Now().Before(deadline) {
		lines = lines[:0]
		f, err := os.Open(logPath)
		if err == nil {
			sc := bufio.NewScanner(f)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				if strings.Contains(sc.Text(), secret) {
					t.Errorf("the trace holds prompt text: %s", sc.Text())
				}
				var l line
				if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "decision" {
					lines = append(lines, l)
				}
			}
			f.Close()
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(lines) != 6 {
		t.Fatalf("%d decision lines in the trace, want 6", len(lines))
	}
	mu.Lock()
	defer mu.Unlock()
	for k, l := range lines {
		if l.RequestID == "" || got[l.RequestID] != l.Upstream {
			t.Errorf("decision %d: request id %q chose %s; the upstream that received that id: %q", k, l.RequestID, l.Upstream, got[l.RequestID])
		}
		if len(l.Candidates) != 3 || l.Prompt == 0 {
			t.Fatalf("decision %d: %d candidates, prompt of %d chars", k, len(l.Candidates), l.Prompt)
		}
		matched := 0
		for _, c := range l.Candidates {
			if c.MatchChars > 0 {
				matched++
				if c.Upstream != lines[0].Upstream {
					t.Errorf("decision %d: %s matches the system prompt, which went to %s", k, c.Upstream, lines[0].Upstream)
				}
			}
		}
		if k > 0 && matched != 1 {
			t.Errorf("decision %d: %d candidates match the system prompt, want the one it went to first", k, matched)
		}
	}
}
