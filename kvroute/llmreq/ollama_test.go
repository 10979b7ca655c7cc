package llmreq

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestOllamaHint: Ollama's paths label a body its fields leave open (a bare chat body streams
// when sent to /api/chat), and a generate body reads as the chat of its system and prompt, as
// Ollama's template renders both.
func TestOllamaHint(t *testing.T) {
	for path, want := range map[string]Format{
		"/api/chat": OllamaChat, "/ollama/api/chat/": OllamaChat, "/api/generate": OllamaGenerate,
		"/api/chat/x": None, "/api/tags": None, "/v1/chat/completions": None,
	} {
		if got := Hint(httptest.NewRequest(http.MethodPost, path, nil)); got != want {
			t.Errorf("Hint(%s) = %v, want %v", path, got, want)
		}
	}
	chat := []byte(`{"model":"tiny","messages":[{"role":"system","content":"S"},{"role":"user","content":"Hi"}]}`)
	if got := Parse(chat, false); got.Format != Chat || got.Stream {
		t.Errorf("bare chat body without a hint: %s", show(got))
	}
	c := ParseAs(chat, false, OllamaChat)
	if c.Format != OllamaChat || !c.Stream {
		t.Errorf("bare chat body sent to /api/chat: %s, want ollama_chat streamed", show(c))
	}
	prompt := []byte(`{"model":"tiny","prompt":"Hi"}`)
	if got := Parse(prompt, false); got.Format != Completion || got.Text != "Hi" {
		t.Errorf("bare prompt body without a hint: %s", show(got))
	}
	g := ParseAs([]byte(`{"model":"tiny","system":"S","prompt":"Hi"}`), false, OllamaGenerate)
	if g.Format != OllamaGenerate || !g.Stream || g.Text != c.Text {
		t.Errorf("generate body sent to /api/generate: %s, want the text of the chat %q", show(g), c.Text)
	}
	if g := ParseAs(prompt, false, OllamaGenerate); g.Format != OllamaGenerate || g.Text != msg("user", "Hi") {
		t.Errorf("bare prompt body sent to /api/generate: %s", show(g))
	}
	// /api/generate without a prompt only loads the model.
	if g := ParseAs([]byte(`{"model":"tiny"}`), false, OllamaGenerate); g.Format != None || g.Text != "" {
		t.Errorf("load request: %s", show(g))
	}
}
