package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// sideLoad is traffic the router does not send: n closed-loop clients posting cold chat
// prompts straight to one worker while the replay runs, as another gateway or a batch job
// would. Their requests are not in the replay's results; the worker's queue is what the
// routers under test must notice (kv_cache_aware through telemetry).
type sideLoad struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sent   atomic.Int64
	failed atomic.Int64
}

// startSideLoad starts n clients against the worker at addr (host:port); n <= 0 starts none.
func startSideLoad(ctx context.Context, addr string, n int) *sideLoad {
	ctx, cancel := context.WithCancel(ctx)
	s := &sideLoad{cancel: cancel}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: max(n, 1)}}
	for i := range n {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for j := 0; ctx.Err() == nil; j++ {
				// About 1,000 tokens of text no other request shares: a cold prefill each time.
				prompt := fmt.Sprintf("side load client %d request %d: ", i, j) + strings.Repeat(fmt.Sprintf("unrelated batch text %d-%d ", i, j), 170)
				body, _ := json.Marshal(map[string]any{
					"messages":   []map[string]string{{"role": "user", "content": prompt}},
					"max_tokens": 32,
				})
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", bytes.NewReader(body))
				if err != nil {
					return
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						s.failed.Add(1)
						time.Sleep(10 * time.Millisecond)
					}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					s.failed.Add(1)
				}
				s.sent.Add(1)
			}
		}()
	}
	return s
}

// stop ends the clients and waits for them.
func (s *sideLoad) stop() {
	s.cancel()
	s.wg.Wait()
}
