package kvroute

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvroute/caddy-kvroute/kvroute/decide"
)

// The decision trace: at debug level, each decision writes one "decision" line with what the
// router believed of every candidate when it chose (its load, the batch slots and speeds it
// had learned, the prefill it counted queued there, its match, the engine's last reading and
// its age, the predicted cost) and Caddy's id of the request (http.request.uuid, which the
// access log and a `header_up X-Request-Id {http.request.uuid}` carry too), so that a run can
// be replayed decision by decision against what the engines held (the demo's -diagnose).
// Prompt text is never in it, and nothing is kept: the line goes to Caddy's logs, whose
// writers bound what they hold. Off at Caddy's default log level, where it costs one level
// check per decision.

// traceDecision writes the debug line of the decision res took on g's snapshot.
func (p *KVCacheAware) traceDecision(r *http.Request, req *llmRequest, g *gathered, res decide.Result) {
	ce := p.logger.Check(zapcore.DebugLevel, "decision")
	if ce == nil {
		return
	}
	c := &g.cands[res.Chosen]
	ratio := 0.0
	if req.Runes > 0 {
		ratio = float64(c.match) / float64(req.Runes)
	}
	id := ""
	// Caddy's server sets both; the uuid placeholder needs the access log's extra fields.
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok && r.Context().Value(caddyhttp.ExtraLogFieldsCtxKey) != nil {
		id, _ = repl.GetString("http.request.uuid")
	}
	ce.Write(
		zap.String("path", pathNames[res.Path]),
		zap.String("upstream", c.up.Dial),
		zap.Float64("match_ratio", ratio),
		zap.String("model", req.Model),
		zap.Int("prompt_chars", req.Runes),
		zap.String("format", req.Format.String()),
		zap.String("request_id", id),
		zap.String("decision", p.opts.decision),
		zap.Int64("prompt_tokens", g.estimate),
		zap.Float64("chars_per_token", g.snap.Request.CharsPerToken),
		zap.Int("max_tokens", req.MaxTokens),
		zap.Int64("at_ns", g.snap.Now),
		zap.Array("candidates", traceCandidates{g}),
	)
}

// traceCandidates writes a decision's candidates, as the decision saw them.
type traceCandidates struct{ g *gathered }

func (t traceCandidates) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for i := range t.g.cands {
		if err := enc.AppendObject(traceCandidate{c: &t.g.cands[i], d: &t.g.snap.Candidates[i], now: t.g.snap.Now}); err != nil {
			return err
		}
	}
	return nil
}

type traceCandidate struct {
	c   *candidate
	d   *decide.Candidate
	now int64
}

func (t traceCandidate) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	d := t.d
	enc.AddString("upstream", t.c.up.Dial)
	enc.AddInt64("load", d.Load)
	enc.AddInt("match_chars", d.Match)
	enc.AddInt64("queued_tokens", d.QueuedTokens)
	enc.AddInt64("prefill_tokens", d.Prefill)
	enc.AddInt64("slots", d.Slots)
	enc.AddFloat64("prefill_tokens_per_second", d.PrefillSpeed)
	enc.AddFloat64("answer_tokens_per_second", d.AnswerSpeed)
	enc.AddFloat64("decode_tokens_per_second", d.DecodeSpeed)
	enc.AddFloat64("mean_output_tokens", d.MeanOutput)
	if e := t.c.st.engine.Load(); e != nil {
		enc.AddFloat64("reading_age_ms", float64(t.now-e.at.UnixNano())/1e6)
		enc.AddBool("reading_stands", t.now <= e.until)
		enc.AddInt64("reading_waiting", e.waiting)
		enc.AddInt64("external_load", e.external)
	}
	enc.AddBool("session", d.Session)
	enc.AddInt64("uncached_tokens", d.Cost.Uncached)
	enc.AddFloat64("slot_wait_ms", finite(d.Cost.Slot)*1e3)
	enc.AddFloat64("predicted_ttft_ms", finite(d.Cost.TTFT)*1e3)
	return nil
}

// Compile-time checks that the trace's parts are zap marshalers.
var (
	_ zapcore.ArrayMarshaler  = traceCandidates{}
	_ zapcore.ObjectMarshaler = traceCandidate{}
)
