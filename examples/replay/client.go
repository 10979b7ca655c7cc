package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// usage is the usage object of an OpenAI response (vLLM reports cached tokens in it).
// HeaderReplica is the response header in which a front proxy names the replica (the router)
// that served a request, as the demo's -replicas front sets it; kept in Record.Replica.
const HeaderReplica = "X-Kvroute-Replica"

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// payload is what the client reads from a response body or a stream event.
type payload struct {
	Usage *usage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// do sends the call and fills rec with the status, timings, usage and worker.
func (r *runner) do(ctx context.Context, rec *Record, c workload.Call, body []byte) {
	stream := !r.opts.NoStream
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.opts.BaseURL+c.API.Path(), bytes.NewReader(body))
	if err != nil {
		rec.Error = err.Error()
		return
	}
	req.Header.Set("Content-Type", "application/json")
	if stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	for k, v := range c.Headers {
		req.Header.Set(k, v)
	}
	start := time.Now()
	rec.StartMs = ms(start.Sub(r.start))
	resp, err := r.opts.Client.Do(req)
	if err != nil {
		rec.Error = err.Error()
		rec.LatencyMs = ms(time.Since(start))
		return
	}
	defer func() {
		// Read to the end (the chunked terminator after [DONE]) so that the connection is
		// reused instead of closed under a proxy still writing.
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
	}()
	rec.Status = resp.StatusCode
	rec.Worker = resp.Header.Get(llmsim.HeaderWorker)
	rec.Replica = resp.Header.Get(HeaderReplica)
	rec.RequestID = resp.Header.Get(llmsim.HeaderRequestID)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		rec.Error = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		rec.LatencyMs = ms(time.Since(start))
		return
	}

	var u *usage
	mediaType, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if stream && mediaType == "text/event-stream" {
		var ttft time.Duration
		ttft, u, err = readEvents(resp.Body, start)
		rec.TTFTMs = ms(ttft)
	} else {
		var p payload
		err = json.NewDecoder(resp.Body).Decode(&p)
		if err == nil && p.Error != nil {
			err = errors.New(p.Error.Message)
		}
		u = p.Usage
	}
	rec.LatencyMs = ms(time.Since(start))
	if rec.TTFTMs == 0 {
		rec.TTFTMs = rec.LatencyMs
	}
	if err != nil {
		rec.Error = err.Error()
		return
	}
	if u == nil {
		rec.Error = "response without usage"
		return
	}
	rec.PromptTokens = u.PromptTokens
	rec.CompletionTokens = u.CompletionTokens
	if u.PromptTokensDetails != nil {
		rec.CachedTokens = u.PromptTokensDetails.CachedTokens
	} else if v, err := strconv.Atoi(resp.Header.Get(llmsim.HeaderCachedTokens)); err == nil {
		rec.CachedTokens = v
	}
}

// readEvents reads a server-sent event stream to its "data: [DONE]". It returns the time from
// start to the first data event (the time to first token) and the usage of the last chunk
// that carried one.
func readEvents(body io.Reader, start time.Time) (time.Duration, *usage, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 16<<10), 4<<20)
	var (
		ttft time.Duration
		u    *usage
	)
	for sc.Scan() {
		line, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue // comments, event names, blank separators
		}
		if ttft == 0 {
			ttft = max(time.Since(start), time.Nanosecond)
		}
		line = bytes.TrimSpace(line)
		if bytes.Equal(line, []byte("[DONE]")) {
			return ttft, u, nil
		}
		if !bytes.Contains(line, []byte(`"usage"`)) && !bytes.Contains(line, []byte(`"error"`)) {
			continue // a token chunk: no need to decode it
		}
		var p payload
		if err := json.Unmarshal(line, &p); err != nil {
			return ttft, u, fmt.Errorf("bad event: %w", err)
		}
		if p.Error != nil {
			return ttft, u, fmt.Errorf("stream error: %s", p.Error.Message)
		}
		if p.Usage != nil {
			u = p.Usage
		}
	}
	if err := sc.Err(); err != nil {
		return ttft, u, err
	}
	return ttft, u, errors.New("stream ended without [DONE]")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
