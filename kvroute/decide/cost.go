package decide

import (
	"math"

	"github.com/kvroute/caddy-kvroute/energy"
)

// decision cost (docs/decision.md): every candidate gets a predicted time to first token,
//
//	ttft = (queued + uncached) / speed + slot wait + adapter loads
//
// and steps 3 to 5 are one ranking by it (byCost); the session step keeps a session while
// its upstream is in the band and its prediction within ttft_slack of the best move's, a move
// priced at what it forfeits (keepsWarm).

// bestTTFT is the lowest predicted TTFT among the candidates within the balance band.
func (d *decision) bestTTFT() float64 {
	best := math.Inf(1)
	for i := range d.cands {
		if d.band.holds(d.cands[i].Load) {
			best = min(best, d.cands[i].Cost.TTFT)
		}
	}
	return best
}

// TTFTBound is the predicted TTFT within slack (ttft_slack) of best: objective energy
// chooses up to it, and a warm candidate keeps a request up to it (best then priced at what a
// move forfeits).
func TTFTBound(best, slack float64) float64 {
	return best + max(best*slack, minSlackSeconds)
}

// moveBound is the predicted TTFT up to which w, the candidate a request is warm on, keeps
// it: within ttft_slack of the best candidate in the band, each priced at its predicted TTFT
// plus what moving there forfeits.
func (d *decision) moveBound(w *Candidate) float64 {
	best := math.Inf(1)
	for i := range d.cands {
		if c := &d.cands[i]; d.band.holds(c.Load) {
			best = min(best, c.Cost.TTFT+forfeit(c, w))
		}
	}
	return TTFTBound(best, d.band.slack)
}

// keepsWarm reports whether w, the candidate a request is warm on, keeps it: its predicted
// TTFT within moveBound, and the time it costs beyond the best move in what is not prefill
// work (its slot wait, a slower decode) no longer than what that move costs.
func (d *decision) keepsWarm(w *Candidate) bool {
	if w.Cost.TTFT > d.moveBound(w) {
		return false
	}
	if w.Cost.Slot <= 0 && w.Cost.Slower <= 0 {
		return true
	}
	best, rank := -1, math.Inf(1)
	for i := range d.cands {
		if c := &d.cands[i]; c != w && d.band.holds(c.Load) && c.Cost.TTFT+forfeit(c, w)+c.Cost.Slower < rank {
			best, rank = i, c.Cost.TTFT+forfeit(c, w)+c.Cost.Slower
		}
	}
	if best < 0 {
		return true
	}
	c := &d.cands[best]
	move := c.Cost.TTFT + forfeit(c, w)
	extra := w.Cost.Slot - c.Cost.Slot + w.Cost.Slower - c.Cost.Slower
	return extra <= max(move-c.Cost.Slot, minSlackSeconds)
}

// forfeit is what sending the request to c instead of w gives away beyond c's predicted TTFT:
// the prompt tokens w holds and c does not, at c's speed, once more.
func forfeit(c, w *Candidate) float64 {
	if w == nil {
		return 0
	}
	return float64(max(0, c.Cost.Uncached-w.Cost.Uncached)) / c.Cost.Speed
}

// byCost is decision cost's choice among the candidates within the balance band: the warmest
// keeps the request while keepsWarm; past it, the lowest predicted TTFT plus what the move
// forfeits and a slower decode. With objective energy or carbon, the fewest predicted joules
// (grams) among those within ttft_slack of the best. Ties go to the less busy, then the one
// holding less, then at random. The path: prefix_hit when the choice holds the longest match,
// imbalance when a candidate held more, fallback when none held any.
func (d *decision) byCost() (int, Path) {
	var warmest *Candidate
	w := d.longest(true)
	if w >= 0 {
		warmest = &d.cands[w]
	}
	chosen := -1
	switch d.o.Objective {
	case Energy, Carbon:
		t := energy.Ranking{Rand: d.o.Rand}
		j := d.joulesOf()
		bound := TTFTBound(d.band.best, d.band.slack)
		for i := range d.cands {
			if c := &d.cands[i]; d.inBand(c) && c.Cost.TTFT <= bound {
				t.Offer(i, j.of(c)+j.forfeit(c, warmest), c.Cost.TTFT, busyness(c))
			}
		}
		chosen = t.Best()
	default:
		if warmest != nil && d.keepsWarm(warmest) {
			chosen = w
		}
	}
	if chosen < 0 {
		t := energy.Ranking{Rand: d.o.Rand}
		for i := range d.cands {
			if c := &d.cands[i]; d.inBand(c) {
				t.Offer(i, c.Cost.TTFT+forfeit(c, warmest)+c.Cost.Slower, busyness(c), float64(c.HeldChars)/DefaultCharsPerToken)
			}
		}
		chosen = max(0, t.Best()) // -1 only for NaN everywhere: any candidate is as good
	}
	warm := d.longest(false)
	switch {
	case warm < 0:
		return chosen, PathFallback
	case d.cands[chosen].Match == d.cands[warm].Match:
		return chosen, PathPrefixHit
	default:
		return chosen, PathImbalance
	}
}

