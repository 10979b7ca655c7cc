package fleetsim

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// Workload is a scenario's requests before they are run: sessions of calls, each with the
// earliest time it may be sent at the workload's nominal pace. Open loop scales those times
// to the scenario's rate; closed loop ignores them.
type Workload struct {
	Name     string
	sessions []session
	// full returns a segment's whole length in tokens (a trace's block cut short is a prefix
	// of the whole block's text).
	full func(segment) int
}

// Calls returns the number of requests.
func (w *Workload) Calls() int {
	n := 0
	for _, s := range w.sessions {
		n += len(s.calls)
	}
	return n
}

// span is the nominal time from the first call to the last.
func (w *Workload) span() time.Duration {
	var last time.Duration
	for _, s := range w.sessions {
		for _, c := range s.calls {
			last = max(last, c.at)
		}
	}
	return last
}

func wholeSegment(s segment) int { return s.tokens }

// ChatWorkload is the demo's chat generator (examples/workload.ChatWorkload: conversations that
// share a few long system prompts and grow turn by turn), as segments: each message is a
// segment of its chars / 4 tokens (the generator's own sizes), whatever the scenario's true
// ratio, so the same conversation has the same tokens in every scenario. requests rounds down
// to whole conversations of 8 turns.
func ChatWorkload(requests int, seed uint64) *Workload {
	cfg := workload.DefaultChat
	cfg.Conversations = max(1, requests/cfg.Turns)
	cfg.Seed = seed
	return chatWorkload(cfg)
}

// chatWorkload is ChatWorkload with cfg's conversations, seed and rate.
func chatWorkload(cfg workload.ChatConfig) *Workload {
	w := workload.ChatWorkload(cfg)
	out := &Workload{Name: "chat", full: wholeSegment}
	for _, s := range w.Sessions {
		ss := session{id: s.ID}
		for _, c := range s.Calls {
			segs := make([]segment, 0, len(c.Messages))
			for _, m := range c.Messages {
				segs = append(segs, segment{
					id:     segID(m.Role, m.Content),
					tokens: (len(m.Content) + workload.CharsPerToken - 1) / workload.CharsPerToken,
				})
			}
			ss.calls = append(ss.calls, call{segs: segs, output: c.MaxTokens, at: c.At, model: cfg.Model})
		}
		out.sessions = append(out.sessions, ss)
	}
	return out
}

// traceWorkload turns Mooncake-format requests (prefix-chained ids of 512-token blocks) into
// one-call sessions sent at their timestamps.
func traceWorkload(name string, reqs []workload.Request, model string) *Workload {
	out := &Workload{Name: name, full: func(s segment) int { return workload.BlockTokens }}
	for i, r := range reqs {
		segs := make([]segment, 0, len(r.HashIDs))
		left := r.InputLength
		for _, id := range r.HashIDs {
			n := min(left, workload.BlockTokens)
			if n <= 0 {
				break
			}
			segs = append(segs, segment{id: uint64(id)<<8 | 0x4d, tokens: n})
			left -= n
		}
		out.sessions = append(out.sessions, session{
			id:    fmt.Sprintf("%s-%d", name, i),
			calls: []call{{segs: segs, output: max(1, r.OutputLength), at: r.Timestamp, model: model}},
		})
	}
	return out
}

// MooncakeWorkload is the first n requests of the Mooncake synthetic trace (workload.Mooncake:
// the repository's copy, or KVROUTE_WORKLOADS's), or an error when it cannot be read.
func MooncakeWorkload(n int) (*Workload, error) {
	reqs, err := loadTrace()
	if err != nil {
		return nil, err
	}
	return traceWorkload("mooncake", reqs[:min(n, len(reqs))], "llama-3.1-8b"), nil
}

var traceMu sync.Mutex

// traceCache is the trace read once per source (scenarios and seeds share it, read-only).
var traceCache = struct {
	source string
	reqs   []workload.Request
}{}

