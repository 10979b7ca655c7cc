package kvroute

// The decision replay: scenes that drive Select through the policy's own test scaffolding
// (no Caddy server: newPolicy, held requests, learned figures and engine readings set on the
// state) and record, per decision, the request, the upstream chosen, the path and the costs
// the decision predicted. testdata/replay.golden holds the record the code wrote before the
// decision moved into kvroute/decide (issue 33); TestDecisionReplay runs the scenes again and
// asserts the same choices, path and predictions, step by step.
//
// The scenes avoid ties (the decision breaks them at random): upstreams differ in their
// priors, energy and what they hold. Regenerate with -update-replay only for a change meant to
// change decisions, and say so in the commit.

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/kvroute/caddy-kvroute/energy"
)

var updateReplay = flag.Bool("update-replay", false, "rewrite testdata/replay.golden from the current code")

const replayGolden = "testdata/replay.golden"

// replayReq is one request of a scene.
type replayReq struct {
	model     string
	prompt    string
	session   string // X-Session-ID ("": none)
	cacheKey  string // the body's prompt_cache_key
	maxTokens int
	hold      bool // stays in flight until the scene ends
	prevResp  string
	cookie    string // the session cookie to present (a value an earlier answer set)
}

// replay runs one scene and writes its record.
type replayRun struct {
	t      *testing.T
	p      *KVCacheAware
	out    *strings.Builder
	step   int
	held   []context.CancelFunc
	scene  string
	cookie string // the latest session cookie an answer set ("name=value")
}

func (rp *replayRun) body(q replayReq) (string, string) {
	model := q.model
	if model == "" {
		model = "m"
	}
	if q.prevResp != "" {
		return "/v1/responses", fmt.Sprintf(`{"model":%q,"input":%q,"previous_response_id":%q,"stream":true}`, model, q.prompt, q.prevResp)
	}
	extra := ""
	if q.maxTokens > 0 {
		extra += fmt.Sprintf(`,"max_tokens":%d`, q.maxTokens)
	}
	if q.cacheKey != "" {
		extra += fmt.Sprintf(`,"prompt_cache_key":%q`, q.cacheKey)
	}
	// Streamed: with feedback (feedbackFor) a streamed request's queued prefill counts until
	// its first token or its end, whatever the wall clock says, as every request's did when
	// the golden file was recorded; a non-streamed one's now leaves at its predicted first
	// token (issue 32), a wall-clock deadline that a loaded machine can pass mid-scene.
	return "/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"stream":true%s}`, model, q.prompt, extra)
}

func (rp *replayRun) request(q replayReq) (*http.Request, context.CancelFunc) {
	path, body := rp.body(q)
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	if q.session != "" {
		r.Header.Set("X-Session-ID", q.session)
	}
	if q.cookie != "" {
		r.Header.Set("Cookie", q.cookie)
	}
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
	return r.WithContext(ctx), cancel
}

// ask runs one decision and records it.
func (rp *replayRun) ask(label string, pool reverseproxy.UpstreamPool, q replayReq) string {
	r, cancel := rp.request(q)
	return rp.decide(label, pool, r, cancel, q)
}

// retry runs the request of an earlier ask again (Caddy's retry of a failed attempt), on pool.
func (rp *replayRun) retry(label string, pool reverseproxy.UpstreamPool, r *http.Request, q replayReq) string {
	return rp.decide(label, pool, r, nil, q)
}

