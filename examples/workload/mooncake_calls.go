package workload

import "strconv"

// MooncakeConfig says how to send a Mooncake trace.
type MooncakeConfig struct {
	// API is APICompletions (the prompt as is) or APIChat (the prompt as one user message).
	API   API
	Model string
	// MaxTokens caps each request's output tokens (the trace's output_length); 0: no cap.
	MaxTokens int
}

// MooncakeWorkload turns trace requests into a workload: one single-call session per request,
// sent at the request's timestamp in open loop, asking for its output_length tokens. Prompts
// are built from the hash ids when sent (see Call.Trace).
func MooncakeWorkload(reqs []Request, cfg MooncakeConfig) Workload {
	if cfg.API == "" {
		cfg.API = APICompletions
	}
	w := Workload{Name: "mooncake", Sessions: make([]Session, len(reqs))}
	for i := range reqs {
		out := max(1, reqs[i].OutputLength)
		if cfg.MaxTokens > 0 {
			out = min(out, cfg.MaxTokens)
		}
		w.Sessions[i] = Session{
			ID: "mooncake-" + strconv.Itoa(i),
			Calls: []Call{{
				API:       cfg.API,
				Model:     cfg.Model,
				MaxTokens: out,
				Trace:     &reqs[i],
				At:        reqs[i].Timestamp,
			}},
		}
	}
	return w
}
