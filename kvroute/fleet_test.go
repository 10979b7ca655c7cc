package kvroute

// The engines' model lists and LoRA adapters, through the in-process Caddy (caddytest): step 1
// leaves out an engine that does not serve the request's model once its list is read; a list
// that changes is read again; an unreadable list and a model no list names filter nothing;
// an upstream block's models wins; auth_header reaches the engines and nothing else; a request
// for an adapter goes where the adapter is warm.

import (
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fastModels reads the model lists every 100ms for the test.
func fastModels(t *testing.T) {
	modelsEveryOverride.Store(int64(100 * time.Millisecond))
	t.Cleanup(func() { modelsEveryOverride.Store(0) })
}

func modelList(entries ...string) string {
	var parts []string
	for _, e := range entries {
		id, parent, _ := strings.Cut(e, ":")
		p := "null"
		if parent != "" {
			p = fmt.Sprintf("%q", parent)
		}
		parts = append(parts, fmt.Sprintf(`{"id":%q,"object":"model","owned_by":"vllm","root":%q,"parent":%s,"max_model_len":4096}`, id, id, p))
	}
	return `{"object":"list","data":[` + strings.Join(parts, ",") + `]}`
}

func (e *engine) setModels(list string) {
	e.mu.Lock()
	e.models = list
	e.mu.Unlock()
}

// served sends n cold requests for model and returns how many each engine answered; every one
// must succeed.
func servedBy(t *testing.T, client *http.Client, model string, n, seed int, engines ...*engine) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := range n {
		rep, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody(model, coldPrompt(seed+i)))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s request %d: status %d", model, i, resp.StatusCode)
		}
		got[rep.Upstream]++
	}
	return got
}

func modelsRead(t *testing.T, e *engine, want string) func() bool {
	return func() bool {
		ms := upstreamStatus(t, e.addr()).Models
		if ms == nil || ms.ReadAt == nil {
			return false
		}
		for _, m := range ms.Models {
			if m == want {
				return true
			}
		}
		_, ok := ms.Adapters[want]
		return ok
	}
}

