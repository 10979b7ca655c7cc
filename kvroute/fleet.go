package kvroute

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/caddy-kvroute/kvroute/decide"
	"github.com/kvroute/caddy-kvroute/kvroute/telemetry"
)

// What the engines say they serve (docs/fleet.md "Served models" and "LoRA adapters"): the
// models and LoRA adapters of each upstream's GET /v1/models, and the adapters its running and
// waiting requests use (vllm:lora_requests_info). Step 1 leaves out an upstream whose list is
// read and does not name the request's model; a request for an adapter prefers an upstream
// where the adapter is warm (the decision's adapter signal: decide.Candidate.Adapter).

// modelsEveryOverride replaces telemetry.DefaultModelsEvery when positive (nanoseconds):
// tests read the lists faster.
var modelsEveryOverride atomic.Int64

func modelsEvery() time.Duration {
	if d := modelsEveryOverride.Load(); d > 0 {
		return time.Duration(d)
	}
	return telemetry.DefaultModelsEvery
}

// defaultMaxLoRA is how many adapters an engine is taken to keep in GPU memory when its
// telemetry does not say: vLLM's default --max-loras.
const defaultMaxLoRA = 1

// loraState is an upstream's warm adapters: the active ones of its latest reading, and the
// last adapters this router and its peers sent there, most recent first, at most maxLoRA
// (vLLM keeps that many in GPU memory and evicts the least recently used).
type loraState struct {
	mu      sync.Mutex
	warm    []string
	maxLoRA int // from the engine's lora_requests_info; 0: unknown (defaultMaxLoRA)
	active  *telemetry.LoRAInfo
	// switches counts the requests this router sent there for an adapter that was not warm.
	switches atomic.Uint64
}

func (l *loraState) capLocked() int {
	if l.maxLoRA > 0 {
		return l.maxLoRA
	}
	return defaultMaxLoRA
}

// touchLocked makes adapter the most recently used, evicting beyond the cap.
func (l *loraState) touchLocked(adapter string) {
	if i := slices.Index(l.warm, adapter); i >= 0 {
		l.warm = slices.Delete(l.warm, i, i+1)
	}
	l.warm = slices.Insert(l.warm, 0, adapter)
	if n := l.capLocked(); len(l.warm) > n {
		l.warm = l.warm[:n]
	}
}

// observeReading takes in a reading's adapters: waiting ones are loaded next, running ones
// are loaded now (touched last: the most recent).
func (l *loraState) observeReading(info *telemetry.LoRAInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.active = info
	if info.MaxLoRA > 0 {
		l.maxLoRA = info.MaxLoRA
	}
	for _, a := range info.Waiting {
		l.touchLocked(a)
	}
	for _, a := range info.Running {
		l.touchLocked(a)
	}
	if n := l.capLocked(); len(l.warm) > n {
		l.warm = l.warm[:n]
	}
}

// The adapter signal's values, in adapter loads (decide.AdapterWarm...).
const (
	adapterWarm     = decide.AdapterWarm     // warm there (or the request names no adapter): no load
	adapterFreeSlot = decide.AdapterFreeSlot // a load into a free slot
	adapterEvict    = decide.AdapterEvict    // a load that evicts another warm adapter, whose next request loads it again
)

// cost is the adapter signal for adapter on this upstream.
func (l *loraState) cost(adapter string) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case slices.Contains(l.warm, adapter):
		return adapterWarm
	case len(l.warm) < l.capLocked():
		return adapterFreeSlot
	}
	return adapterEvict
}

// sent records that a request for adapter went to the upstream, and reports whether it was
// warm there.
func (l *loraState) sent(adapter string) (warm bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	warm = slices.Contains(l.warm, adapter)
	l.touchLocked(adapter)
	return warm
}

// modelList returns the model list last read from the engine at addr; nil when none was.
func (s *state) modelList(addr string) *telemetry.ModelList {
	sc := s.tel.current.Load()
	if sc == nil {
		return nil
	}
	if snap := sc.Snapshot(addr); snap != nil {
		return snap.Models
	}
	return nil
}

