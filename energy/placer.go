package energy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
)

// Strategy is how a Placer chooses among candidates. The zero value is
// Joule.
type Strategy uint8

// The placement strategies, as named in the Caddyfile's fallback option.
const (
	// Joule picks the lowest projected energy, then the least busy.
	Joule Strategy = iota
	// Carbon picks the lowest projected emissions (energy times grid
	// carbon intensity), then the least busy.
	Carbon
	// LeastBusy picks the lowest Busyness.
	LeastBusy
	// RoundRobin rotates over the candidates.
	RoundRobin
	// Random picks uniformly at random.
	Random
)

var strategyNames = [...]string{
	Joule:      "joule",
	Carbon:     "carbon",
	LeastBusy:  "least_busy",
	RoundRobin: "round_robin",
	Random:     "random",
}

// ParseStrategy returns the strategy named s: "joule", "carbon",
// "least_busy", "round_robin" or "random".
func ParseStrategy(s string) (Strategy, error) {
	for i, name := range strategyNames {
		if name == s {
			return Strategy(i), nil
		}
	}
	return 0, fmt.Errorf("unknown placement strategy %q (want joule, carbon, least_busy, round_robin or random)", s)
}

// String returns the strategy's Caddyfile name.
func (s Strategy) String() string {
	if int(s) < len(strategyNames) {
		return strategyNames[s]
	}
	return fmt.Sprintf("strategy(%d)", uint8(s))
}

// MarshalText encodes s by name, so that JSON configs read "joule".
func (s Strategy) MarshalText() ([]byte, error) {
	if int(s) >= len(strategyNames) {
		return nil, fmt.Errorf("unknown placement strategy %d", uint8(s))
	}
	return []byte(strategyNames[s]), nil
}

