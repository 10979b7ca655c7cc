package kvroute

import (
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// What a decision tells about itself: the explain header (the chosen upstream only, to the
// client) and the ring of recent decisions (every candidate's predicted cost, to the admin).
// Other candidates' matches would tell a client where someone else's prefix lives, so they
// are never in the header; prompt text is in neither.

// explain sets the explain header on w: the decision's rule and path, the chosen upstream's
// predicted match (chars and tokens) and cost. w is nil when Select runs outside a handler.
func (p *KVCacheAware) explain(w http.ResponseWriter, req *llmRequest, c *candidate, path int) {
	if w == nil || p.opts.explainHeader == "" {
		return
	}
	var b [160]byte
	v := append(b[:0], "decision="...)
	v = append(v, p.opts.decision...)
	v = append(v, "; path="...)
	v = append(v, pathNames[path]...)
	v = append(v, "; match_chars="...)
	v = strconv.AppendInt(v, int64(c.match), 10)
	v = append(v, "; match_tokens="...)
	v = strconv.AppendInt(v, p.state.tokensOf(req.Model, int64(c.match)), 10)
	v = append(v, "; uncached_tokens="...)
	v = strconv.AppendInt(v, c.cost.uncached, 10)
	v = append(v, "; queued_tokens="...)
	v = strconv.AppendInt(v, c.cost.queued, 10)
	v = append(v, "; predicted_ttft_ms="...)
	v = strconv.AppendFloat(v, finite(c.cost.ttft)*1e3, 'f', 1, 64)
	if req.queued != notQueued {
		// It waited at the router for a slot (queue.go).
		v = append(v, "; queued_ms="...)
		v = strconv.AppendFloat(v, float64(req.waited)/1e6, 'f', 1, 64)
	}
	w.Header().Set(p.opts.explainHeader, string(v))
}

func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// recentDecisions is how many decisions GET /kvroute/ shows, and maxRecordedCandidates how
// many candidates of each.
const (
	recentDecisions       = 32
	maxRecordedCandidates = 16
)

// decisionRing holds the latest decision cost decisions with every candidate's prediction, in
// fixed storage: recording one copies a few hundred bytes and allocates nothing.
type decisionRing struct {
	mu   sync.Mutex
	next int
	n    int
	recs [recentDecisions]decisionRecord
}

type decisionRecord struct {
	at     int64
	model  string
	path   int
	chosen int
	n      int
	cands  [maxRecordedCandidates]candidateRecord
}

type candidateRecord struct {
	addr  string
	match int
	cost  costPrediction
}

// record keeps a decision of decision cost.
func (r *decisionRing) record(model string, cands []candidate, chosen, path int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := &r.recs[r.next]
	r.next = (r.next + 1) % recentDecisions
	r.n = min(r.n+1, recentDecisions)
	rec.at, rec.model, rec.path, rec.chosen = time.Now().UnixNano(), model, path, chosen
	rec.n = min(len(cands), maxRecordedCandidates)
	for i := range rec.n {
		rec.cands[i] = candidateRecord{addr: cands[i].up.Dial, match: cands[i].match, cost: cands[i].cost}
	}
}

// DecisionStatus is one recent decision in GET /kvroute/ (decision cost only).
type DecisionStatus struct {
	At         time.Time         `json:"at"`
	Model      string            `json:"model"`
	Path       string            `json:"path"`
	Chosen     string            `json:"chosen"`
	Candidates []CandidateStatus `json:"candidates"`
}

// CandidateStatus is one candidate's prediction in a recent decision.
type CandidateStatus struct {
	Upstream       string  `json:"upstream"`
	MatchChars     int     `json:"match_chars"`
	UncachedTokens int64   `json:"uncached_tokens"`
	QueuedTokens   int64   `json:"queued_tokens"`
	PrefillSpeed   float64 `json:"prefill_tokens_per_second"`
	SlotWait       float64 `json:"slot_wait_ms"` // of PredictedTTFT: the wait for a batch slot
	PredictedTTFT  float64 `json:"predicted_ttft_ms"`
	// Decode is the request's expected output at the engine's learned decode speed (after the
	// first token; 0 when not learned).
	Decode float64 `json:"decode_ms,omitempty"`
}

// snapshot returns the recorded decisions, newest first.
func (r *decisionRing) snapshot() []DecisionStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]DecisionStatus, 0, r.n)
	for k := 1; k <= r.n; k++ {
		rec := &r.recs[(r.next-k+recentDecisions)%recentDecisions]
		d := DecisionStatus{At: time.Unix(0, rec.at).UTC(), Model: rec.model, Path: pathNames[rec.path]}
		for i := range rec.n {
			c := &rec.cands[i]
			if i == rec.chosen {
				d.Chosen = c.addr
			}
			d.Candidates = append(d.Candidates, CandidateStatus{
				Upstream: c.addr, MatchChars: c.match, UncachedTokens: c.cost.uncached,
				QueuedTokens: c.cost.queued, PrefillSpeed: c.cost.speed, SlotWait: finite(c.cost.slot) * 1e3,
				PredictedTTFT: finite(c.cost.ttft) * 1e3, Decode: finite(c.cost.decode) * 1e3,
			})
		}
		out = append(out, d)
	}
	return out
}