func TestModelsFromEngines(t *testing.T) {
	leakCheck(t)
	fastModels(t)
	const key = "kvroute-test-key-0123456789"
	t.Setenv("KVROUTE_TEST_ENGINE_KEY", key)
	e1, e2, e3, e4 := newEngine(t, "e1", 1000), newEngine(t, "e2", 1000), newEngine(t, "e3", 1000), newEngine(t, "e4", 1000)
	for _, e := range []*engine{e1, e2, e3, e4} {
		e.apiKey = key
	}
	e1.setModels(modelList("m-b")) // annotated models m-a: the annotation wins
	e2.setModels(modelList("m-a", "m-s"))
	e3.setModels(modelList("m-b"))
	e4.metrics = "404" // unreadable list (404), no metrics either: never filtered
	tel := "telemetry {\n\t\t\t\tinterval 100ms\n\t\t\t\ttimeout 100ms\n\t\t\t\tauth_header \"Bearer {env.KVROUTE_TEST_ENGINE_KEY}\"\n\t\t\t}"
	logStart := caddyLogSize()
	startCaddy(t, telemetryConfig([]*engine{e1, e2, e3, e4}, tel, "",
		fmt.Sprintf("upstream %s {\n\t\t\t\tmodels m-a\n\t\t\t}", e1.addr())))
	client := newClient(t, 10*time.Second)
	waitUntil(t, 10*time.Second, func() bool { return modelsRead(t, e2, "m-a")() && modelsRead(t, e3, "m-b")() }, "the engines' model lists in GET /kvroute/")

	got := servedBy(t, client, "m-a", 40, 0)
	if got["e3"] != 0 {
		t.Errorf("e3 lists only m-b, yet got %d of 40 m-a requests (%v)", got["e3"], got)
	}
	if got["e1"] == 0 || got["e2"] == 0 || got["e4"] == 0 {
		t.Errorf("m-a went to %v: want a share on e1 (annotated), e2 (listed) and e4 (list unread)", got)
	}
	// A model no list names filters nothing: every engine may answer it, but e1, whose
	// upstream block says it serves m-a only.
	if got := servedBy(t, client, "m-typo", 40, 100); len(got) != 3 || got["e1"] != 0 {
		t.Errorf("a model no list names went to %v: want e2, e3 and e4", got)
	}

	// Sessions of m-s bind to e2 or e4 (unread list), the only ones that may serve it.
	var onE2 []string
	for i := range 10 {
		id := fmt.Sprintf("sess-%d", i)
		rep, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("m-s", "a conversation "+id), "X-Session-ID", id)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if rep.Upstream == "e2" {
			onE2 = append(onE2, id)
		}
	}
	if len(onE2) == 0 {
		t.Fatal("no m-s session bound to e2")
	}

	// The lists change: e2 drops m-a and m-s, e3 takes them on.
	e2.setModels(modelList("m-b"))
	e3.setModels(modelList("m-a", "m-b", "m-s"))
	waitUntil(t, 10*time.Second, func() bool { return modelsRead(t, e3, "m-a")() && !modelsRead(t, e2, "m-a")() }, "the changed lists")
	got = servedBy(t, client, "m-a", 40, 200)
	if got["e2"] != 0 || got["e3"] == 0 {
		t.Errorf("after the change m-a went to %v: want none on e2, a share on e3", got)
	}

	// A session bound to e2 leaves it: its binding goes (not kept and skipped), and its turns
	// stay together on their new upstream.
	for _, id := range onE2 {
		var ups []string
		for turn := range 4 {
			rep, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("m-s", "a conversation "+id, fmt.Sprintf("turn %d", turn)), "X-Session-ID", id)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			ups = append(ups, rep.Upstream)
		}
		if ups[0] == "e2" || slices.Compact(slices.Clone(ups))[0] != ups[0] || len(slices.Compact(slices.Clone(ups))) != 1 {
			t.Errorf("session %s, bound to e2 which no longer lists m-s, went to %v: want one other upstream", id, ups)
		}
	}

	// A list that becomes unreadable keeps the last one read (and counts the failure).
	e3.setModels(`{"data": garbled`)
	waitUntil(t, 10*time.Second, func() bool {
		ms := upstreamStatus(t, e3.addr()).Models
		return ms != nil && ms.Counts["garbled"] > 0
	}, "a garbled list counted")
	if !modelsRead(t, e3, "m-a")() {
		t.Error("a garbled read dropped the last list")
	}

	// The key went to the engines on every read, and nowhere else.
	e1.mu.Lock()
	seen := append([]string(nil), e1.authSeen...)
	e1.mu.Unlock()
	if len(seen) == 0 {
		t.Fatal("no read reached e1")
	}
	for _, a := range seen {
		if a != "Bearer "+key {
			t.Fatalf("a read came with Authorization %q", a)
		}
	}
	if ms := upstreamStatus(t, e1.addr()).Models; ms == nil || ms.Counts["ok"] == 0 {
		t.Errorf("e1's list was not read with the key: %+v", ms)
	}
	_, body := adminCall(t, http.MethodGet, "/kvroute/")
	_, metrics := adminCall(t, http.MethodGet, "/metrics")
	logs := make([]byte, caddyLogSize()-logStart)
	if caddyLog != nil {
		_, _ = caddyLog.ReadAt(logs, logStart)
	}
	for what, b := range map[string][]byte{"GET /kvroute/": body, "/metrics": metrics, "Caddy's log": logs} {
		if strings.Contains(string(b), key) {
			t.Errorf("%s shows the key", what)
		}
	}
}

// An auth_header whose placeholder does not resolve is refused at load, naming the option.
func TestTelemetryAuthHeaderUnresolved(t *testing.T) {
	os.Unsetenv("KVROUTE_TEST_UNSET_KEY")
	p := &KVCacheAware{Telemetry: &Telemetry{AuthHeader: "Bearer {env.KVROUTE_TEST_UNSET_KEY}"}}
	err := p.Validate()
	if err == nil || !strings.Contains(err.Error(), "auth_header") {
		t.Fatalf("err %v, want one naming auth_header", err)
	}
	p.Telemetry.AuthHeader = "Bearer a\nb"
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "auth_header") {
		t.Fatalf("a header with a line break: err %v", err)
	}
}

