package fleetsim

import (
	"fmt"
	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
	"github.com/kvroute/caddy-kvroute/examples/workload"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
)

// BlockTokens is the engines' KV block size in the simulator (vLLM's default).
const BlockTokens = 16

// segment is a run of prompt tokens with an identity: two prompts share text and KV blocks
// exactly as far as they share leading segments (a segment cut short shares its head).
type segment struct {
	id     uint64
	tokens int
}

// Request is one request of a scenario and, once run, what happened to it.
type Request struct {
	ID      int
	Session string // the conversation's id, sent as a session header when the scenario has sessions
	Model   string // the model the request names (a LoRA adapter's name for adapter requests)
	Adapter string // the LoRA adapter it runs with, "" for the base model
	Text    string // the routing text the router reads
	Chars   int    // chars of Text
	// Tokens is the true prompt length (Chars / the scenario's true chars per token): what
	// the engine counts. A router estimates it from Chars (the oracle aside) and learns it
	// from answers (Usage.PromptTokens).
	Tokens int
	// Output is the request's max_tokens; the engine generates exactly that many.
	Output int
	// Tenant is the fairness id the request carries (what an auth plugin in front of Caddy
	// would name, an X-Tenant header): "" for one tenant. Priority is the name of its band
	// (an X-Priority header): "" for the first band.
	Tenant, Priority string
	// Class is the group the scorecard gives figures for ("light", "heavy", "interactive",
	// "batch"): "" in scenarios without classes.
	Class string

	sess   int            // index of its session
	hashes []uint64       // the engine's block hashes
	er     engine.Request // the request as its engine sees it (a run's copy)

	// Filled by a run.
	Arrival    time.Duration // sent by its client
	Routed     time.Duration // left the router's queue for an engine
	FirstToken time.Duration // 0 until the first token arrived
	Done       time.Duration // 0 until the answer ended
	Engine     int           // -1 until routed
	Cached     int           // prompt tokens the engine found cached
	Aborted    bool          // the engine dropped it (a restart)
	Shed       bool          // the router refused it

	engineFirst time.Duration // the first token at the engine (FirstToken is the client's)
	engineDone  time.Duration // the last token at the engine (Done is the client's)
}

// call is one request of a session before it is run.
type call struct {
	segs    []segment
	output  int
	at      time.Duration // earliest send time from the start (open loop)
	model   string
	adapter string
}

// session is a client's sequence of calls: a conversation, or one request of a trace. Its
// tenant, priority and class go on each of its requests.
type session struct {
	id                      string
	calls                   []call
	tenant, priority, class string
}

// texts holds the text of every segment at each whole length asked, shared by all runs.
var texts sync.Map // textKey -> string

type textKey struct {
	id   uint64
	full int // the text's whole length in chars
}

// segmentText returns n chars of segment id's text: a marker unique to the id, then words drawn
// from the id, the same in every run. The text of fewer chars is a prefix of the longer.
func segmentText(id uint64, chars int, full int) string {
	k := textKey{id, full}
	if v, ok := texts.Load(k); ok {
		return v.(string)[:chars]
	}
	var sb strings.Builder
	sb.Grow(full + 16)
	sb.WriteString("[")
	sb.WriteString(strconv.FormatUint(id%1e12, 36))
	sb.WriteString("] ")
	workload.AppendWords(&sb, id, full)
	t := sb.String()[:full]
	texts.Store(k, t)
	return t[:chars]
}

// build turns a call into a request at the scenario's true chars per token: the text, the
// token count and the chained block hashes (salted with the adapter, as vLLM's are).
func build(c call, ratio float64, full func(segment) int) *Request {
	r := &Request{Model: c.model, Adapter: c.adapter, Output: max(c.output, 1), Engine: -1}
	var sb strings.Builder
	h := uint64(0x9E3779B97F4A7C15)
	if c.adapter != "" {
		h ^= hashString(c.adapter)
	}
	pos := 0
	for _, s := range c.segs {
		chars := int(math.Round(float64(s.tokens) * ratio))
		sb.WriteString(segmentText(s.id, chars, int(math.Round(float64(full(s))*ratio))))
		// Fold the segment into the block hashes piece by piece.
		for off := 0; off < s.tokens; {
			k := min(s.tokens-off, BlockTokens-pos)
			h = splitmix(h ^ splitmix(s.id^uint64(off)<<40^uint64(k)<<20))
			off += k
			pos += k
			if pos == BlockTokens {
				r.hashes = append(r.hashes, h)
				pos = 0
			}
		}
		r.Tokens += s.tokens
	}
	r.Text = sb.String()
	r.Chars = len(r.Text)
	return r
}

func hashString(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

var splitmix = workload.Splitmix

// rng is a small deterministic generator (splitmix64): results must not change with the Go
// version, which math/rand does not promise.
type rng struct{ s uint64 }

func newRNG(seed uint64, stream string) *rng {
	return &rng{s: splitmix(seed ^ hashString(stream))}
}

func (r *rng) next() uint64 {
	r.s += 0x9E3779B97F4A7C15
	return splitmix(r.s)
}

// float returns a uniform float64 in (0, 1).
func (r *rng) float() float64 { return (float64(r.next()>>11) + 0.5) / (1 << 53) }

// intn returns a uniform int in [0, n).
func (r *rng) intn(n int) int { return int(r.next() % uint64(n)) }

// exp returns an exponential variate of mean 1.
func (r *rng) exp() float64 { return -math.Log(r.float()) }

// normal returns a standard normal variate (Box-Muller).
func (r *rng) normal() float64 {
	return math.Sqrt(-2*math.Log(r.float())) * math.Cos(2*math.Pi*r.float())
}

// lognormal returns a variate whose median is median and whose log has deviation sigma,
// clamped to [lo, hi].
func (r *rng) lognormal(median, sigma float64, lo, hi int) int {
	v := int(math.Round(median * math.Exp(sigma*r.normal())))
	return min(max(v, lo), hi)
}

// zipf returns an index in [0, n) with probability proportional to 1/(i+1)^s.
func (r *rng) zipf(n int, s float64) int {
	total := 0.0
	for i := range n {
		total += 1 / math.Pow(float64(i+1), s)
	}
	u := r.float() * total
	for i := range n {
		u -= 1 / math.Pow(float64(i+1), s)
		if u <= 0 {
			return i
		}
	}
	return n - 1
}

func segID(parts ...any) uint64 { return hashString(fmt.Sprint(parts...)) }
