package workload

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// ChatConfig describes a synthetic multi-turn chat workload: conversations that share a few
// long system prompts and grow turn by turn, the case prefix-aware routing is made for.
// Zero fields take the defaults of DefaultChat.
type ChatConfig struct {
	Conversations int // number of conversations
	SystemPrompts int // distinct system prompts shared by the conversations
	Turns         int // user turns per conversation
	// PromptZipf > 0 draws a conversation's system prompt by Zipf's law of that exponent (the
	// first the most popular: with 16 prompts, 1.3 gives the first about 40% of the
	// conversations); 0 draws them uniformly.
	PromptZipf float64

	SystemChars [2]int // min and max length of a system prompt, in chars
	UserChars   [2]int // min and max length of a user message
	ReplyChars  [2]int // min and max length of an assistant reply (rounded to whole tokens)

	// SessionHeader names a header carrying the conversation's id on every turn, such as
	// "X-Session-ID"; empty sends none.
	SessionHeader string
	Model         string
	Seed          uint64

	// Open loop only: conversations start as a Poisson process of Rate per second, and turn t
	// of a conversation is sent no earlier than t*Think after its start.
	Rate  float64
	Think time.Duration
}

// DefaultChat is the chat workload used by the demo: 64 conversations of 8 turns over 8 system
// prompts of 2-4k chars, seed 0. The last turn of a conversation is about 2,400 tokens (2,813
// at most); the whole workload has 7,281 distinct 16-token blocks, and an infinite cache hits
// 85% of its prompt tokens.
var DefaultChat = ChatConfig{
	Conversations: 64,
	SystemPrompts: 8,
	Turns:         8,
	SystemChars:   [2]int{2000, 4000},
	UserChars:     [2]int{200, 600},
	ReplyChars:    [2]int{200, 800},
	Model:         "llama-3.1-8b",
	Rate:          2,
	Think:         2 * time.Second,
}

// Prefix cache capacities of a simulated fleet, in 16-token blocks, for each workload (split
// evenly among the workers: 256 and 65,536 blocks for 4 workers). Each is small enough that
// one LRU cache as large as the whole fleet hits clearly less than an infinite cache, so that
// where a router puts prefixes matters, and large enough that a router can still keep most of
// what is reused. Measured with 4 workers (replay -dry-run, and replays through a round-robin
// proxy):
//
//	workload                          fleet LRU  infinite  round robin
//	chat, closed loop, 16 clients     0.41-0.50  0.85      0.17
//	mooncake, whole trace, open loop  0.39       0.65      0.12
//
// The chat figure depends on the clients: a fleet LRU of 1,024 blocks hits 0.82 with 8
// clients in lockstep and 0.36 with 32.
const (
	ChatFleetBlocks     = 1024
	MooncakeFleetBlocks = 262144
)

func (c ChatConfig) withDefaults() ChatConfig {
	d := DefaultChat
	if c.Conversations <= 0 {
		c.Conversations = d.Conversations
	}
	if c.SystemPrompts <= 0 {
		c.SystemPrompts = d.SystemPrompts
	}
	if c.Turns <= 0 {
		c.Turns = d.Turns
	}
	fix := func(r, def [2]int) [2]int {
		if r[1] <= 0 {
			return def
		}
		r[0] = max(r[0], 1)
		r[1] = max(r[1], r[0])
		return r
	}
	c.SystemChars = fix(c.SystemChars, d.SystemChars)
	c.UserChars = fix(c.UserChars, d.UserChars)
	c.ReplyChars = fix(c.ReplyChars, d.ReplyChars)
	if c.Model == "" {
		c.Model = d.Model
	}
	if c.Rate <= 0 {
		c.Rate = d.Rate
	}
	if c.Think <= 0 {
		c.Think = d.Think
	}
	return c
}

