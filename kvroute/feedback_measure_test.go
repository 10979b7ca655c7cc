package kvroute

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestFeedbackOverheadMeasure measures what llm_feedback costs through a real Caddy: the delay
// it adds to an answer's first byte and the streaming throughput with it against without it,
// alternating the two in one run. It is a measurement, not a check: KVROUTE_MEASURE=1 runs it.
func TestFeedbackOverheadMeasure(t *testing.T) {
	if os.Getenv("KVROUTE_MEASURE") == "" {
		t.Skip("a measurement: KVROUTE_MEASURE=1 runs it")
	}
	event := "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("token ", 8) + "\"}}]}\n\n"
	const bigEvents = 16 << 10 // about 2 MiB of events
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		n := 1
		if r.Header.Get("X-Big") != "" {
			n = bigEvents
		}
		// Engines write and flush each event (vLLM, SGLang); X-Batch writes 32 KiB at a time,
		// the observer's worst case against the proxy's cost per write.
		bw := bufio.NewWriterSize(w, 32<<10)
		for i := range n {
			bw.WriteString(event)
			if i == 0 || r.Header.Get("X-Batch") == "" || bw.Available() < len(event) {
				bw.Flush()
				w.(http.Flusher).Flush()
			}
		}
		bw.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\ndata: [DONE]\n\n")
		bw.Flush()
	}))
	t.Cleanup(engine.Close)
	leakCheck(t)
	addr := strings.TrimPrefix(engine.URL, "http://")
	startCaddy(t, fmt.Sprintf(`{
	admin `+adminAddr+`
	http_port %d
	https_port `+httpsPort+`
	grace_period 1s
}
http://localhost:%d {
	@llm llm_prompt
	llm_feedback @llm
	reverse_proxy @llm %s {
		lb_policy kv_cache_aware {
			telemetry off
		}
		flush_interval -1
	}
}
http://localhost:%d {
	@llm llm_prompt
	reverse_proxy @llm %s {
		lb_policy kv_cache_aware {
			telemetry off
		}
		flush_interval -1
	}
}
`, httpPort, httpPort, addr, httpPort2, addr))
	body := chatBody("m", strings.Repeat("a system prompt. ", 50), "hi")
	client := &http.Client{Timeout: time.Minute}
	urls := [2]string{fmt.Sprintf("http://localhost:%d/v1/chat/completions", httpPort2), baseURL + "/v1/chat/completions"}
	first := func(url string, big bool, batch ...bool) (time.Duration, time.Duration) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if big {
			req.Header.Set("X-Big", "1")
		}
		if len(batch) > 0 && batch[0] {
			req.Header.Set("X-Batch", "1")
		}
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b [1]byte
		if _, err := io.ReadFull(resp.Body, b[:]); err != nil {
			t.Fatal(err)
		}
		ttfb := time.Since(start)
		io.Copy(io.Discard, resp.Body)
		return ttfb, time.Since(start)
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		slices.Sort(d)
		return d[int(p*float64(len(d)-1))]
	}
	const n = 400
	var ttfb [2][]time.Duration
	for i := range 2 * n {
		k := i % 2
		d, _ := first(urls[k], false)
		ttfb[k] = append(ttfb[k], d)
	}
	for k, name := range []string{"without", "with"} {
		t.Logf("first byte %s llm_feedback: median %v, p99 %v (%d answers)", name, pct(ttfb[k], 0.5), pct(ttfb[k], 0.99), n)
	}
	const repeats = 15
	for _, batch := range []bool{false, true} {
		var ratios []float64
		for i := range repeats {
			// Which goes first alternates: a pair's second run finds the machine as the first
			// left it.
			var with, without time.Duration
			if i%2 == 0 {
				_, without = first(urls[0], true, batch)
				_, with = first(urls[1], true, batch)
			} else {
				_, with = first(urls[1], true, batch)
				_, without = first(urls[0], true, batch)
			}
			ratios = append(ratios, without.Seconds()/with.Seconds())
		}
		slices.Sort(ratios)
		how := "each event written and flushed"
		if batch {
			how = "32 KiB writes"
		}
		t.Logf("streaming throughput with/without llm_feedback (%d events, %s, %d pairs): median %.3f, min %.3f, max %.3f",
			bigEvents, how, repeats, ratios[repeats/2], ratios[0], ratios[repeats-1])
	}
}
