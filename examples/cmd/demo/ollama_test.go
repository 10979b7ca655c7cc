package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestCapTokens: the Ollama fleet's client caps answers with a last max_tokens, which wins over
// the workload's.
func TestCapTokens(t *testing.T) {
	var got []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
	}))
	defer srv.Close()
	client := (&ollamaFleet{}).Client(1)
	resp, err := client.Post(srv.URL, "application/json", strings.NewReader(`{"model":"m","max_tokens":200,"messages":[]}`+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var req struct {
		MaxTokens int `json:"max_tokens"`
	}
	if err := json.Unmarshal(got, &req); err != nil || req.MaxTokens != ollamaMaxTokens {
		t.Fatalf("the engine got %s: max_tokens %d (%v), want %d", got, req.MaxTokens, err, ollamaMaxTokens)
	}
}