func loadTrace() ([]workload.Request, error) {
	traceMu.Lock()
	defer traceMu.Unlock()
	source := workload.MooncakeSource()
	if traceCache.reqs != nil && traceCache.source == source {
		return traceCache.reqs, nil
	}
	reqs, err := workload.Mooncake()
	if err != nil {
		return nil, err
	}
	traceCache.source, traceCache.reqs = source, reqs
	return reqs, nil
}

// ConversationWorkload generates n requests shaped like Mooncake's FAST'25 conversation trace
// (kvcache-ai/Mooncake FAST25-release/traces/conversation_trace.jsonl), from figures measured
// on that file: every request starts with the same 512-token block; 12,031 requests in an hour;
// input tokens mean 12,035, p50 6,909, p90 27,367, p99 85,399; output mean 343, p50 350; an
// infinite cache hits 37% of blocks; about 40% of requests share only the first block with
// earlier ones (new conversations) and the rest resend an earlier request's prompt and add to
// it (follow-up turns). Conversations of a geometric number of turns (mean 1.5) start as a
// Poisson process; a turn resends the previous prompt, the previous answer and a new message.
// Over 6,000 requests (seed 1) the look-alike has input mean 11,651, p50 6,951, p90 26,900,
// p99 69,428 tokens, output mean 334, infinite-cache block hits 0.358 (TestLookAlikes).
func ConversationWorkload(n int, seed uint64) *Workload {
	return traceWorkload("conversation", ConversationTrace(n, seed), "llama-3.1-8b")
}

// ConversationTrace is ConversationWorkload's requests in Mooncake's format (hash ids of
// 512-token blocks), for the demo to send the same workload through Caddy
// (workload.MooncakeWorkload: each id's text is workload.Block's).
func ConversationTrace(n int, seed uint64) []workload.Request {
	r := newRNG(seed, "conversation")
	var reqs []workload.Request
	next := 1 // hash ids; 0 is the shared first block
	newBlocks := func(tokens int) []int {
		ids := make([]int, (tokens+workload.BlockTokens-1)/workload.BlockTokens)
		for i := range ids {
			ids[i] = next
			next++
		}
		return ids
	}
	start := 0.0
	for len(reqs) < 2*n {
		start += r.exp() * 0.75 // conversations per second: 1.33, about 3.3 requests/s
		turns := 1
		for r.float() < 0.35 {
			turns++
		}
		ids := []int{0}
		prevOut := 0
		t := start
		for turn := 0; turn < turns; turn++ {
			// A turn resends the previous prompt (its last block whole) and appends the
			// previous answer and a new message.
			add := r.lognormal(4200, 1.15, 100, 120000)
			if turn > 0 {
				add = prevOut + r.lognormal(2500, 1.3, 20, 60000)
			}
			ids = append(ids, newBlocks(add)...)
			prevOut = r.lognormal(290, 0.55, 1, 2000)
			reqs = append(reqs, workload.Request{
				Timestamp:    time.Duration(t * float64(time.Second)),
				InputLength:  len(ids)*workload.BlockTokens - r.intn(workload.BlockTokens),
				OutputLength: prevOut,
				HashIDs:      slices.Clone(ids),
			})
			t += 20 + r.exp()*60 // the user reads and types
		}
	}
	// The first n by time: cutting where generation stopped would leave a tail of late
	// follow-ups, and the arrival rate would sag at the end of the trace.
	slices.SortStableFunc(reqs, func(a, b workload.Request) int { return cmp.Compare(a.Timestamp, b.Timestamp) })
	return reqs[:n]
}

