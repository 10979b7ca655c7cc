package workload

import (
	"fmt"
	"hash/fnv"
	"time"
)

// Class is one class of clients of a two-class workload: its name (the demo's and the
// scorecard's class) and the headers each of its calls carries, such as X-Tenant: light or
// X-Priority: batch, which a router's flow control reads.
type Class struct {
	Name    string
	Headers map[string]string
}

// TwoClass is two classes of chat conversations sent together, each with its own system
// prompts and conversations (its own seed), as the fleet simulator's TwoClassWorkload
// (examples/fleetsim): the first class's requests/(1+k) requests at cfg's pace (conversations
// start at cfg.Rate per second), the second k times as many at k times the pace, its times
// scaled to end when the first's do, so that the second sends k times the first's requests and
// tokens (the same shapes) over the same span. alone keeps the first class only, with requests
// requests: sent at the same time scale, its calls are the mix's first class, call for call and
// time for time. Sessions of the first class come first; each session's ID starts with its
// class's name, and every call carries its class's headers.
func TwoClass(cfg ChatConfig, requests, k int, alone bool, first, second Class) Workload {
	cfg = cfg.withDefaults()
	nFirst := requests
	if !alone {
		nFirst = requests / (1 + k)
	}
	c := cfg
	c.Conversations = max(1, nFirst/c.Turns)
	out := ChatWorkload(c)
	out.Name = first.Name
	label(out.Sessions, first)
	if alone {
		return out
	}
	out.Name = first.Name + "+" + second.Name
	c.Conversations = max(1, (requests-nFirst)/c.Turns)
	h := fnv.New64a()
	h.Write([]byte(second.Name))
	c.Seed = Splitmix(cfg.Seed ^ h.Sum64())
	c.Rate *= float64(max(k, 1))
	more := ChatWorkload(c)
	span, spanMore := out.Span(), more.Span()
	for _, s := range more.Sessions {
		for j := range s.Calls {
			if spanMore > 0 {
				s.Calls[j].At = time.Duration(float64(s.Calls[j].At) * float64(span) / float64(spanMore))
			}
		}
	}
	label(more.Sessions, second)
	out.Sessions = append(out.Sessions, more.Sessions...)
	return out
}

// label puts class on sessions: its name in the ID and the Class field, its headers on every
// call (beside the call's own).
func label(sessions []Session, class Class) {
	for i := range sessions {
		s := &sessions[i]
		s.ID = fmt.Sprintf("%s-%s", class.Name, s.ID)
		s.Class = class.Name
		for j := range s.Calls {
			h := make(map[string]string, len(s.Calls[j].Headers)+len(class.Headers))
			for k, v := range s.Calls[j].Headers {
				h[k] = v
			}
			for k, v := range class.Headers {
				h[k] = v
			}
			s.Calls[j].Headers = h
		}
	}
}

// Span is the time of the workload's last call (its At), from the start.
func (w Workload) Span() time.Duration {
	var last time.Duration
	for _, s := range w.Sessions {
		for _, c := range s.Calls {
			last = max(last, c.At)
		}
	}
	return last
}

// Tokens returns the workload's prompt and output tokens by the project's estimate (chars /
// CharsPerToken, max_tokens), for an estimate of what a fleet serves of it.
func (w Workload) Tokens() (prompt, output int64) {
	for _, s := range w.Sessions {
		for _, c := range s.Calls {
			c = c.Resolve()
			chars := len(c.Prompt)
			for _, m := range c.Messages {
				chars += len(m.Content)
			}
			prompt += int64(chars / CharsPerToken)
			output += int64(c.MaxTokens)
		}
	}
	return prompt, output
}
