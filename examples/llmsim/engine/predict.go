package engine

import "time"

// PredictTTFT returns when r would see its first token if it were submitted to the engine now
// and nothing else arrived: the scheduler run forward on copies of the queues. It is what the
// fleet simulator's greedy oracle compares across engines.
//
// Forward, each step schedules as Advance does (running requests first, then waiting ones in
// order, within MaxNumSeqs and the token budget) and lasts StepTime. Each waiting request's
// cached prefix is what the cache holds now (Lookup). It leaves out three things, all of which
// the real run has: blocks evicted or cached by the queue ahead while r waits, the KV-capacity
// and LoRA limits on admission, and prefixes r shares with requests queued ahead of it. Runs
// of steps in which only decodes can run are taken in one jump, so a prediction costs about a
// step per request ahead, not a step per token.
func (e *Engine) PredictTTFT(r *Request, now time.Duration) time.Duration {
	type fseq struct {
		prefill int // prompt tokens left to compute
		output  int // output tokens left after the first
		target  bool
	}
	bt := e.cfg.BlockTokens
	run := make([]fseq, 0, e.cfg.MaxNumSeqs+1)
	t := now
	for _, s := range e.running {
		f := fseq{prefill: s.req.Tokens - s.computed, output: s.req.Output - max(s.generated, 1)}
		if e.stepping {
			// Apply the running step at its end.
			if f.prefill > 0 {
				f.prefill -= s.sched
			} else {
				f.output -= s.sched
			}
		}
		if f.prefill > 0 || f.output > 0 {
			run = append(run, f)
		}
	}
	if e.stepping {
		t = e.stepEnd
	}
	wait := make([]fseq, 0, len(e.waiting)+1)
	for _, s := range e.waiting {
		wait = append(wait, fseq{prefill: s.req.Tokens - e.lookupBlocks(s.req)*bt, output: s.req.Output - 1})
	}
	wait = append(wait, fseq{prefill: max(r.Tokens, 1) - e.lookupBlocks(r)*bt, output: max(r.Output, 1) - 1, target: true})
	sched := make([]int, 0, len(run)+len(wait))

	for range 1 << 20 {
		budget := e.cfg.MaxBatchTokens
		prefill, decodes, seqs := 0, 0, 0
		sched = sched[:0]
		for i := range run {
			n := 0
			if run[i].prefill > 0 {
				n = min(run[i].prefill, budget)
				prefill += n
			} else if budget > 0 {
				n = 1
				decodes++
			}
			budget -= n
			sched = append(sched, n)
			if n > 0 {
				seqs++
			}
		}
		for len(wait) > 0 && budget > 0 && len(run) < e.cfg.MaxNumSeqs {
			f := wait[0]
			wait = wait[1:]
			n := min(f.prefill, budget)
			prefill += n
			budget -= n
			run = append(run, f)
			sched = append(sched, n)
			seqs++
		}
		if prefill == 0 && decodes == len(run) && (len(wait) == 0 || len(run) >= e.cfg.MaxNumSeqs) {
			// Only decodes until the first of them finishes.
			k := run[0].output
			for i := range run {
				k = min(k, run[i].output)
			}
			k = max(k, 1)
			t += time.Duration(k) * e.cfg.StepTime(0, len(run))
			kept := run[:0]
			for _, f := range run {
				if f.output -= k; f.output > 0 {
					kept = append(kept, f)
				}
			}
			run = kept
			continue
		}
		t += e.cfg.StepTime(prefill, seqs)
		kept := run[:0]
		for i, f := range run {
			if f.prefill > 0 {
				f.prefill -= sched[i]
				if f.prefill <= 0 {
					if f.target {
						return t - now
					}
				}
			} else {
				f.output -= sched[i]
			}
			if f.prefill > 0 || f.output > 0 {
				kept = append(kept, f)
			}
		}
		run = kept
	}
	return time.Duration(1<<62 - 1)
}