// ToolAgentWorkload generates n requests shaped like Mooncake's FAST'25 tool-and-agent trace
// (toolagent_trace.jsonl: 23,608 requests in an hour, input tokens mean 8,596, output mean 182,
// per the release's README; the file itself is not in the stored copy). The shape is assumed,
// not measured: agents' episodes reuse one of 24 long tool/system prompts (Zipf popularity,
// 2-8k tokens), each step resending the episode so far plus a tool result, with short outputs.
// Over 6,000 requests (seed 1): input mean about 8,700 tokens, output mean about 180, and
// infinite-cache block hits 0.82 (TestLookAlikes).
func ToolAgentWorkload(n int, seed uint64) *Workload {
	r := newRNG(seed, "toolagent")
	const tools = 24
	toolIDs := make([][]int, tools)
	next := 1
	for i := range toolIDs {
		blocks := 4 + r.intn(13) // 2k-8k tokens
		for range blocks {
			toolIDs[i] = append(toolIDs[i], next)
			next++
		}
	}
	var reqs []workload.Request
	start := 0.0
	for len(reqs) < 2*n {
		start += r.exp() * 0.6
		ids := slices.Clone(toolIDs[r.zipf(tools, 1.1)])
		steps := 1
		for r.float() < 0.6 {
			steps++
		}
		t := start
		for step := 0; step < steps; step++ {
			add := r.lognormal(800, 1.0, 20, 30000)
			for range (add + workload.BlockTokens - 1) / workload.BlockTokens {
				ids = append(ids, next)
				next++
			}
			out := r.lognormal(130, 0.8, 1, 1500)
			reqs = append(reqs, workload.Request{
				Timestamp:    time.Duration(t * float64(time.Second)),
				InputLength:  len(ids)*workload.BlockTokens - r.intn(workload.BlockTokens/2),
				OutputLength: out,
				HashIDs:      slices.Clone(ids),
			})
			t += 1 + r.exp()*4 // the tool runs
		}
	}
	// The first n by time: cutting where generation stopped would leave a tail of late
	// follow-ups, and the arrival rate would sag at the end of the trace.
	slices.SortStableFunc(reqs, func(a, b workload.Request) int { return cmp.Compare(a.Timestamp, b.Timestamp) })
	reqs = reqs[:n]
	return traceWorkload("toolagent", reqs, "llama-3.1-8b")
}

// sideCall is request i of the unrelated traffic a side client sends straight to one engine:
// prompts of 1-3k tokens that share nothing.
func sideCall(r *rng, i int) call {
	return call{segs: []segment{{id: segID("side", i), tokens: 1000 + r.intn(2000)}}, output: 50 + r.intn(150)}
}

// ClassSpec names one class of a two-class workload: the scorecard's class, and the tenant and
// priority band its requests carry.
type ClassSpec struct {
	Class, Tenant, Priority string
}

// TwoClassWorkload is two classes of chat conversations sent together, each with its own
// system prompts and conversations (its own seed): the first class's requests/(1+k) requests
// at the chat generator's pace (conversations start at 2 per second, nominal), the second
// k times as many at k times the pace, its nominal times scaled to end when the first's do, so
// that the second sends k times the first's requests and tokens (the same shapes) over the
// same span. alone keeps the first class only, with requests requests: run at the rate of the
// first class in the mix, its requests are the mix's first class, call for call and time for
// time (TestTwoClassAloneIsTheMixsFirst). Sessions of the first class come first.
func TwoClassWorkload(requests int, seed uint64, k int, alone bool, first, second ClassSpec) *Workload {
	nFirst := requests
	if !alone {
		nFirst = requests / (1 + k)
	}
	cfg := workload.DefaultChat
	cfg.Conversations = max(1, nFirst/cfg.Turns)
	cfg.Seed = seed
	out := chatWorkload(cfg)
	out.Name = first.Class
	for i := range out.sessions {
		out.sessions[i].tenant, out.sessions[i].priority, out.sessions[i].class = first.Tenant, first.Priority, first.Class
	}
	if alone {
		return out
	}
	out.Name = first.Class + "+" + second.Class
	cfg.Conversations = max(1, (requests-nFirst)/cfg.Turns)
	cfg.Seed = splitmix(seed ^ hashString(second.Class))
	cfg.Rate *= float64(k)
	more := chatWorkload(cfg)
	span, spanMore := out.span(), more.span()
	for _, s := range more.sessions {
		for j := range s.calls {
			if spanMore > 0 {
				s.calls[j].at = time.Duration(float64(s.calls[j].at) * float64(span) / float64(spanMore))
			}
		}
		s.tenant, s.priority, s.class = second.Tenant, second.Priority, second.Class
		out.sessions = append(out.sessions, s)
	}
	return out
}