func (rp *replayRun) decide(label string, pool reverseproxy.UpstreamPool, r *http.Request, cancel context.CancelFunc, q replayReq) string {
	rp.t.Helper()
	rp.step++
	p := rp.p
	before := rp.counts(pool)
	ring := rp.ringLen()
	w := httptest.NewRecorder()
	up := p.Select(pool, r, w)
	chosen, path := "-", "no_candidate"
	if up != nil {
		chosen = up.Dial
		after := rp.counts(pool)
		for k, n := range after {
			if n != before[k] {
				path = pathNames[k[1].(int)]
			}
		}
	}
	fmt.Fprintf(rp.out, "%s %02d %-28s session=%q chars=%d max_tokens=%d -> %s path=%s\n", rp.scene, rp.step, label, q.session+q.cacheKey, len([]rune(q.prompt)), q.maxTokens, chosen, path)
	if h := w.Header().Get("X-Why"); h != "" {
		fmt.Fprintf(rp.out, "\texplain %s\n", h)
	}
	if c := w.Header().Get("Set-Cookie"); c != "" {
		rp.cookie, _, _ = strings.Cut(c, ";")
		fmt.Fprintf(rp.out, "\tcookie set (presented=%v)\n", q.cookie != "")
	}
	if rp.ringLen() != ring {
		d := p.state.recent.snapshot()[0]
		fmt.Fprintf(rp.out, "\tcost path=%s chosen=%s\n", d.Path, d.Chosen)
		for _, c := range d.Candidates {
			fmt.Fprintf(rp.out, "\t\t%s match=%d uncached=%d queued=%d speed=%.6g slot_ms=%.6g ttft_ms=%.6g decode_ms=%.6g\n",
				c.Upstream, c.MatchChars, c.UncachedTokens, c.QueuedTokens, c.PrefillSpeed, c.SlotWait, c.PredictedTTFT, c.Decode)
		}
	}
	if cancel != nil {
		if q.hold {
			rp.held = append(rp.held, cancel)
		} else {
			cancel()
			if up != nil {
				rp.waitReleased(r)
			}
		}
	}
	return chosen
}

// waitReleased waits for the ended request's in-flight count to go (a context.AfterFunc).
func (rp *replayRun) waitReleased(r *http.Request) {
	lr := requestFor(r, DefaultMaxBody)
	deadline := time.Now().Add(10 * time.Second)
	for lr.pick.Load() != nil {
		if time.Now().After(deadline) {
			rp.t.Fatalf("%s step %d: the ended request still counts in flight", rp.scene, rp.step)
		}
		runtime.Gosched()
	}
}

func (rp *replayRun) ringLen() int {
	rp.p.state.recent.mu.Lock()
	defer rp.p.state.recent.mu.Unlock()
	return rp.p.state.recent.n*1000 + rp.p.state.recent.next
}

func (rp *replayRun) counts(pool reverseproxy.UpstreamPool) map[[2]any]uint64 {
	m := map[[2]any]uint64{}
	for _, u := range pool {
		st := rp.p.state.upstream(u.Dial)
		for k := range numPaths {
			m[[2]any{u.Dial, k}] = st.decisions[k].Load()
		}
	}
	return m
}

// endHeld ends every held request of the scene and waits until none counts in flight.
func (rp *replayRun) endHeld(pool reverseproxy.UpstreamPool) {
	for _, c := range rp.held {
		c()
	}
	rp.held = nil
	deadline := time.Now().Add(10 * time.Second)
	for _, u := range pool {
		for rp.p.state.upstream(u.Dial).inFlight.Load() != 0 {
			if time.Now().After(deadline) {
				rp.t.Fatalf("%s: requests still in flight on %s", rp.scene, u.Dial)
			}
			runtime.Gosched()
		}
	}
	fmt.Fprintf(rp.out, "%s    (held requests ended)\n", rp.scene)
}

// warm sends each upstream of pool, alone, a distinct cold prompt of (i+1)×size chars: the
// upstreams then hold different amounts (no ties between cold candidates).
func (rp *replayRun) warm(pool reverseproxy.UpstreamPool, size int) {
	for i, u := range pool {
		prompt := fmt.Sprintf("warm-%d %s ", i, coldPrompt(900+i)) + strings.Repeat(fmt.Sprintf("filler %d ", i), (i+1)*size/9)
		rp.ask("warm "+u.Dial, newPool(u.Dial), replayReq{prompt: prompt})
	}
}

// feedbackFor makes every upstream of pool report first tokens (llm_feedback): a held
// request's queued prefill then counts until it ends, whatever the wall clock says.
func (rp *replayRun) feedbackFor(pool reverseproxy.UpstreamPool) {
	for _, u := range pool {
		rp.p.state.upstream(u.Dial).firstTokens.Store(true)
	}
}

// reading sets an engine reading of addr that stands for the rest of the scene: its external
// load and its waiting queue.
func (rp *replayRun) reading(addr string, external, waiting int64) {
	rp.p.state.upstream(addr).engine.Store(&engineView{at: time.Now(), until: time.Now().Add(time.Hour).UnixNano(), external: external, raw: external, waiting: waiting, outside: external > 0})
	fmt.Fprintf(rp.out, "%s    reading %s external=%d waiting=%d\n", rp.scene, addr, external, waiting)
}