// ChatWorkload builds the chat workload: the same config and seed always give the same calls.
// Turn t of a conversation sends the system prompt, the t previous user messages with the
// assistant replies, and a new user message, exactly as a client resends its history, so
// turn t+1's prompt starts with turn t's prompt. The replies are the workload's, not the
// server's: each call asks for as many tokens as the reply that the next turn resends.
func ChatWorkload(cfg ChatConfig) Workload {
	cfg = cfg.withDefaults()
	rng := newRNG(cfg.Seed, 0)
	systems := make([]string, cfg.SystemPrompts)
	for k := range systems {
		systems[k] = text(rng.next(), fmt.Sprintf("You are assistant %d. ", k), rng.between(cfg.SystemChars))
	}
	w := Workload{Name: "chat", Sessions: make([]Session, cfg.Conversations)}
	var start time.Duration
	for i := range w.Sessions {
		r := newRNG(cfg.Seed, uint64(i)+1)
		id := fmt.Sprintf("conv-%d-%d", cfg.Seed, i)
		var headers map[string]string
		if cfg.SessionHeader != "" {
			headers = map[string]string{cfg.SessionHeader: id}
		}
		var k int
		if cfg.PromptZipf > 0 {
			k = zipf(r.next(), len(systems), cfg.PromptZipf)
		} else {
			k = r.intn(len(systems))
		}
		history := []Message{{Role: "system", Content: systems[k]}}
		calls := make([]Call, cfg.Turns)
		for t := range calls {
			user := text(r.next(), fmt.Sprintf("[conversation %d, turn %d] ", i, t), r.between(cfg.UserChars))
			replyChars := max(CharsPerToken, r.between(cfg.ReplyChars)/CharsPerToken*CharsPerToken)
			reply := text(r.next(), "", replyChars)
			history = append(history, Message{Role: "user", Content: user})
			calls[t] = Call{
				API:       APIChat,
				Model:     cfg.Model,
				Messages:  history[:len(history):len(history)],
				MaxTokens: replyChars / CharsPerToken,
				At:        start + time.Duration(t)*cfg.Think,
				Headers:   headers,
			}
			history = append(history, Message{Role: "assistant", Content: reply})
		}
		w.Sessions[i] = Session{ID: id, Calls: calls}
		start += time.Duration(rng.exp() / cfg.Rate * float64(time.Second))
	}
	return w
}

// zipf maps the random bits u to an index in [0, n) with probability proportional to
// 1/(i+1)^s.
func zipf(u uint64, n int, s float64) int {
	total := 0.0
	for i := range n {
		total += math.Pow(float64(i+1), -s)
	}
	x := (float64(u>>11) + 0.5) / (1 << 53) * total
	for i := range n {
		if x -= math.Pow(float64(i+1), -s); x <= 0 {
			return i
		}
	}
	return n - 1
}

// text returns exactly n chars (ASCII): prefix, then English-like words drawn from seed.
func text(seed uint64, prefix string, n int) string {
	var sb strings.Builder
	sb.Grow(n + 16)
	sb.WriteString(prefix)
	for sb.Len() < n {
		seed = Splitmix(seed)
		sb.WriteString(words[seed%uint64(len(words))])
		if seed>>32%11 == 0 {
			sb.WriteString(". ")
		} else {
			sb.WriteByte(' ')
		}
	}
	return sb.String()[:n]
}

// rng is a small deterministic generator (splitmix64): the workloads must not change with the
// Go version, which math/rand does not promise.
type rng struct{ s uint64 }

func newRNG(seed, stream uint64) *rng {
	return &rng{s: Splitmix(seed ^ Splitmix(stream+0x5851F42D4C957F2D))}
}

func (r *rng) next() uint64 {
	r.s += 0x9E3779B97F4A7C15
	return Splitmix(r.s)
}

// intn returns a uniform int in [0, n).
func (r *rng) intn(n int) int { return int(r.next() % uint64(n)) }

// between returns a uniform int in [lo, hi].
func (r *rng) between(lohi [2]int) int { return lohi[0] + r.intn(lohi[1]-lohi[0]+1) }

// exp returns an exponential variate of mean 1.
func (r *rng) exp() float64 {
	u := (float64(r.next()>>11) + 0.5) / (1 << 53)
	return -math.Log(u)
}
