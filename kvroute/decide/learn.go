package decide

import (
	"math"
	"slices"
)

// Estimators of what the decision learns from the engines, fed with observations by the
// caller (kvroute's telemetry and llm_feedback in Caddy; a simulator in virtual time): speeds
// (Speed), a model's chars per token (CharsPerToken), and batch slots and mean output (Slots).
// None allocates.

// Constants of Speed.
const (
	// SpeedWindow is how many samples a speed is the median of, and MinSpeedSamples how many
	// it needs before it replaces the prior: one odd interval (a preemption, a request that
	// straddled two readings) moves a median of nine not at all.
	SpeedWindow     = 9
	MinSpeedSamples = 3
	// Speeds outside these bounds are no engine's (tokens per second): no sample.
	MinSpeed, MaxSpeed = 1.0, 1e7
)

// Speed is a speed learned as the median of its latest SpeedWindow samples, once there are
// MinSpeedSamples. The zero value is ready. Not safe for concurrent use, Value included: it
// sorts in the Speed's own scratch (to allocate nothing), so even two readers race. kvroute
// calls every method under its upstream's learn mutex and publishes the figures atomically
// for the request path; the simulator runs on one goroutine.
type Speed struct {
	w    [SpeedWindow]float64 // oldest first
	n    int
	sort [SpeedWindow]float64
}

// Observe takes in one sample; NaN or out of [MinSpeed, MaxSpeed] is none.
func (s *Speed) Observe(v float64) {
	if math.IsNaN(v) || v < MinSpeed || v > MaxSpeed {
		return
	}
	if s.n == SpeedWindow {
		copy(s.w[:], s.w[1:])
		s.n--
	}
	s.w[s.n] = v
	s.n++
}

// Value returns the median of the samples; false while there are fewer than MinSpeedSamples.
func (s *Speed) Value() (float64, bool) {
	if s.n < MinSpeedSamples {
		return 0, false
	}
	v := s.sort[:s.n]
	copy(v, s.w[:s.n])
	slices.Sort(v)
	if s.n%2 == 1 {
		return v[s.n/2], true
	}
	return (v[s.n/2-1] + v[s.n/2]) / 2, true
}

// Reset forgets every sample (a restarted engine).
func (s *Speed) Reset() { *s = Speed{} }

// Constants of CharsPerToken.
const (
	// MinCharsTokens and MinCharsIntervals are how much the totals need before a figure is
	// published: a request whose chars and tokens fall on different sides of an interval
	// stays in the totals, so they must be many times the largest request's.
	MinCharsTokens    = 20000
	MinCharsIntervals = 4
	// Chars per token outside these bounds are no tokenizer's on routing text.
	MinCharsPerToken, MaxCharsPerToken = 1.0, 16.0
	// MaxCharsBias bounds the error of a published figure that the requests in flight at the
	// edges of the intervals may cause.
	MaxCharsBias = 0.05
)

// CharsInterval is one interval of a model's traffic to one engine: the routing chars and
// requests the router sent, the chars of its requests that ended, and the prompt tokens and
// requests started the engine counted (Started < 0: the engine does not count them).
type CharsInterval struct {
	Chars, Ended, Tokens, Sent, Started float64
}

// CharsPerToken learns a model's chars of routing text per prompt token from the totals of
// every interval taken in (a tokenizer does not change; totals let a request counted by the
// router in one interval and by the engine in another even out). The engine counts a request
// between its decision and its end, so the chars taken are the midpoint of the chars sent and
// the chars ended, and a figure is published only while these differ by at most 1.8 ×
// MaxCharsBias of it, the totals reach MinCharsTokens over MinCharsIntervals, and the engine
// started no more requests than were sent (1.25 × + 2). The zero value is ready.
type CharsPerToken struct {
	sum CharsInterval
	n   int
}

// Add takes in one interval and returns the figure the totals make, ok when it may be
// published.
func (c *CharsPerToken) Add(iv CharsInterval) (value float64, ok bool) {
	c.sum.Chars += iv.Chars
	c.sum.Ended += iv.Ended
	c.sum.Tokens += iv.Tokens
	if iv.Started >= 0 {
		c.sum.Sent += iv.Sent
		c.sum.Started += iv.Started
	}
	c.n++
	s := c.sum
	mid := (s.Chars + s.Ended) / 2
	if s.Tokens < MinCharsTokens || c.n < MinCharsIntervals || mid <= 0 || s.Started > s.Sent*1.25+2 ||
		math.Abs(s.Chars-s.Ended) > 1.8*MaxCharsBias*mid {
		return 0, false
	}
	return min(MaxCharsPerToken, max(MinCharsPerToken, mid/s.Tokens)), true
}

// Constants of Outside.
const (
	// OutsideTolerance is how many more requests than were sent the engine may count as
	// started before that is evidence of traffic from elsewhere: a request the router took
	// back (a retry after the engine had started it) must not be enough.
	OutsideTolerance = 2
	// OutsideMemory is how many reading intervals evidence (or an abandoned request) keeps
	// the external load on.
	OutsideMemory = 30
)

// StartsKind says what an interval tells of the requests an engine started.
type StartsKind uint8

const (
	// StartsCounted: the interval's started requests are known (a TTFT or prefill-time count).
	StartsCounted StartsKind = iota
	// StartsBaseline: no interval (a first reading, a restart): a new baseline.
	StartsBaseline
	// StartsUncounted: an interval from an engine that does not count the requests it starts.
	StartsUncounted
)

// Outside tells whether an engine may lately hold requests its router does not count as its
// own in flight (traffic from elsewhere, or requests the router gave up on that the engine
// still runs), from the requests the engine started against those the router sent: of the
// router's requests it starts at most those sent, so started − sent, summed from a baseline
// at which the requests in flight count as not started, stays at or below 0; evidence is that
// sum rising more than OutsideTolerance above its highest earlier evidence. An engine that
// does not count its starts is taken as it is (true). The zero value is ready.
type Outside struct {
	excess, high float64
	sent         int64
	countsStarts bool
	at           int64 // the latest evidence (unix nanoseconds; 0: none)
}

// Observe takes in one reading at now (unix nanoseconds; interval its reading interval): the
// router's total of requests sent to the engine, its requests in flight there, the requests the
// engine started in the interval (kind StartsCounted), and when a request sent there last ended
// without an answer (0: never). It reports whether the external load counts.
func (o *Outside) Observe(now, interval, sent, inFlight int64, started float64, kind StartsKind, abandonedAt int64) bool {
	memory := int64(OutsideMemory) * interval
	recent := o.at != 0 && now-o.at < memory
	if abandonedAt != 0 && now-abandonedAt < memory {
		recent = true
	}
	if kind != StartsCounted {
		o.excess, o.high, o.sent = -float64(inFlight), 0, sent
		if kind == StartsUncounted {
			o.countsStarts = false
		}
		return !o.countsStarts || recent
	}
	o.countsStarts = true
	o.excess += started - float64(sent-o.sent)
	o.sent = sent
	if o.excess > o.high+OutsideTolerance {
		o.high = o.excess
		o.at, recent = now, true
	}
	return recent
}