// listedAdapter reports whether the engine at addr lists model as a LoRA adapter.
func (s *state) listedAdapter(addr, model string) bool {
	return s.modelList(addr).IsAdapter(model)
}

// served returns the candidates that serve model: an upstream whose model list is read and
// does not name model is left out, unless its upstream block gives `models` (which wins, and
// which candidates applied already) or no candidate's list names model (a typo, an adapter
// loaded since the last read: the engines answer it as they would, and the lists are read
// again soon). When a list names model as a LoRA adapter, it sets the candidates' adapter
// costs.
func (s *state) served(cands []candidate, model string) []candidate {
	if model == "" || len(cands) == 0 || s.tel.current.Load() == nil {
		return cands
	}
	var buf [16]int8 // per candidate: -1 list read without model, 0 no list, 1 listed
	listed := buf[:0]
	named, lora := false, false
	for i := range cands {
		l := s.modelList(cands[i].up.Dial)
		switch m, ok := l.Find(model); {
		case l == nil:
			listed = append(listed, 0)
		case ok:
			listed = append(listed, 1)
			named, lora = true, lora || m.Parent != ""
		default:
			listed = append(listed, -1)
		}
	}
	if named {
		kept := cands[:0]
		for i, c := range cands {
			if listed[i] >= 0 || (c.prof != nil && len(c.prof.Models) > 0) {
				kept = append(kept, c)
			}
		}
		cands = kept
	}
	if lora {
		for i := range cands {
			cands[i].lora = true
			cands[i].adapter = cands[i].st.lora.cost(model)
		}
	}
	return cands
}

// listedElsewhere reports whether step 1 left addr out for its model list: its list is read
// and does not name model, while a candidate's list does (nor does an upstream block's
// models name it for addr).
func (s *state) listedElsewhere(addr, model string, cands []candidate) bool {
	l := s.modelList(addr)
	if l == nil || model == "" {
		return false
	}
	if _, ok := l.Find(model); ok {
		return false
	}
	if prof, ok := s.profile(addr); ok && len(prof.Models) > 0 {
		return false
	}
	for i := range cands {
		if _, ok := s.modelList(cands[i].up.Dial).Find(model); ok {
			return true
		}
	}
	return false
}

// adapterSent records a request for the LoRA adapter model sent to u (a decision of this
// router, own, or a peer's) and counts a switch when it was not warm there.
func (s *state) adapterSent(u *upstreamState, model string, own bool) {
	if !u.lora.sent(model) && own {
		u.lora.switches.Add(1)
	}
}

// observeFleet takes in what a scrape read of the engine's adapters, and logs a model list
// that changed.
func (s *state) observeFleet(u *upstreamState, prev, cur *telemetry.Snapshot) {
	if cur.Outcome == telemetry.OutcomeOK && cur.Reading.LoRA != nil && !cur.FromPeer {
		u.lora.observeReading(cur.Reading.LoRA)
	}
	l := cur.Models
	if l == nil || (prev != nil && prev.Models == l) {
		return
	}
	if prev != nil && prev.Models != nil && slices.EqualFunc(prev.Models.Models, l.Models, func(a, b telemetry.ServedModel) bool { return a == b }) {
		return
	}
	ids := make([]string, 0, len(l.Models))
	for _, m := range l.Models {
		ids = append(ids, m.ID)
	}
	s.log().Info("telemetry: the upstream's engine serves these models", zap.String("upstream", u.addr),
		zap.Strings("models", ids), zap.Int("dropped", l.Dropped))
}

