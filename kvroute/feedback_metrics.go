package kvroute

import (
	"github.com/prometheus/client_golang/prometheus"
)

// feedbackCollector exports what the answers taught (llm_feedback), per upstream, at scrape
// time: predicted against reported cached tokens over the same answers (the tree's honesty),
// the tokens of prefix given up for balance, and how the answers were read.
type feedbackCollector struct{}

var (
	descPredictedCached = prometheus.NewDesc(ns+"_"+sub+"_predicted_cached_tokens_total",
		"Cached prompt tokens the router predicted (the chosen upstream's tree match, at the model's chars per token) for the answers whose engine reported cached tokens.", []string{"upstream"}, nil)
	descReportedCached = prometheus.NewDesc(ns+"_"+sub+"_reported_cached_tokens_total",
		"Cached prompt tokens the upstream's engine reported in those same answers' usage.", []string{"upstream"}, nil)
	descGivenUp = prometheus.NewDesc(ns+"_"+sub+"_balance_given_up_tokens_total",
		"Prompt tokens of cached prefix given up for balance: the best candidate's match minus the chosen upstream's, per decision llm_feedback watched.", []string{"upstream"}, nil)
	descAnswers = prometheus.NewDesc(ns+"_"+sub+"_answers_total",
		"Answers llm_feedback read, by what their usage held: none, prompt (tokens only), cached (cached tokens too).", []string{"upstream", "usage"}, nil)
	descAnswersIgnored = prometheus.NewDesc(ns+"_"+sub+"_answers_ignored_total",
		"Answers or parts of answers llm_feedback left out: status (not 2xx), encoded, content_type, cut (the client left first), invalid_usage (cached > prompt, negative, fractional, huge, NaN), unreadable (malformed, over the bound, cut mid-event).", []string{"upstream", "reason"}, nil)
	descTreeMisses = prometheus.NewDesc(ns+"_"+sub+"_tree_misses_total",
		"Answers reporting fewer cached tokens than the tree predicted by more than a KV block: corrected (its tree claims trimmed) or unconfirmed (an earlier request on the upstream was still in prefill).", []string{"upstream", "action"}, nil)
	descTrimmed = prometheus.NewDesc(ns+"_"+sub+"_tree_trimmed_chars_total",
		"Chars the prefix trees stopped claiming for the upstream after its answers reported them not cached.", []string{"upstream"}, nil)
	descTreeShare = prometheus.NewDesc(ns+"_"+sub+"_tree_share",
		"Share of its tree bound the upstream keeps: misses shrink it toward what its engine holds, hits let it grow back to 1.", []string{"upstream"}, nil)
)

func (*feedbackCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPredictedCached, descReportedCached, descGivenUp, descAnswers,
		descAnswersIgnored, descTreeMisses, descTrimmed, descTreeShare} {
		ch <- d
	}
}

func (*feedbackCollector) Collect(ch chan<- prometheus.Metric) {
	s := currentState()
	if s == nil {
		return
	}
	for _, addr := range s.upstreamAddrs() {
		v, ok := s.upstreams.Load(addr)
		if !ok {
			continue
		}
		f := &v.(*upstreamState).feedback
		answers := f.answers.Load()
		if answers == 0 && f.givenUp.load() == 0 && f.notRead[notReadStatus].Load() == 0 {
			continue // no llm_feedback in front of it
		}
		counter := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, append([]string{addr}, labels...)...)
		}
		counter(descPredictedCached, f.predicted.load())
		counter(descReportedCached, f.reported.load())
		counter(descGivenUp, f.givenUp.load())
		withUsage, withCached := f.withUsage.Load(), f.withCached.Load()
		counter(descAnswers, float64(answers-withUsage), "none")
		counter(descAnswers, float64(withUsage-withCached), "prompt")
		counter(descAnswers, float64(withCached), "cached")
		for i, name := range notReadNames {
			counter(descAnswersIgnored, float64(f.notRead[i].Load()), name)
		}
		counter(descAnswersIgnored, float64(f.lies.Load()), "invalid_usage")
		counter(descAnswersIgnored, float64(f.gaveUp.Load()), "unreadable")
		counter(descTreeMisses, float64(f.corrected.Load()), "corrected")
		counter(descTreeMisses, float64(f.unconfirmed.Load()), "unconfirmed")
		counter(descTrimmed, float64(f.trimmed.Load()))
		ch <- prometheus.MustNewConstMetric(descTreeShare, prometheus.GaugeValue, f.shareNow(), addr)
	}
}

// FeedbackStatus is what GET /kvroute/ shows of an upstream's answers (llm_feedback): whether
// they report usage and cached tokens (engines report cached tokens only when asked: vLLM
// --enable-prompt-tokens-details, SGLang --enable-cache-report; a stream carries usage only
// when the client asked or vLLM --enable-force-include-usage), and the tree's honesty.
type FeedbackStatus struct {
	Answers         uint64  `json:"answers"`
	WithUsage       uint64  `json:"with_usage"`
	WithCached      uint64  `json:"with_cached_tokens"`
	ReportsUsage    bool    `json:"reports_usage"`
	ReportsCached   bool    `json:"reports_cached_tokens"`
	PredictedCached float64 `json:"predicted_cached_tokens"`
	ReportedCached  float64 `json:"reported_cached_tokens"`
	GivenUp         float64 `json:"balance_given_up_tokens"`
	Misses          uint64  `json:"tree_misses"`
	Unconfirmed     uint64  `json:"tree_misses_unconfirmed"`
	TrimmedChars    int64   `json:"tree_trimmed_chars"`
	TreeShare       float64 `json:"tree_share"`
	InvalidUsage    uint64  `json:"invalid_usage"`
	Unreadable      uint64  `json:"unreadable"`
	ResponseIDs     uint64  `json:"response_ids_bound"`
}

// feedbackStatus is nil for an upstream no llm_feedback watched.
func (u *upstreamState) feedbackStatus() *FeedbackStatus {
	f := &u.feedback
	if f.answers.Load() == 0 && f.givenUp.load() == 0 {
		return nil
	}
	st := &FeedbackStatus{
		Answers: f.answers.Load(), WithUsage: f.withUsage.Load(), WithCached: f.withCached.Load(),
		PredictedCached: f.predicted.load(), ReportedCached: f.reported.load(), GivenUp: f.givenUp.load(),
		Misses: f.misses(), Unconfirmed: f.unconfirmed.Load(), TrimmedChars: f.trimmed.Load(),
		TreeShare: f.shareNow(), InvalidUsage: f.lies.Load(), Unreadable: f.gaveUp.Load(), ResponseIDs: f.respIDs.Load(),
	}
	st.ReportsUsage, st.ReportsCached = st.WithUsage > 0, st.WithCached > 0
	return st
}