// learned sets what addr's engine taught.
func (rp *replayRun) learned(addr string, f learnedFigures) {
	rp.p.state.upstream(addr).learn.figures.Store(&f)
	fmt.Fprintf(rp.out, "%s    learned %s prefill=%v/%v decode=%v/%v slots=%d mean_output=%v\n", rp.scene, addr,
		f.PrefillTokensPerSecond, f.PrefillLearned, f.DecodeTokensPerSecond, f.DecodeLearned, f.Slots, f.MeanOutputTokens)
}

// long returns a prompt of about n chars starting with head (a distinct prefix per head).
func long(head string, n int) string {
	s := head + " "
	return s + strings.Repeat("and the text goes on ", max(0, n-len(s))/21+1)
}

var replayPool4 = []string{"a:1", "b:1", "c:1", "d:1"}

type replayScene struct {
	name string
	opts func(*KVCacheAware)
	ups  map[string]energy.Profile
	run  func(rp *replayRun, pool reverseproxy.UpstreamPool)
}

func f64(v float64) *float64 { return &v }
func intp(v int) *int        { return &v }

// sessionsAndImbalance is one workload for decision thresholds under each fallback: warm-up,
// cold requests, prefix hits, a session in band then out of band, imbalance.
func sessionsAndImbalance(rp *replayRun, pool reverseproxy.UpstreamPool) {
	rp.feedbackFor(pool)
	rp.warm(pool, 300)
	sys := long("You are a helpful assistant, system prompt one.", 2000)
	for i := range 3 {
		rp.ask(fmt.Sprintf("cold %d", i), pool, replayReq{prompt: long(coldPrompt(i), 500+100*i), maxTokens: 100 * i})
	}
	home := rp.ask("conversation turn 1", pool, replayReq{prompt: sys + "question one", session: "s1"})
	rp.ask("conversation turn 2", pool, replayReq{prompt: sys + "question one, answer, question two", session: "s1"})
	rp.ask("prefix hit, no session", pool, replayReq{prompt: sys + "another question entirely"})
	rp.ask("low match", pool, replayReq{prompt: sys[:100] + long(coldPrompt(77), 3000)})
	// Load the session's upstream out of band.
	for i := range 6 {
		rp.ask(fmt.Sprintf("hold on %s %d", home, i), newPool(home), replayReq{prompt: long(coldPrompt(100+i), 400), hold: true})
	}
	rp.ask("session out of band", pool, replayReq{prompt: sys + "question one, answer, question two, three", session: "s1"})
	rp.ask("prefix out of band", pool, replayReq{prompt: sys + "yet another question"})
	rp.ask("cold under imbalance", pool, replayReq{prompt: long(coldPrompt(200), 800)})
	rp.ask("body cache key", pool, replayReq{prompt: long(coldPrompt(201), 900), cacheKey: "k1", hold: true})
	rp.ask("body cache key again", pool, replayReq{prompt: long(coldPrompt(201), 900) + " more", cacheKey: "k1"})
	rp.endHeld(pool)
	rp.ask("session back in band", pool, replayReq{prompt: sys + "question one, answer, question two, three, four", session: "s1"})
	rp.ask("other model", pool, replayReq{model: "n", prompt: sys + "question one"})
	for i := range 9 {
		rp.ask(fmt.Sprintf("burst %d", i), pool, replayReq{prompt: long(coldPrompt(300+i), 600+37*i), hold: true})
	}
	rp.ask("after burst, warm", pool, replayReq{prompt: sys + "after the burst"})
	rp.endHeld(pool)
}

