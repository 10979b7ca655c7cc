package replay

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestReadEvents(t *testing.T) {
	tests := []struct {
		name       string
		stream     string
		prompt     int
		cached     int
		wantErr    string
		wantNoTTFT bool
	}{
		{"vllm chat", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
			"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\n" +
			"data: [DONE]\n\n", 30, 16, "", false},
		{"CRLF and comments", ": keep-alive\r\nevent: message\r\ndata:{\"usage\":{\"prompt_tokens\":5}}\r\n\r\ndata: [DONE]\r\n\r\n", 5, 0, "", false},
		{"no DONE", "data: {\"choices\":[]}\n\n", 0, 0, "without [DONE]", false},
		{"empty", "", 0, 0, "without [DONE]", true},
		{"error event", "data: {\"error\":{\"message\":\"boom\"}}\n\n", 0, 0, "boom", false},
		{"bad JSON", "data: {\"usage\":\n\n", 0, 0, "bad event", false},
		{"no usage", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", -1, 0, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ttft, u, err := readEvents(strings.NewReader(tt.stream), time.Now())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if (ttft == 0) != tt.wantNoTTFT {
				t.Errorf("ttft %v", ttft)
			}
			switch {
			case tt.prompt < 0 && u != nil:
				t.Errorf("usage %+v, want none", u)
			case tt.prompt > 0 && (u == nil || u.PromptTokens != tt.prompt):
				t.Errorf("usage %+v, want %d prompt tokens", u, tt.prompt)
			case tt.cached > 0 && u.PromptTokensDetails.CachedTokens != tt.cached:
				t.Errorf("cached %d, want %d", u.PromptTokensDetails.CachedTokens, tt.cached)
			}
		})
	}
}

func FuzzReadEvents(f *testing.F) {
	f.Add("data: {\"usage\":{\"prompt_tokens\":3}}\n\ndata: [DONE]\n\n")
	f.Add("data: {\"error\":{}}\n")
	f.Fuzz(func(t *testing.T, s string) {
		readEvents(strings.NewReader(s), time.Now()) // must not panic
	})
}

func TestPercentile(t *testing.T) {
	tests := []struct {
		xs   []float64
		p    float64
		want float64
	}{
		{nil, 0.5, 0},
		{[]float64{7}, 0.99, 7},
		{[]float64{3, 1, 2, 4}, 0.5, 2},
		{[]float64{3, 1, 2, 4}, 0.99, 4},
		{[]float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}, 0.9, 9},
	}
	for _, tt := range tests {
		if got := percentile(tt.xs, tt.p); got != tt.want {
			t.Errorf("percentile(%v, %v) = %v, want %v", tt.xs, tt.p, got, tt.want)
		}
	}
}

func TestImbalance(t *testing.T) {
	tests := []struct {
		counts  map[string]int
		workers int
		want    float64
	}{
		{map[string]int{}, 4, 0},
		{map[string]int{"a": 5, "b": 5}, 0, 1},
		{map[string]int{"a": 9, "b": 3}, 0, 1.5},
		{map[string]int{"a": 8}, 4, 4},
	}
	for _, tt := range tests {
		if got := imbalance(tt.counts, tt.workers); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("imbalance(%v, %d) = %v, want %v", tt.counts, tt.workers, got, tt.want)
		}
	}
}