// joules is the energy signal: per candidate, the predicted joules (or grams of CO2e) of the
// request there.
type joules struct {
	expected               float64 // output tokens
	ePrefill, eDecode, eCI float64 // the means of the annotated candidates, for those without
	carbon                 bool
}

// joulesOf prepares the energy signal. An upstream without an annotation counts as the mean of
// those that have one; with none, every candidate costs the same.
func (d *decision) joulesOf() joules {
	j := joules{expected: float64(d.o.ExpectedTokens), carbon: d.o.Objective == Carbon}
	if d.req.MaxTokens > 0 {
		j.expected = float64(d.req.MaxTokens)
	}
	var sp, sd, sc float64
	var np, nd, nc int
	for i := range d.cands {
		pr := d.cands[i].Profile
		if pr == nil {
			continue
		}
		if v := float64(prefillEnergy(pr)); v > 0 {
			sp, np = sp+v, np+1
		}
		if v := float64(pr.EnergyPerToken); v > 0 {
			sd, nd = sd+v, nd+1
		}
		if pr.CarbonIntensity > 0 {
			sc, nc = sc+pr.CarbonIntensity, nc+1
		}
	}
	j.ePrefill, j.eDecode, j.eCI = meanOr(sp, np, 0), meanOr(sd, nd, 0), meanOr(sc, nc, 1)
	return j
}

func (j *joules) of(c *Candidate) float64 {
	ep, ed, ci := j.perToken(c)
	return j.unit(float64(c.Cost.Uncached)*ep+j.expected*ed, ci)
}

// forfeit is what sending the request to c instead of w gives away, in joules (grams).
func (j *joules) forfeit(c, w *Candidate) float64 {
	if w == nil {
		return 0
	}
	ep, _, ci := j.perToken(c)
	return j.unit(float64(max(0, c.Cost.Uncached-w.Cost.Uncached))*ep, ci)
}

// perToken is c's prefill and decode energy per token and carbon intensity, the means of the
// annotated candidates for what its upstream block does not say.
func (j *joules) perToken(c *Candidate) (ep, ed, ci float64) {
	ep, ed, ci = j.ePrefill, j.eDecode, j.eCI
	if pr := c.Profile; pr != nil {
		if v := float64(prefillEnergy(pr)); v > 0 {
			ep = v
		}
		if v := float64(pr.EnergyPerToken); v > 0 {
			ed = v
		}
		if pr.CarbonIntensity > 0 {
			ci = pr.CarbonIntensity
		}
	}
	return ep, ed, ci
}

// unit is e joules in the objective's unit: joules, or grams of CO2e at ci.
func (j *joules) unit(e, ci float64) float64 {
	if j.carbon {
		return e * ci / 3.6e6 // J × gCO2e/kWh → g
	}
	return e
}

// prefillEnergy is an upstream's joules per prefilled token: prefill_energy_per_token, else
// energy_per_token.
func prefillEnergy(pr *energy.Profile) energy.Joules {
	if pr.PrefillEnergyPerToken > 0 {
		return pr.PrefillEnergyPerToken
	}
	return pr.EnergyPerToken
}

func meanOr(sum float64, n int, def float64) float64 {
	if n == 0 {
		return def
	}
	return sum / float64(n)
}