// costWorkload is one workload for decision cost under each objective: distinct prefill
// priors, a warm upstream that keeps then loses requests to its queue, a session that stays,
// leaves and follows its cache, learned speeds, slots and engine readings.
func costWorkload(rp *replayRun, pool reverseproxy.UpstreamPool) {
	rp.feedbackFor(pool)
	rp.warm(pool, 300)
	prefix := long("You are a careful assistant, prefix two.", 8000)
	for i := range 3 {
		rp.ask(fmt.Sprintf("cold %d", i), pool, replayReq{prompt: long(coldPrompt(10+i), 2000+1000*i), maxTokens: 50 + 100*i, hold: i == 0})
	}
	w := rp.ask("warm up", pool, replayReq{prompt: prefix + "warm up"})
	for i := range 6 {
		rp.ask(fmt.Sprintf("warm request %d", i), pool, replayReq{prompt: prefix + fmt.Sprintf("%03d %s", i, strings.Repeat("question ", 44)), hold: true})
	}
	for i := range 3 {
		rp.ask(fmt.Sprintf("queue on %s %d", w, i), newPool(w), replayReq{prompt: long(coldPrompt(40+i), 10000), hold: true})
	}
	rp.ask("warm request after queue", pool, replayReq{prompt: prefix + "after the queue " + strings.Repeat("question ", 44)})
	conv := "session turn: " + long("tell me about the sea", 2000)
	s := rp.ask("session start", pool, replayReq{prompt: conv, session: "s1"})
	rp.ask("session turn 2", pool, replayReq{prompt: conv + " next turn", session: "s1"})
	for i := range 3 {
		rp.ask(fmt.Sprintf("queue on %s %d", s, i), newPool(s), replayReq{prompt: long(coldPrompt(60+i), 12000), hold: true})
	}
	rp.ask("session turn 3", pool, replayReq{prompt: conv + " next turn, and a third " + strings.Repeat("about the waves ", 10), session: "s1"})
	rp.endHeld(pool)
	rp.ask("session turn 4", pool, replayReq{prompt: conv + " next turn, and a third " + strings.Repeat("about the waves ", 10) + " four", session: "s1"})
	// What the engines taught: speeds, slots, mean outputs, readings.
	rp.learned("a:1", learnedFigures{PrefillTokensPerSecond: 3000, PrefillLearned: true, DecodeTokensPerSecond: 50, DecodeLearned: true, Slots: 2, MeanOutputTokens: 200})
	rp.learned("b:1", learnedFigures{PrefillTokensPerSecond: 9000, PrefillLearned: true, DecodeTokensPerSecond: 20, DecodeLearned: true, Slots: 4, MeanOutputTokens: 300})
	rp.learned("c:1", learnedFigures{PrefillTokensPerSecond: 6000, PrefillLearned: true, DecodeTokensPerSecond: 80, DecodeLearned: true, MeanOutputTokens: 250})
	rp.learned("d:1", learnedFigures{DecodeTokensPerSecond: 100, DecodeLearned: true, Slots: 3, MeanOutputTokens: 150})
	rp.reading("a:1", 1, 2)
	rp.reading("b:1", 3, 0)
	rp.reading("d:1", 0, 5)
	for i := range 8 {
		rp.ask(fmt.Sprintf("learned %d", i), pool, replayReq{prompt: long(coldPrompt(500+i), 1500+250*i), maxTokens: 40 * i, hold: i%2 == 0})
	}
	rp.ask("warm after learning", pool, replayReq{prompt: prefix + "after learning"})
	rp.ask("session after learning", pool, replayReq{prompt: conv + " next turn, and a third " + strings.Repeat("about the waves ", 10) + " four, five", session: "s1"})
	for i := range 4 {
		rp.ask(fmt.Sprintf("fill slots %d", i), pool, replayReq{prompt: long(coldPrompt(600+i), 700), hold: true})
	}
	rp.ask("session with slots full", pool, replayReq{prompt: conv + " next turn, and a third " + strings.Repeat("about the waves ", 10) + " four, five, six", session: "s1"})
	rp.ask("warm with slots full", pool, replayReq{prompt: prefix + "slots are full"})
	rp.endHeld(pool)
}

