package fleetsim

import (
	"fmt"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// Scenario is a fleet, a workload and a way of sending it.
type Scenario struct {
	Name string
	// Family names the workload and fleet the scenario shares with others that differ only in
	// load: they share one capacity and one SLO.
	Family   string
	Requests int
	Workload func(requests int, seed uint64) (*Workload, error)
	Engines  []engine.Config
	// CharsPerToken is the true ratio of prompt chars to tokens (what the engines'
	// tokenizer gives); routers estimate it.
	CharsPerToken float64
	// Sessions: each request carries its conversation's id (a session header).
	Sessions bool
	// Load is the open-loop rate as a fraction of Capacity; Clients > 0 runs closed loop
	// instead, each client sending its conversation's calls back to back.
	Load    float64
	Clients int
	// Adapters > 0 spreads conversations over that many LoRA adapters (Zipf popularity).
	Adapters          int
	TelemetryInterval time.Duration
	Restart           *Restart
	Side              *SideLoad
	Grow              *Grow
	// Transit, when set, is the request path outside the engines (nil: none, every hop
	// instant).
	Transit *Transit
	// FlowControl: the requests carry tenants or priorities, and the card runs kv_flow
	// (kv_cache_aware with flow control) beside the other policies.
	FlowControl bool
}

// Restart restarts an engine At after the start (open loop: at the nominal pace, scaled to
// the rate), or, when Share is set, just before the run sends the request that follows that
// share of its requests (halfway: 0.5), whatever the time.
type Restart struct {
	Engine int
	At     time.Duration
	Share  float64
}

// Transit is the time a request spends outside the engines in real time, through a proxy on
// the same host: Router from the client's send to the router's decision (the body's upload, the
// matcher), Proxy plus PerKChar per 1,000 prompt chars from the decision to the engine's
// arrival (the body forwarded and parsed), Back from the engine's first token, and from its
// last, to the client. Each is drawn per request: × a lognormal factor of median 1 and log
// deviation Sigma (a loaded host's scheduling), the same draws for every policy of a seed. The
// router sees a first token when the engine sends it, and a request's end when the client has
// it (the proxy's handler returns then); a closed-loop client sends its next request then.
type Transit struct {
	Router, Proxy, PerKChar, Back time.Duration
	Sigma                         float64
	// Extra, when set, is the jitter instead of Sigma's: each delay is its median plus one of
	// these, drawn at random (FitTransit: a real series' delays beyond their groups' medians,
	// at evenly spaced ranks; a loaded host's stalls add to a hop whatever its size).
	Extra []time.Duration
}

// SideLoad is traffic no router sees: Rate requests per second of unrelated prompts sent
// straight to one engine.
type SideLoad struct {
	Engine int
	Rate   float64
}

// Built is a scenario's workload built at its true chars per token: requests with their text
// and block hashes, shared read-only by every run of the scenario and seed.
type Built struct {
	w    *Workload
	reqs [][]*Request
	span time.Duration
}

// Build builds sc's workload for seed.
func Build(sc *Scenario, seed uint64) (*Built, error) {
	w, err := sc.Workload(sc.Requests, seed)
	if err != nil {
		return nil, err
	}
	return build1(sc, w, seed), nil
}

func build1(sc *Scenario, w *Workload, seed uint64) *Built {
	b := &Built{w: w, span: w.span(), reqs: make([][]*Request, len(w.sessions))}
	r := newRNG(seed, "adapters")
	for i, s := range w.sessions {
		adapter := ""
		if sc.Adapters > 0 {
			adapter = fmt.Sprintf("lora-%d", r.zipf(sc.Adapters, 1.0))
		}
		for _, c := range s.calls {
			if adapter != "" {
				c.adapter, c.model = adapter, adapter
			}
			req := build(c, sc.CharsPerToken, w.full)
			req.sess = i
			req.Tenant, req.Priority, req.Class = s.tenant, s.priority, s.class
			if sc.Sessions {
				req.Session = s.id
			}
			b.reqs[i] = append(b.reqs[i], req)
		}
	}
	return b
}

// Engine fleets. The coefficients are an 8B model on one large GPU, roughly (see
// engine.Config's defaults); the caches are smaller than each workload's working set, so that
// where a router puts prefixes matters.
func chatEngine() engine.Config {
	return engine.Config{MaxNumSeqs: 8, CapacityBlocks: 2048}
}

func traceEngine() engine.Config {
	return engine.Config{MaxNumSeqs: 16, MaxBatchTokens: 4096, CapacityBlocks: 65536}
}

func fleet(n int, cfg engine.Config) []engine.Config {
	out := make([]engine.Config, n)
	for i := range out {
		out[i] = cfg
	}
	return out
}

// slowed returns cfg k times slower in every part of its step.
func slowed(cfg engine.Config, k time.Duration) engine.Config {
	cfg.StepFixed = k * engine.DefaultStepFixed
	cfg.PerPrefillToken = k * engine.DefaultPerPrefillToken
	cfg.PerSeq = k * engine.DefaultPerSeq
	return cfg
}

func chatW(requests int, seed uint64) (*Workload, error) { return ChatWorkload(requests, seed), nil }
func mooncakeW(requests int, _ uint64) (*Workload, error) {
	return MooncakeWorkload(requests)
}
func conversationW(requests int, seed uint64) (*Workload, error) {
	return ConversationWorkload(requests, seed), nil
}
func toolAgentW(requests int, seed uint64) (*Workload, error) {
	return ToolAgentWorkload(requests, seed), nil
}

// Scenarios are the scorecard's scenarios.
func Scenarios() []*Scenario {
	const chatN, traceN = 2000, 1500
	tele := time.Second
	chat4 := fleet(4, chatEngine())
	var out []*Scenario
	add := func(sc Scenario) {
		if sc.TelemetryInterval == 0 {
			sc.TelemetryInterval = tele
		}
		if sc.CharsPerToken == 0 {
			sc.CharsPerToken = 4
		}
		out = append(out, &sc)
	}
	for _, load := range []float64{0.5, 0.8, 0.95, 1.1} {
		add(Scenario{Name: fmt.Sprintf("chat-%d", int(load*100)), Family: "chat", Requests: chatN, Workload: chatW, Engines: chat4, Load: load})
	}
	add(Scenario{Name: "chat-sessions-80", Family: "chat-sessions", Requests: chatN, Workload: chatW, Engines: chat4, Load: 0.8, Sessions: true, CharsPerToken: 3.6})
	add(Scenario{Name: "chat-closed-16", Family: "chat", Requests: chatN, Workload: chatW, Engines: chat4, Clients: 16})
	add(Scenario{Name: "chat-closed-64", Family: "chat", Requests: chatN, Workload: chatW, Engines: chat4, Clients: 64})
	add(Scenario{Name: "chat-16-engines-80", Family: "chat-16", Requests: 4 * chatN, Workload: chatW, Engines: fleet(16, chatEngine()), Load: 0.8})
	add(Scenario{Name: "chat-64-engines-80", Family: "chat-64", Requests: 8 * chatN, Workload: chatW, Engines: fleet(64, chatEngine()), Load: 0.8})
	slow := fleet(4, chatEngine())
	slow[2], slow[3] = slowed(slow[2], 4), slowed(slow[3], 4)
	add(Scenario{Name: "chat-slow-half-80", Family: "chat-slow", Requests: chatN, Workload: chatW, Engines: slow, Load: 0.8})
	add(Scenario{Name: "chat-side-load-80", Family: "chat", Requests: chatN, Workload: chatW, Engines: chat4, Load: 0.8, Side: &SideLoad{Engine: 0, Rate: 4}})
	add(Scenario{Name: "chat-restart-80", Family: "chat", Requests: chatN, Workload: chatW, Engines: chat4, Load: 0.8, Restart: &Restart{Engine: 1, At: 60 * time.Second}})
	lora := fleet(4, chatEngine())
	for i := range lora {
		lora[i].MaxLoras = 2
	}
	add(Scenario{Name: "chat-lora-80", Family: "chat-lora", Requests: chatN, Workload: chatW, Engines: lora, Load: 0.8, Adapters: 8, CharsPerToken: 4.4})
	trace4 := fleet(4, traceEngine())
	add(Scenario{Name: "mooncake-80", Family: "mooncake", Requests: traceN, Workload: mooncakeW, Engines: trace4, Load: 0.8, CharsPerToken: 4.2})
	add(Scenario{Name: "mooncake-110", Family: "mooncake", Requests: traceN, Workload: mooncakeW, Engines: trace4, Load: 1.1, CharsPerToken: 4.2})
	add(Scenario{Name: "mooncake-closed-16", Family: "mooncake", Requests: traceN, Workload: mooncakeW, Engines: trace4, Clients: 16, CharsPerToken: 4.2})
	add(Scenario{Name: "conversation-80", Family: "conversation", Requests: traceN, Workload: conversationW, Engines: trace4, Load: 0.8, CharsPerToken: 3.3})
	// The demo's fleet of issues 33 and 34 (4 workers × 4 batch slots, 16 clients): 16
	// clients fill every slot, so where a request goes decides whether it waits for one.
	trace4x4 := fleet(4, traceEngine())
	for i := range trace4x4 {
		trace4x4[i].MaxNumSeqs = 4
	}
	add(Scenario{Name: "mooncake-closed-16-4slots", Family: "mooncake-4slots", Requests: traceN, Workload: mooncakeW, Engines: trace4x4, Clients: 16, CharsPerToken: 4.2})
	add(Scenario{Name: "toolagent-80", Family: "toolagent", Requests: traceN, Workload: toolAgentW, Engines: trace4, Load: 0.8, CharsPerToken: 4.6})
	// Cold and changing fleets (issue 41). mooncake-cold-16-4slots is the demo's Mooncake
	// closed loop as demosim runs it at the demo's speed 10: a run of seconds, in which the
	// 1-s telemetry readings are ten engine-seconds apart and the batch slots are learned
	// late, where the card's other cells run for minutes and learn them early.
	cold := DemoMooncakeClosed(10, 1000)
	cold.Name, cold.Family = "mooncake-cold-16-4slots", "mooncake-cold"
	add(*cold)
	// A scale-out: 4 engines, 4 more joining cold halfway through the trace, open loop at 55%
	// of the 8 engines' capacity (110% of the first four's: they queue until the others come).
	add(Scenario{Name: "mooncake-grow-4-8", Family: "mooncake-grow", Requests: traceN, Workload: mooncakeW, Engines: fleet(8, traceEngine()), Load: 0.55, CharsPerToken: 4.2,
		Grow: &Grow{Engines: 4, Share: 0.5}})
	// mooncake-closed-16 with engine 1 restarting halfway: its requests in flight fail, its
	// cache is lost, and the clients go on.
	add(Scenario{Name: "mooncake-closed-restart", Family: "mooncake", Requests: traceN, Workload: mooncakeW, Engines: trace4, Clients: 16, CharsPerToken: 4.2,
		Restart: &Restart{Engine: 1, Share: 0.5}})
	// Hot prefixes (issue 42): chat over 3 system prompts on 4 engines, open loop and as the
	// Ollama demo sends it (4 closed-loop clients); 16 system prompts of which the first
	// draws about 40% of the conversations (Zipf, exponent 1.3), on 8 engines; the tool-agent
	// look-alike beyond capacity.
	add(Scenario{Name: "chat-3-prompts-80", Family: "chat-3-prompts", Requests: chatN, Workload: chatPromptsW(3, 0), Engines: chat4, Load: 0.8})
	add(Scenario{Name: "chat-3-prompts-closed-4", Family: "chat-3-prompts", Requests: chatN, Workload: chatPromptsW(3, 0), Engines: chat4, Clients: 4})
	add(Scenario{Name: "chat-zipf-8-engines-80", Family: "chat-zipf-8", Requests: 2 * chatN, Workload: chatPromptsW(16, 1.3), Engines: fleet(8, chatEngine()), Load: 0.8})
	add(Scenario{Name: "toolagent-110", Family: "toolagent", Requests: traceN, Workload: toolAgentW, Engines: trace4, Load: 1.1, CharsPerToken: 4.6})
	// Flow control (issue 35), on the chat fleet and its capacity. tenants: a light tenant's
	// chat at 15% of capacity, alone and with a heavy tenant sending 10 times its requests and
	// tokens (150%): 165% in all, beyond what the fleet serves even with its cache (at 110%
	// it still serves everything, docs/simulator.md), so that the engines (or, with flow
	// control, the router) queue for the whole run. priority: an interactive band at 50%
	// (chat-50's rate), alone and with a batch band sending twice its requests (100%): 150%.
	add(Scenario{Name: "tenants_alone", FlowControl: true, Family: "chat", Requests: lightN, Workload: tenantsW(true), Engines: chat4, Load: lightLoad})
	add(Scenario{Name: "tenants_flood", FlowControl: true, Family: "chat", Requests: lightN * (1 + heavyTimes), Workload: tenantsW(false), Engines: chat4, Load: lightLoad * (1 + heavyTimes)})
	add(Scenario{Name: "priority_alone", FlowControl: true, Family: "chat", Requests: interactiveN, Workload: priorityW(true), Engines: chat4, Load: interactiveLoad})
	add(Scenario{Name: "priority_flood", FlowControl: true, Family: "chat", Requests: interactiveN * (1 + batchTimes), Workload: priorityW(false), Engines: chat4, Load: interactiveLoad * (1 + batchTimes)})
	return out
}

// DemoMooncakeClosed is the demo's Mooncake closed loop (docs/benchmarks.md, "Issue 34":
// -workload mooncake -open=false -concurrency 16 -max-num-seqs 4 -max-batch-tokens 4096):
// the trace's first requests from 16 clients on 4 engines of 4 batch slots and 4,096 tokens a
// step, whose step times are divided by speed (the demo's -speed), at the demo's chars per
// token (llmsim's 4), with the demo's path outside the engines (DemoTransit). Telemetry stays
// at 1 s of the clock: at speed 10 a reading is ten engine-seconds old when it comes. demosim
// runs it; the card's mooncake-cold-16-4slots is it at speed 10.
func DemoMooncakeClosed(speed float64, requests int) *Scenario {
	return demoClosed("demo-mooncake-closed-16-4slots", mooncakeW, speed, requests)
}

// DemoConversationClosed is DemoMooncakeClosed on the conversation look-alike
// (ConversationTrace): the demo's -workload conversation with the same flags.
func DemoConversationClosed(speed float64, requests int) *Scenario {
	return demoClosed("demo-conversation-closed-16-4slots", conversationW, speed, requests)
}

func demoClosed(name string, w func(int, uint64) (*Workload, error), speed float64, requests int) *Scenario {
	e := traceEngine()
	e.MaxNumSeqs = 4
	div := func(d time.Duration) time.Duration { return time.Duration(float64(d) / speed) }
	e.StepFixed, e.PerPrefillToken, e.PerSeq = div(engine.DefaultStepFixed), div(engine.DefaultPerPrefillToken), div(engine.DefaultPerSeq)
	t := DemoTransit
	return &Scenario{Name: name, Family: name, Requests: requests, Workload: w,
		Engines: fleet(4, e), Clients: 16, CharsPerToken: 4, TelemetryInterval: time.Second, Transit: &t}
}

// chatPromptsW is the chat workload over prompts system prompts, drawn by Zipf's law of
// exponent zipf (0: uniformly).
func chatPromptsW(prompts int, zipf float64) func(int, uint64) (*Workload, error) {
	return func(requests int, seed uint64) (*Workload, error) {
		cfg := workload.DefaultChat
		cfg.Conversations = max(1, requests/cfg.Turns)
		cfg.Seed = seed
		cfg.SystemPrompts, cfg.PromptZipf = prompts, zipf
		return chatWorkload(cfg), nil
	}
}

// The flow-control scenarios' classes and rates (fractions of the chat fleet's capacity).
const (
	lightN, heavyTimes, lightLoad             = 800, 10, 0.15
	interactiveN, batchTimes, interactiveLoad = 1000, 2, 0.5
)

var (
	lightClass       = ClassSpec{Class: "light", Tenant: "light"}
	heavyClass       = ClassSpec{Class: "heavy", Tenant: "heavy"}
	interactiveClass = ClassSpec{Class: "interactive", Priority: "interactive"}
	batchClass       = ClassSpec{Class: "batch", Priority: "batch"}
)

func tenantsW(alone bool) func(int, uint64) (*Workload, error) {
	return func(requests int, seed uint64) (*Workload, error) {
		return TwoClassWorkload(requests, seed, heavyTimes, alone, lightClass, heavyClass), nil
	}
}

func priorityW(alone bool) func(int, uint64) (*Workload, error) {
	return func(requests int, seed uint64) (*Workload, error) {
		return TwoClassWorkload(requests, seed, batchTimes, alone, interactiveClass, batchClass), nil
	}
}
