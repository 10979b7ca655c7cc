package engine

import "time"

// PredictTTFT returns when r would see its first token if it were submitted to the engine now
// and nothing else arrived: the scheduler run forward on copies of the queues. It is what the
// fleet simulator's greedy oracle compares across engines.
//
// Forward, each step schedules as Advance does (running requests first, then waiting ones in
// order, within MaxNumSeqs, the token budget, the KV room and MaxLoras) and lasts StepTime.
// Each waiting request's cached prefix is what the cache holds now (Lookup). It leaves out
// what the real run has and a copy of the queues does not: blocks evicted or cached by the
// requests ahead while r waits (so prefixes r shares with them), and which cached blocks a
// request's hit takes from the evictable ones (the KV room counts every unreferenced block as
// free). Runs of steps in which only decodes can run are taken in one jump, so a prediction
// costs about a step per request ahead, not a step per token.
func (e *Engine) PredictTTFT(r *Request, now time.Duration) time.Duration {
	const never = time.Duration(1<<62 - 1)
	type fseq struct {
		prefill int // prompt tokens left to compute
		output  int // output tokens left after the first
		blocks  int // blocks it frees when it ends (or takes when admitted)
		adapter string
		target  bool
	}
	bt := e.cfg.BlockTokens
	limited := e.cfg.CapacityBlocks > 0
	free := e.cfg.CapacityBlocks - e.cache.referenced - e.private
	var adapters map[string]int
	count := func(a string, d int) {
		if a == "" {
			return
		}
		if adapters == nil {
			adapters = make(map[string]int)
		}
		if adapters[a] += d; adapters[a] <= 0 {
			delete(adapters, a)
		}
	}
	run := make([]fseq, 0, e.cfg.MaxNumSeqs+1)
	t := now
	for _, s := range e.running {
		f := fseq{
			prefill: s.req.Tokens - s.computed,
			output:  s.req.Output - max(s.generated, 1),
			blocks:  e.blocksFor(s.req) - s.cached/bt,
			adapter: s.req.Adapter,
		}
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
			count(f.adapter, 1)
		} else {
			free += f.blocks
		}
	}
	if e.stepping {
		t = e.stepEnd
	}
	wait := make([]fseq, 0, len(e.waiting)+1)
	add := func(q *Request, target bool) bool {
		hit := e.lookupBlocks(q)
		need := e.blocksFor(q)
		if limited && need > e.cfg.CapacityBlocks {
			return false // dropped
		}
		wait = append(wait, fseq{prefill: q.Tokens - hit*bt, output: q.Output - 1, blocks: need - hit, adapter: q.Adapter, target: target})
		return true
	}
	for _, s := range e.waiting {
		add(s.req, false)
	}
	target := *r
	target.Tokens, target.Output = max(r.Tokens, 1), max(r.Output, 1)
	if !add(&target, true) {
		return never
	}
	sched := make([]int, 0, len(run)+len(wait))

	for range 1 << 20 {
		budget := e.cfg.MaxBatchTokens
		prefill, decodes, seqs, admitted := 0, 0, 0, 0
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
		for i := 0; i < len(wait) && budget > 0 && len(run) < e.cfg.MaxNumSeqs; {
			f := wait[i]
			if a := f.adapter; a != "" && e.cfg.MaxLoras > 0 && adapters[a] == 0 && len(adapters) >= e.cfg.MaxLoras {
				i++
				continue
			}
			if limited && f.blocks > free {
				break
			}
			free -= f.blocks
			count(f.adapter, 1)
			wait = append(wait[:i], wait[i+1:]...)
			n := min(f.prefill, budget)
			prefill += n
			budget -= n
			run = append(run, f)
			sched = append(sched, n)
			seqs++
			admitted++
		}
		if len(run) == 0 {
			return never // nothing runs and nothing can be admitted
		}
		if prefill == 0 && admitted == 0 && decodes == len(run) {
			// Only decodes until the first of them finishes: nothing changes before.
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
				} else {
					free += f.blocks
					count(f.adapter, -1)
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
				if f.prefill <= 0 && f.target {
					return t - now
				}
			} else {
				f.output -= sched[i]
			}
			if f.prefill > 0 || f.output > 0 {
				kept = append(kept, f)
			} else {
				free += f.blocks
				count(f.adapter, -1)
			}
		}
		run = kept
	}
	return never
}