// cookieSessions issues session cookies and presents them back: a first binding waits in the
// pending space, moves to the sessions once presented, and is kept (moved as it is) when its
// upstream is out of band the first time the cookie comes back.
func cookieSessions(rp *replayRun, pool reverseproxy.UpstreamPool) {
	rp.feedbackFor(pool)
	rp.warm(pool, 300)
	conv := long("cookie conversation one", 1500)
	rp.ask("no session: cookie issued", pool, replayReq{prompt: conv})
	first := rp.cookie
	home := rp.ask("cookie presented", pool, replayReq{prompt: conv + " turn two", cookie: first})
	rp.ask("cookie presented again", pool, replayReq{prompt: conv + " turn two, three", cookie: first})
	conv2 := long("cookie conversation two", 1800)
	home2 := rp.ask("second client: cookie issued", pool, replayReq{prompt: conv2})
	second := rp.cookie
	for i := range 6 {
		rp.ask(fmt.Sprintf("hold on %s %d", home2, i), newPool(home2), replayReq{prompt: long(coldPrompt(900+i), 400), hold: true})
	}
	rp.ask("second presented, out of band", pool, replayReq{prompt: conv2 + " turn two", cookie: second})
	rp.ask("first, its upstream "+home, pool, replayReq{prompt: conv + " turn two, three, four", cookie: first})
	rp.endHeld(pool)
	rp.ask("second presented, back in band", pool, replayReq{prompt: conv2 + " turn two, three", cookie: second})
	rp.ask("header wins over cookie", pool, replayReq{prompt: conv2 + " turn two, three", cookie: second, session: "h1"})
	rp.ask("no cookie, prompt_cache_key", pool, replayReq{prompt: long(coldPrompt(950), 700), cacheKey: "k9"})
}