// loraLine is a lora_requests_info series as vLLM writes it: the adapters of running and
// waiting requests, max_lora, valued with the unix time.
func loraLine(at int64, maxLoRA int, running, waiting string) string {
	return fmt.Sprintf("# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{max_lora=\"%d\",running_lora_adapters=%q,waiting_lora_adapters=%q} %d\n", maxLoRA, running, waiting, at)
}

func (e *engine) setExtra(s string) {
	e.mu.Lock()
	e.extra = s
	e.mu.Unlock()
}

func loraStatusOf(t *testing.T, e *engine) *LoRAStatus {
	return upstreamStatus(t, e.addr()).LoRA
}

func TestAdapterRoutedWhereWarm(t *testing.T) {
	leakCheck(t)
	fastModels(t)
	list := modelList("base", "ada:base", "bob:base", "cyd:base")
	engines := []*engine{newEngine(t, "e1", 1000), newEngine(t, "e2", 1000), newEngine(t, "e3", 1000)}
	now := time.Now().Unix()
	for _, e := range engines {
		e.setModels(list)
		e.setExtra(loraLine(now, 1, "", ""))
	}
	e2 := engines[1]
	e2.setExtra(loraLine(now, 1, "bob", "")) // bob is active on e2
	startCaddy(t, telemetryConfig(engines, "", ""))
	client := newClient(t, 10*time.Second)
	waitUntil(t, 10*time.Second, func() bool {
		ls := loraStatusOf(t, e2)
		return modelsRead(t, e2, "bob")() && ls != nil && len(ls.Warm) == 1 && ls.Warm[0] == "bob"
	}, "bob warm on e2")

	if got := servedBy(t, client, "bob", 20, 0); got["e2"] != 20 {
		t.Errorf("bob went to %v: want all 20 on e2, where it is warm", got)
	}
	// e2 goes idle: its newest series lists nothing, and bob stays warm (loaded, not active).
	e2.setExtra(loraLine(now, 1, "bob", "") + fmt.Sprintf("vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} %d\n", now+1))
	waitUntil(t, 10*time.Second, func() bool {
		ls := loraStatusOf(t, e2)
		return ls != nil && ls.ActiveAt != nil && ls.ActiveAt.Unix() == now+1
	}, "e2's idle reading")
	if ls := loraStatusOf(t, e2); len(ls.Running) != 0 || len(ls.Warm) != 1 || ls.Warm[0] != "bob" {
		t.Errorf("e2 idle: %+v, want nothing running and bob still warm", ls)
	}
	if got := servedBy(t, client, "bob", 10, 100); got["e2"] != 10 {
		t.Errorf("bob, idle on e2, went to %v: want all 10 on e2", got)
	}
	if n := metricValue(t, fmt.Sprintf(`caddy_kvroute_adapter_switches_total{upstream=%q}`, e2.addr())); n != 0 {
		t.Errorf("%v adapter switches on e2, want 0", n)
	}

	// ada is warm nowhere: it goes where a slot is free (not e2, whose one slot holds bob),
	// once, and stays there.
	got := servedBy(t, client, "ada", 10, 200)
	if got["e2"] != 0 || len(got) != 1 {
		t.Errorf("ada went to %v: want one engine with a free slot", got)
	}
	switches := 0.0
	for _, e := range engines {
		switches += metricValue(t, fmt.Sprintf(`caddy_kvroute_adapter_switches_total{upstream=%q}`, e.addr()))
	}
	if switches != 1 {
		t.Errorf("%v adapter switches, want 1 (ada's first request)", switches)
	}
	// Each adapter has its own tree.
	st := getStatus(t)
	for _, m := range []string{"ada", "bob"} {
		if st.Models[m].Chars == 0 {
			t.Errorf("no tree for adapter %s: %v", m, st.Models)
		}
	}
}