// UnmarshalText decodes a strategy name, as ParseStrategy does.
func (s *Strategy) UnmarshalText(b []byte) error {
	v, err := ParseStrategy(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Candidate is an upstream that may take a request.
type Candidate struct {
	// Profile is what is known about the upstream; nil means nothing.
	Profile *Profile
	// InFlight counts the requests in flight on the upstream, as the
	// router counts them at decision time.
	InFlight int
	// QueuedTokens is the estimated prompt tokens of those requests.
	QueuedTokens int64
	// CachedTokens is the router's estimate of the prompt tokens the upstream holds in KV cache.
	// Among candidates tied on cost and busyness, a cold request goes to the one holding the
	// least: it has the most free cache and no prefixes to protect, and new prefix groups
	// spread over the fleet instead of stacking on whichever upstream a coin picked.
	CachedTokens int64
}

// Busyness scores how loaded an upstream is: 4 per request in flight plus
// 0.1 per queued prompt token, so that one request weighs as much as a
// 40-token prompt and long prompts count for what they cost to prefill.
func Busyness(inFlight int, queuedTokens int64) float64 {
	return 4*float64(inFlight) + 0.1*float64(queuedTokens)
}

// joulesPerKWh converts joules times gCO2e/kWh into gCO2e.
const joulesPerKWh = 3.6e6

// Placer places requests that have no cache affinity. It is safe for
// concurrent use. The zero value places with Joule.
type Placer struct {
	strategy Strategy
	next     atomic.Uint64 // round_robin position
}

// NewPlacer returns a Placer for strategy s. Round robin starts at a
// random position, so that reloads and several policies do not all send
// their first request to the first upstream.
func NewPlacer(s Strategy) *Placer {
	p := &Placer{strategy: s}
	p.next.Store(rand.Uint64())
	return p
}

// Strategy returns the placer's strategy.
func (p *Placer) Strategy() Strategy { return p.strategy }

// Place returns the index in cands of the candidate that should take a
// request expected to generate expectedTokens tokens, or -1 when cands is
// empty. A candidate without energy_per_token (or, for Carbon, without
// carbon_intensity) counts as the mean of the candidates that have it;
// when none has either, Joule and Carbon place by busyness. Candidates
// that tie are chosen among uniformly at random. An unknown strategy
// places like LeastBusy.
func (p *Placer) Place(cands []Candidate, expectedTokens int) int {
	return p.PlaceRand(cands, expectedTokens, nil)
}

// PlaceRand is Place with rng as the source of its random choices (ties,
// Random); nil is the global source. A simulator passes a seeded one to
// place the same way on every run; rng is not safe for concurrent use.
func (p *Placer) PlaceRand(cands []Candidate, expectedTokens int, rng *rand.Rand) int {
	switch len(cands) {
	case 0:
		return -1
	case 1:
		return 0
	}
	switch p.strategy {
	case Joule:
		return placeByCost(cands, expectedTokens, false, rng)
	case Carbon:
		return placeByCost(cands, expectedTokens, true, rng)
	case RoundRobin:
		return int(p.next.Add(1) % uint64(len(cands)))
	case Random:
		return intN(rng, len(cands))
	default:
		return IdlestRand(cands, rng)
	}
}

func intN(rng *rand.Rand, n int) int {
	if rng == nil {
		return rand.IntN(n)
	}
	return rng.IntN(n)
}

// placeByCost picks the lowest projected joules (or grams of CO2e when
// carbon is set), then the lowest busyness.
func placeByCost(cands []Candidate, expectedTokens int, carbon bool, rng *rand.Rand) int {
	var eSum, ciSum float64
	var eN, ciN int
	for i := range cands {
		pr := cands[i].Profile
		if pr == nil {
			continue
		}
		if e := float64(pr.EnergyPerToken); known(e) {
			eSum += e
			eN++
		}
		if carbon && known(pr.CarbonIntensity) {
			ciSum += pr.CarbonIntensity
			ciN++
		}
	}
	if eN == 0 && ciN == 0 {
		return IdlestRand(cands, rng)
	}
	// An unknown factor with no annotated candidate is the same for all,
	// so 1 keeps the other factor's ranking.
	eMean, ciMean := 1.0, 1.0
	if eN > 0 {
		eMean = eSum / float64(eN)
	}
	if ciN > 0 {
		ciMean = ciSum / float64(ciN)
	}
	// The ranking does not depend on the token count, but the projection
	// is kept in real units; a request that states no tokens still costs one.
	tokens := float64(max(expectedTokens, 1))

	t := Ranking{Rand: rng}
	for i := range cands {
		c := &cands[i]
		e, ci := eMean, ciMean
		if pr := c.Profile; pr != nil {
			if v := float64(pr.EnergyPerToken); known(v) {
				e = v
			}
			if known(pr.CarbonIntensity) {
				ci = pr.CarbonIntensity
			}
		}
		cost := e * tokens
		if carbon {
			cost = cost * ci / joulesPerKWh
		}
		t.Offer(i, cost, Busyness(c.InFlight, c.QueuedTokens), float64(c.CachedTokens))
	}
	return t.Best()
}

// Idlest returns the index of the candidate with the lowest busyness (then
// the least cached text, then at random), or -1 when cands is empty.
func Idlest(cands []Candidate) int { return IdlestRand(cands, nil) }

// IdlestRand is Idlest with rng as the source of its random choices (nil:
// the global source).
func IdlestRand(cands []Candidate, rng *rand.Rand) int {
	t := Ranking{Rand: rng}
	for i := range cands {
		t.Offer(i, Busyness(cands[i].InFlight, cands[i].QueuedTokens), float64(cands[i].CachedTokens), 0)
	}
	return t.Best()
}

// Ranking finds the minimum of (primary, secondary, tertiary) keys offered
// one candidate at a time, choosing uniformly among tied candidates by
// reservoir sampling: the k-th tied candidate replaces the choice with
// probability 1/k. Ties never go to the first candidate by default, and it
// needs no memory per candidate, so ranking does not allocate. The zero
// value is ready to use.
type Ranking struct {
	// Rand is the source of the random choices among ties; nil is the
	// global source (safe for concurrent use; a *rand.Rand is not).
	Rand                         *rand.Rand
	best                         int
	ties                         int
	primary, secondary, tertiary float64
}

// Best returns the index of the best candidate offered, or -1 when none was.
func (t *Ranking) Best() int {
	if t.ties == 0 {
		return -1
	}
	return t.best
}

// Offer considers candidate i with the given keys; lower keys are better,
// compared in order.
func (t *Ranking) Offer(i int, primary, secondary, tertiary float64) {
	if t.ties > 0 {
		c := compare(primary, t.primary)
		if c == 0 {
			c = compare(secondary, t.secondary)
		}
		if c == 0 {
			c = compare(tertiary, t.tertiary)
		}
		if c > 0 {
			return
		}
		if c == 0 {
			t.ties++
			if intN(t.Rand, t.ties) == 0 {
				t.best = i
			}
			return
		}
	}
	t.best, t.ties, t.primary, t.secondary, t.tertiary = i, 1, primary, secondary, tertiary
}

// tieEpsilon is the relative difference under which two scores are equal:
// scores computed from equal inputs by different paths (a mean, a product)
// differ in the last bits.
const tieEpsilon = 1e-9

func compare(a, b float64) int {
	d := a - b
	if math.Abs(d) <= tieEpsilon*max(math.Abs(a), math.Abs(b)) {
		return 0
	}
	if d < 0 {
		return -1
	}
	return 1
}