var replayScenes = []replayScene{
	{
		name: "thresholds/joule",
		opts: func(p *KVCacheAware) { p.Fallback = "joule" },
		ups: map[string]energy.Profile{
			"a:1": {EnergyPerToken: 100e-6}, "b:1": {EnergyPerToken: 120e-6},
			"c:1": {EnergyPerToken: 140e-6}, "d:1": {EnergyPerToken: 160e-6},
		},
		run: sessionsAndImbalance,
	},
	{
		name: "thresholds/joule-partial",
		opts: func(p *KVCacheAware) { p.Fallback = "joule" },
		ups:  map[string]energy.Profile{"b:1": {EnergyPerToken: 90e-6}, "c:1": {EnergyPerToken: 140e-6}},
		run:  sessionsAndImbalance,
	},
	{
		name: "thresholds/carbon",
		opts: func(p *KVCacheAware) { p.Fallback = "carbon" },
		ups: map[string]energy.Profile{
			"a:1": {EnergyPerToken: 100e-6, CarbonIntensity: 400}, "b:1": {EnergyPerToken: 120e-6, CarbonIntensity: 100},
			"c:1": {EnergyPerToken: 140e-6, CarbonIntensity: 200}, "d:1": {EnergyPerToken: 160e-6},
		},
		run: sessionsAndImbalance,
	},
	{
		name: "thresholds/least_busy",
		opts: func(p *KVCacheAware) { p.Fallback = "least_busy"; p.OnImbalance = "least_busy" },
		run:  sessionsAndImbalance,
	},
	{
		name: "thresholds/tight",
		opts: func(p *KVCacheAware) {
			p.Fallback = "least_busy"
			p.CacheThreshold, p.BalanceAbsThreshold, p.BalanceRelThreshold = f64(0.5), intp(2), f64(1.2)
		},
		run: sessionsAndImbalance,
	},
	{
		name: "thresholds/saturated-down-models",
		opts: func(p *KVCacheAware) { p.Fallback = "joule" },
		ups: map[string]energy.Profile{
			"a:1": {EnergyPerToken: 100e-6, MaxConcurrency: 2}, "b:1": {EnergyPerToken: 120e-6, MaxConcurrency: 3},
			"c:1": {EnergyPerToken: 140e-6, Models: []string{"m"}}, "d:1": {EnergyPerToken: 160e-6, Models: []string{"n"}},
		},
		run: func(rp *replayRun, pool reverseproxy.UpstreamPool) {
			rp.feedbackFor(pool)
			for i := range 7 {
				rp.ask(fmt.Sprintf("fill %d", i), pool, replayReq{prompt: long(coldPrompt(700+i), 500), hold: true})
			}
			rp.ask("model n", pool, replayReq{model: "n", prompt: long(coldPrompt(720), 500)})
			rp.ask("model m, all saturated", newPool("a:1", "b:1"), replayReq{prompt: long(coldPrompt(721), 500)})
			rp.p.state.upstream("c:1").health.down.Store(true)
			fmt.Fprintf(rp.out, "%s    c:1 down\n", rp.scene)
			rp.ask("c down", pool, replayReq{prompt: long(coldPrompt(722), 500)})
			rp.ask("c down, alone", newPool("c:1"), replayReq{prompt: long(coldPrompt(723), 500)})
			rp.endHeld(pool)
			rp.ask("after end", pool, replayReq{prompt: long(coldPrompt(724), 500)})
			r, cancel := rp.request(replayReq{prompt: long(coldPrompt(725), 500)})
			first := rp.retry("first attempt", pool, r, replayReq{prompt: long(coldPrompt(725), 500)})
			rp.retry("retry after "+first, pool, r, replayReq{prompt: long(coldPrompt(725), 500)})
			cancel()
			rp.waitReleased(r)
			rp.p.state.bindResponse("resp_1", "b:1")
			rp.ask("responses follow-up", pool, replayReq{prompt: "and then?", prevResp: "resp_1"})
		},
	},
	{
		name: "thresholds/cookie",
		opts: func(p *KVCacheAware) {
			p.Fallback, p.SessionCookie = "joule", &SessionCookie{Secret: testSecret}
		},
		ups: map[string]energy.Profile{
			"a:1": {EnergyPerToken: 100e-6}, "b:1": {EnergyPerToken: 120e-6},
			"c:1": {EnergyPerToken: 140e-6}, "d:1": {EnergyPerToken: 160e-6},
		},
		run: cookieSessions,
	},
	{
		name: "cost/cookie",
		opts: func(p *KVCacheAware) {
			p.Decision, p.SessionCookie = decisionCost, &SessionCookie{Secret: testSecret}
		},
		ups: map[string]energy.Profile{
			"a:1": {PrefillTokensPerSecond: 4000}, "b:1": {PrefillTokensPerSecond: 5000},
			"c:1": {PrefillTokensPerSecond: 6000}, "d:1": {PrefillTokensPerSecond: 7000},
		},
		run: cookieSessions,
	},
	{
		name: "cost/latency",
		opts: func(p *KVCacheAware) { p.Decision = decisionCost },
		ups: map[string]energy.Profile{
			"a:1": {PrefillTokensPerSecond: 4000}, "b:1": {PrefillTokensPerSecond: 5000},
			"c:1": {PrefillTokensPerSecond: 6000}, "d:1": {PrefillTokensPerSecond: 7000},
		},
		run: costWorkload,
	},
	{
		name: "cost/latency-wide",
		opts: func(p *KVCacheAware) {
			p.Decision = decisionCost
			p.TTFTSlack, p.BalanceAbsThreshold = f64(0.25), intp(1000)
		},
		ups: map[string]energy.Profile{
			"a:1": {PrefillTokensPerSecond: 4000}, "b:1": {PrefillTokensPerSecond: 5000},
			"c:1": {PrefillTokensPerSecond: 6000}, "d:1": {PrefillTokensPerSecond: 7000},
		},
		run: costWorkload,
	},
	{
		name: "cost/completion",
		opts: func(p *KVCacheAware) { p.Decision, p.Objective = decisionCost, objectiveCompletion },
		ups: map[string]energy.Profile{
			"a:1": {PrefillTokensPerSecond: 4000}, "b:1": {PrefillTokensPerSecond: 5000},
			"c:1": {PrefillTokensPerSecond: 6000}, "d:1": {PrefillTokensPerSecond: 7000},
		},
		run: costWorkload,
	},
	{
		name: "cost/energy",
		opts: func(p *KVCacheAware) { p.Decision, p.Objective, p.TTFTSlack = decisionCost, objectiveEnergy, f64(0.5) },
		ups: map[string]energy.Profile{
			"a:1": {PrefillTokensPerSecond: 4000, EnergyPerToken: 100e-6, PrefillEnergyPerToken: 40e-6},
			"b:1": {PrefillTokensPerSecond: 5000, EnergyPerToken: 150e-6},
			"c:1": {PrefillTokensPerSecond: 6000, EnergyPerToken: 210e-6, PrefillEnergyPerToken: 20e-6},
			"d:1": {PrefillTokensPerSecond: 7000},
		},
		run: costWorkload,
	},
	{
		name: "cost/carbon",
		opts: func(p *KVCacheAware) { p.Decision, p.Objective = decisionCost, objectiveCarbon },
		ups: map[string]energy.Profile{
			"a:1": {PrefillTokensPerSecond: 4000, EnergyPerToken: 100e-6, CarbonIntensity: 500},
			"b:1": {PrefillTokensPerSecond: 5000, EnergyPerToken: 150e-6, CarbonIntensity: 50},
			"c:1": {PrefillTokensPerSecond: 6000, EnergyPerToken: 210e-6, PrefillEnergyPerToken: 20e-6, CarbonIntensity: 200},
			"d:1": {PrefillTokensPerSecond: 7000},
		},
		run: costWorkload,
	},
	{
		name: "cost/saturated-down-models",
		opts: func(p *KVCacheAware) { p.Decision = decisionCost },
		ups: map[string]energy.Profile{
			"a:1": {PrefillTokensPerSecond: 4000, MaxConcurrency: 2}, "b:1": {PrefillTokensPerSecond: 5000, MaxConcurrency: 3},
			"c:1": {PrefillTokensPerSecond: 6000, Models: []string{"m"}}, "d:1": {PrefillTokensPerSecond: 7000, Models: []string{"n"}},
		},
		run: func(rp *replayRun, pool reverseproxy.UpstreamPool) {
			rp.feedbackFor(pool)
			for i := range 7 {
				rp.ask(fmt.Sprintf("fill %d", i), pool, replayReq{prompt: long(coldPrompt(800+i), 900+100*i), hold: true})
			}
			rp.ask("model n", pool, replayReq{model: "n", prompt: long(coldPrompt(820), 500)})
			rp.ask("all saturated", newPool("a:1", "b:1"), replayReq{prompt: long(coldPrompt(821), 500)})
			rp.p.state.upstream("c:1").health.down.Store(true)
			fmt.Fprintf(rp.out, "%s    c:1 down\n", rp.scene)
			rp.ask("c down", pool, replayReq{prompt: long(coldPrompt(822), 500)})
			rp.endHeld(pool)
			r, cancel := rp.request(replayReq{prompt: long(coldPrompt(825), 500)})
			first := rp.retry("first attempt", pool, r, replayReq{prompt: long(coldPrompt(825), 500)})
			rp.retry("retry after "+first, pool, r, replayReq{prompt: long(coldPrompt(825), 500)})
			cancel()
			rp.waitReleased(r)
			rp.p.state.bindResponse("resp_1", "a:1")
			rp.ask("responses follow-up", pool, replayReq{prompt: "and then?", prevResp: "resp_1"})
		},
	},
}