// Under imbalance (prefix_in_band), a cold request for an adapter goes to the engine in the
// band where the adapter is warm, not to any least busy one.
func TestAdapterWarmUnderImbalance(t *testing.T) {
	leakCheck(t)
	fastModels(t)
	list := modelList("base", "ada:base", "bob:base", "only-e1")
	engines := []*engine{newEngine(t, "e1", 1000), newEngine(t, "e2", 1000), newEngine(t, "e3", 1000)}
	now := time.Now().Unix()
	for _, e := range engines {
		e.setModels(modelList("base", "ada:base", "bob:base"))
		e.setExtra(loraLine(now, 1, "", ""))
	}
	e1, e2, e3 := engines[0], engines[1], engines[2]
	e1.setModels(list) // only e1 serves only-e1: the requests that make it busy
	e2.setExtra(loraLine(now, 1, "bob", ""))
	startCaddy(t, telemetryConfig(engines, "", ""))
	client := newClient(t, 10*time.Second)
	waitUntil(t, 10*time.Second, func() bool {
		ls := loraStatusOf(t, e2)
		return modelsRead(t, e1, "only-e1")() && modelsRead(t, e3, "bob")() && ls != nil && len(ls.Warm) == 1
	}, "the lists read and bob warm on e2")

	e1.setHang(true)
	var wg sync.WaitGroup
	for i := range 6 { // e1 runs 6, the others none: beyond both balance thresholds
		wg.Add(1)
		go func() {
			defer wg.Done()
			trySend(client, baseURL+"/v1/chat/completions", chatBody("only-e1", coldPrompt(500+i)), fmt.Sprintf("busy-%d", i))
		}()
	}
	defer wg.Wait()
	defer e1.setHang(false)
	waitUntil(t, 10*time.Second, func() bool { return e1.active.Load() == 6 }, "six requests running on e1")

	got := map[string]int{}
	for i := range 10 {
		rep, resp := send(t, client, baseURL+"/v1/chat/completions", chatBody("bob", coldPrompt(600+i)))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		got[rep.Upstream]++
	}
	if got["e2"] != 10 {
		t.Errorf("under imbalance bob went to %v: want all 10 on e2, in band and warm", got)
	}
	if n := upstreamStatus(t, e2.addr()).Decisions["imbalance"]; n < 10 {
		t.Errorf("%d imbalance decisions on e2, want 10 (the test must exercise the imbalance step)", n)
	}
}

// Under decision cost an adapter load is a cost: with equal queues, cold requests for an
// adapter warm on one engine go there (the other engines would load it, or evict another
// adapter to load it), and one warm nowhere goes where a slot is free.
func TestAdapterWarmUnderDecisionCost(t *testing.T) {
	leakCheck(t)
	fastModels(t)
	list := modelList("base", "ada:base", "bob:base")
	engines := []*engine{newEngine(t, "e1", 1000), newEngine(t, "e2", 1000), newEngine(t, "e3", 1000)}
	now := time.Now().Unix()
	for _, e := range engines {
		e.setModels(list)
		e.setExtra(loraLine(now, 1, "", ""))
	}
	e2 := engines[1]
	e2.setExtra(loraLine(now, 1, "bob", ""))
	startCaddy(t, telemetryConfig(engines, "", "", "decision cost"))
	client := newClient(t, 10*time.Second)
	waitUntil(t, 10*time.Second, func() bool {
		ls := loraStatusOf(t, e2)
		return modelsRead(t, e2, "bob")() && ls != nil && len(ls.Warm) == 1 && ls.Warm[0] == "bob"
	}, "bob warm on e2")
	if got := servedBy(t, client, "bob", 20, 0); got["e2"] != 20 {
		t.Errorf("decision cost: bob went to %v, want all 20 on e2, where it is warm", got)
	}
	if got := servedBy(t, client, "ada", 10, 200); got["e2"] != 0 || len(got) != 1 {
		t.Errorf("decision cost: ada went to %v, want one engine with a free slot", got)
	}
}
