package kvroute

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// benchBodies returns n chat bodies of about size bytes: 4 long shared system prompts, then a
// conversation-specific user turn.
func benchBodies(n, size int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		sys := fmt.Sprintf("System prompt %d. ", i%4) + strings.Repeat(fmt.Sprintf("Rule %d: be precise and kind. ", i%4), size/2/30)
		user := fmt.Sprintf("conversation %d: ", i) + strings.Repeat("tell me more about that topic please ", size/2/37)
		out[i] = []byte(chatBody("m", sys, user))
	}
	return out
}

var benchURL, _ = url.Parse("http://localhost/v1/chat/completions")

// benchRequest builds what Caddy hands to the matcher and Select: a POST with the body and the
// vars map in a cancellable context.
func benchRequest(body []byte, session string) (*http.Request, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), caddyhttp.VarsCtxKey, map[string]any{}))
	r := (&http.Request{
		Method:        http.MethodPost,
		URL:           benchURL,
		Header:        http.Header{},
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
	}).WithContext(ctx)
	if session != "" {
		r.Header.Set("X-Session-ID", session)
	}
	return r, cancel
}

// BenchmarkSelect measures one decision, body extraction included, on 8 upstreams.
func BenchmarkSelect(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		bodies := benchBodies(64, size)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			p := newPolicy(b, nil)
			pool := newPool("u1:1", "u2:1", "u3:1", "u4:1", "u5:1", "u6:1", "u7:1", "u8:1")
			m := &LLMPrompt{MaxBody: DefaultMaxBody}
			b.SetBytes(int64(len(bodies[0])))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r, cancel := benchRequest(bodies[i%len(bodies)], "")
				if ok, _ := m.MatchWithError(r); !ok {
					b.Fatal("matcher did not match")
				}
				if p.Select(pool, r, nil) == nil {
					b.Fatal("no upstream")
				}
				cancel()
			}
		})
		b.Run(fmt.Sprintf("%dKiB/parallel", size>>10), func(b *testing.B) {
			p := newPolicy(b, nil)
			pool := newPool("u1:1", "u2:1", "u3:1", "u4:1", "u5:1", "u6:1", "u7:1", "u8:1")
			m := &LLMPrompt{MaxBody: DefaultMaxBody}
			var n atomic.Int64
			b.SetBytes(int64(len(bodies[0])))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r, cancel := benchRequest(bodies[int(n.Add(1))%len(bodies)], "")
					m.MatchWithError(r)
					if p.Select(pool, r, nil) == nil {
						b.Error("no upstream")
					}
					cancel()
				}
			})
		})
	}
}

// BenchmarkSelectSessions measures decisions with 10k live sessions, against the same
// requests without a session header, to isolate the cost of the session lookup.
func BenchmarkSelectSessions(b *testing.B) {
	bodies := benchBodies(64, 4<<10)
	const sessions = 10000
	ids := make([]string, sessions)
	for i := range ids {
		ids[i] = fmt.Sprintf("session-%d", i)
	}
	for _, withSession := range []bool{false, true} {
		name := "no-session"
		if withSession {
			name = "10k-sessions"
		}
		b.Run(name+"/parallel", func(b *testing.B) {
			p := newPolicy(b, nil)
			pool := newPool("u1:1", "u2:1", "u3:1", "u4:1", "u5:1", "u6:1", "u7:1", "u8:1")
			for i, id := range ids {
				r, cancel := benchRequest(bodies[i%len(bodies)], id)
				p.Select(pool, r, nil)
				cancel()
			}
			if got := p.state.sessions.len(); got != sessions {
				b.Fatalf("%d live sessions, want %d", got, sessions)
			}
			var n atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := int(n.Add(1))
					id := ""
					if withSession {
						id = ids[i%sessions]
					}
					r, cancel := benchRequest(bodies[i%len(bodies)], id)
					if p.Select(pool, r, nil) == nil {
						b.Error("no upstream")
					}
					cancel()
				}
			})
		})
	}
}

// BenchmarkSelectDecisionCost is BenchmarkSelect's 4KiB decision with decision cost: every
// candidate's predicted TTFT on top.
func BenchmarkSelectDecisionCost(b *testing.B) {
	bodies := benchBodies(64, 4<<10)
	for _, decision := range []string{decisionThresholds, decisionCost} {
		b.Run(decision, func(b *testing.B) {
			p := newPolicy(b, &KVCacheAware{Decision: decision})
			pool := newPool("u1:1", "u2:1", "u3:1", "u4:1", "u5:1", "u6:1", "u7:1", "u8:1")
			m := &LLMPrompt{MaxBody: DefaultMaxBody}
			b.SetBytes(int64(len(bodies[0])))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r, cancel := benchRequest(bodies[i%len(bodies)], "")
				if ok, _ := m.MatchWithError(r); !ok {
					b.Fatal("matcher did not match")
				}
				if p.Select(pool, r, nil) == nil {
					b.Fatal("no upstream")
				}
				cancel()
			}
		})
	}
}

// BenchmarkSelectHarness is what BenchmarkSelect's loop costs besides the matcher and Select:
// building the request as Caddy hands it over and cancelling its context (no AfterFunc is
// registered here, so the cancel costs less than in BenchmarkSelect). Its figures, taken from
// BenchmarkSelect's, leave the matcher's and Select's own.
func BenchmarkSelectHarness(b *testing.B) {
	bodies := benchBodies(64, 4<<10)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r, cancel := benchRequest(bodies[i%len(bodies)], "")
		if r.Body == nil {
			b.Fatal("no body")
		}
		cancel()
	}
}

// BenchmarkSelectTrace measures a decision with the decision trace off (kvroute's logger at
// Caddy's default level, INFO: the trace costs a level check) and on (at DEBUG, one JSON line
// per decision to a discarding writer), on 8 upstreams with 4 KiB bodies.
func BenchmarkSelectTrace(b *testing.B) {
	bodies := benchBodies(64, 4<<10)
	for _, level := range []zapcore.Level{zapcore.InfoLevel, zapcore.DebugLevel} {
		name := "off"
		if level == zapcore.DebugLevel {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			p := newPolicy(b, nil)
			p.logger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), level))
			pool := newPool("u1:1", "u2:1", "u3:1", "u4:1", "u5:1", "u6:1", "u7:1", "u8:1")
			m := &LLMPrompt{MaxBody: DefaultMaxBody}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r, cancel := benchRequest(bodies[i%len(bodies)], "")
				if ok, _ := m.MatchWithError(r); !ok {
					b.Fatal("matcher did not match")
				}
				if p.Select(pool, r, nil) == nil {
					b.Fatal("no upstream")
				}
				cancel()
			}
		})
	}
}