// runReplay runs every scene and returns the record.
func runReplay(t *testing.T) string {
	var out strings.Builder
	for _, sc := range replayScenes {
		t.Run(strings.ReplaceAll(sc.name, "/", "-"), func(t *testing.T) {
			// queue_timeout 0: the record is of decisions; a request that finds every upstream
			// saturated is decided at once (the queue is queue_test.go's).
			noWait := caddy.Duration(0)
			p := &KVCacheAware{Upstreams: sc.ups, ExplainHeader: "X-Why", QueueTimeout: &noWait}
			if sc.opts != nil {
				sc.opts(p)
			}
			p = newPolicy(t, p)
			pool := newPool(replayPool4...)
			rp := &replayRun{t: t, p: p, out: &out, scene: sc.name}
			t.Cleanup(func() {
				for _, c := range rp.held {
					c()
				}
			})
			fmt.Fprintf(&out, "== %s\n", sc.name)
			sc.run(rp, pool)
		})
	}
	return out.String()
}

// TestDecisionReplay replays the recorded scenes through the current code: every decision must
// choose the upstream, take the path and predict the costs the record holds.
func TestDecisionReplay(t *testing.T) {
	got := runReplay(t)
	if *updateReplay {
		if err := os.WriteFile(replayGolden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(replayGolden)
	if err != nil {
		t.Fatalf("%v (write it with -update-replay)", err)
	}
	if got == string(want) {
		return
	}
	gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
	for i := range max(len(gl), len(wl)) {
		var g, w string
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			t.Fatalf("decision replay differs from %s at line %d:\n got: %s\nwant: %s\n(context before: %q)", filepath.Base(replayGolden), i+1, g, w, wl[max(0, i-3):i])
		}
	}
}