// ModelsStatus is what GET /kvroute/ shows of the models an upstream's engine serves.
type ModelsStatus struct {
	// Models and Adapters are the ids of its latest /v1/models (adapters: entries with a
	// parent, keyed by id, the parent as value); ReadAt when the engine answered it.
	Models   []string          `json:"models"`
	Adapters map[string]string `json:"adapters,omitempty"`
	ReadAt   *time.Time        `json:"read_at,omitempty"`
	Dropped  int               `json:"dropped,omitempty"`
	// Outcome, Error and Counts are those of the reads of the list.
	Outcome string            `json:"outcome,omitempty"`
	Error   string            `json:"last_error,omitempty"`
	Counts  map[string]uint64 `json:"counts,omitempty"`
}

// LoRAStatus is what GET /kvroute/ shows of an upstream's adapters.
type LoRAStatus struct {
	// Warm lists the adapters taken to be in its GPU memory, most recent first: the active
	// ones of its latest reading and those this router sent there, at most MaxLoRA.
	Warm    []string `json:"warm"`
	MaxLoRA int      `json:"max_lora"` // from the engine; 0: unknown (1 assumed)
	Running []string `json:"running,omitempty"`
	Waiting []string `json:"waiting,omitempty"`
	// ActiveAt is the time of the engine's newest lora_requests_info series.
	ActiveAt *time.Time `json:"active_at,omitempty"`
	// Switches counts the requests this router sent there for an adapter that was not warm.
	Switches uint64 `json:"adapter_switches"`
}

// modelsStatus returns the admin API's view of an upstream's model list, nil when never read.
func modelsStatus(snap *telemetry.Snapshot) *ModelsStatus {
	if snap == nil || snap.ModelsOutcome == telemetry.OutcomeNone {
		return nil
	}
	ms := &ModelsStatus{Models: []string{}}
	if l := snap.Models; l != nil {
		for _, m := range l.Models {
			if m.Parent != "" {
				if ms.Adapters == nil {
					ms.Adapters = map[string]string{}
				}
				ms.Adapters[m.ID] = m.Parent
			} else {
				ms.Models = append(ms.Models, m.ID)
			}
		}
		at := snap.ModelsAt.UTC()
		ms.ReadAt, ms.Dropped = &at, l.Dropped
	}
	ms.Outcome, ms.Error = snap.ModelsOutcome.String(), snap.ModelsError
	ms.Counts = map[string]uint64{}
	for _, o := range telemetry.Outcomes() {
		if n := snap.ModelsCounts[o]; n > 0 {
			ms.Counts[o.String()] = n
		}
	}
	return ms
}

// loraStatus returns the admin API's view of u's adapters, nil when it has none.
func (u *upstreamState) loraStatus() *LoRAStatus {
	l := &u.lora
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.warm) == 0 && l.active == nil && l.switches.Load() == 0 {
		return nil
	}
	ls := &LoRAStatus{Warm: slices.Clone(l.warm), MaxLoRA: l.maxLoRA, Switches: l.switches.Load()}
	if ls.Warm == nil {
		ls.Warm = []string{}
	}
	if a := l.active; a != nil {
		ls.Running, ls.Waiting = a.Running, a.Waiting
		at := a.At
		ls.ActiveAt = &at
	}
	return ls
}

// fleetCollector exports the adapter switches at scrape time, for the upstreams the state
// knows (a dynamic upstream that left takes its series with it).
type fleetCollector struct{}

var descAdapterSwitches = prometheus.NewDesc(ns+"_"+sub+"_adapter_switches_total",
	"Requests this router sent to an upstream for a LoRA adapter that was not warm there (the engine loads it, perhaps evicting another).",
	[]string{"upstream"}, nil)

func (*fleetCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descAdapterSwitches }

func (*fleetCollector) Collect(ch chan<- prometheus.Metric) {
	s := currentState()
	if s == nil {
		return
	}
	s.upstreams.Range(func(k, v any) bool {
		if n := v.(*upstreamState).lora.switches.Load(); n > 0 {
			ch <- prometheus.MustNewConstMetric(descAdapterSwitches, prometheus.CounterValue, float64(n), k.(string))
		}
		return true
	})
}
