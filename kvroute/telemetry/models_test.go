package telemetry

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The simulator's list (started with three --lora-modules on base-model): the base model
// without a parent, the adapters with theirs.
func TestParseModelsLLMDSimulator(t *testing.T) {
	l, err := ParseModels(fixture(t, "llmd_sim_v0.10.2_models_lora.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range l.Models {
		ids = append(ids, m.ID)
	}
	if !slices.Equal(ids, []string{"ada", "base-model", "bob", "cyd"}) {
		t.Fatalf("ids %v", ids)
	}
	if l.IsAdapter("base-model") || !l.IsAdapter("ada") || l.IsAdapter("nope") {
		t.Errorf("IsAdapter wrong: %+v", l.Models)
	}
	if l.Models[0].Parent != "base-model" || l.Models[0].Root != "/x" || l.Models[1].MaxModelLen != 1024 {
		t.Errorf("fields: %+v", l.Models)
	}
}

func TestParseModelsBadInput(t *testing.T) {
	for _, tc := range []struct {
		name, page string
		ok         bool
		n, dropped int
	}{
		{"empty", "", false, 0, 0},
		{"not json", "<html>", false, 0, 0},
		{"no data", `{"object":"list"}`, false, 0, 0},
		{"data not array", `{"data":{"id":"m"}}`, false, 0, 0},
		{"array", `[{"id":"m"}]`, false, 0, 0},
		{"empty list", `{"data":[]}`, true, 0, 0},
		{"bad entries", `{"data":[{"id":""},{"id":5},{"id":"m","parent":7,"max_model_len":-3},{"id":"m"},{}]}`, true, 1, 4},
		{"overlong id", `{"data":[{"id":"` + strings.Repeat("x", 600) + `"}]}`, true, 0, 1},
		{"llama.cpp", `{"models":[{"name":"q"}],"object":"list","data":[{"id":"q.gguf","object":"model","owned_by":"llamacpp","meta":{"n_ctx_train":4096}}]}`, true, 1, 0},
		{"own parent", `{"data":[{"id":"m","parent":"m","root":"m"}]}`, true, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := ParseModels([]byte(tc.page))
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
			if len(l.Models) != tc.n || l.Dropped != tc.dropped {
				t.Errorf("%d models, %d dropped; want %d, %d: %+v", len(l.Models), l.Dropped, tc.n, tc.dropped, l)
			}
			for _, m := range l.Models {
				if m.Parent == m.ID {
					t.Errorf("%q is its own parent", m.ID)
				}
			}
		})
	}
	var b bytes.Buffer
	b.WriteString(`{"data":[`)
	for i := range MaxServedModels + 10 {
		fmt.Fprintf(&b, `{"id":"m%d"},`, i)
	}
	b.WriteString(`{"id":"last"}]}`)
	l, err := ParseModels(b.Bytes())
	if err != nil || len(l.Models) != MaxServedModels || l.Dropped != 11 {
		t.Errorf("a long list: %d models, %d dropped, %v", len(l.Models), l.Dropped, err)
	}
	if _, err := ParseModels(bytes.Repeat([]byte(" "), MaxModelsBytes+1)); err == nil {
		t.Error("a page over the bound parsed")
	}
}

func FuzzParseModels(f *testing.F) {
	f.Add([]byte(`{"data":[{"id":"a","parent":"b","root":"c","max_model_len":4096}]}`))
	f.Add([]byte(`{"data":[{"id":"\ud800"}]}`))
	f.Fuzz(func(t *testing.T, page []byte) {
		l, err := ParseModels(page)
		if err != nil {
			return
		}
		if len(l.Models) > MaxServedModels {
			t.Fatalf("%d models", len(l.Models))
		}
		for _, m := range l.Models {
			if m.ID == "" || len(m.ID) > maxModelID || m.Parent == m.ID {
				t.Fatalf("entry %+v", m)
			}
		}
	})
}

// The simulator's lora_requests_info, captured while ada and cyd ran and bob and ada waited,
// and once idle: the newest series wins; series tied on the second merge.
func TestLoRAInfoLLMDSimulator(t *testing.T) {
	r, err := Parse(bytes.NewReader(fixture(t, "llmd_sim_v0.10.2_lora_active.txt")), 0)
	if err != nil {
		t.Fatal(err)
	}
	l := r.LoRA
	if l == nil || l.MaxLoRA != 2 || !slices.Equal(l.Running, []string{"ada", "cyd"}) || !slices.Equal(l.Waiting, []string{"ada", "bob"}) {
		t.Fatalf("active: %+v", l)
	}
	if !l.Active("bob") || l.Active("dan") {
		t.Errorf("Active wrong: %+v", l)
	}
	if r.Known&(HasRunning|HasWaiting) != HasRunning|HasWaiting {
		t.Errorf("the load figures went: %v", r.Known)
	}
	r, err = Parse(bytes.NewReader(fixture(t, "llmd_sim_v0.10.2_lora_idle.txt")), 0)
	if err != nil {
		t.Fatal(err)
	}
	// The newest second holds the idle series and ada's (it ran within that second).
	if l := r.LoRA; l == nil || !slices.Equal(l.Running, []string{"ada"}) || len(l.Waiting) != 0 || l.At.Unix() != 1796196784 {
		t.Fatalf("idle: %+v", r.LoRA)
	}
}

func TestLoRAInfoBadInput(t *testing.T) {
	page := func(series ...string) string {
		return "# TYPE vllm:lora_requests_info gauge\n" + strings.Join(series, "\n") + "\n" +
			"vllm:num_requests_running 1\n"
	}
	for _, tc := range []struct {
		name, page string
		want       *LoRAInfo
	}{
		{"newest wins", page(`vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""} 10.5`,
			`vllm:lora_requests_info{max_lora="2",running_lora_adapters="b,c",waiting_lora_adapters="d"} 11.25`),
			&LoRAInfo{Running: []string{"b", "c"}, Waiting: []string{"d"}, MaxLoRA: 2}},
		{"bad values dropped", page(`vllm:lora_requests_info{max_lora="x",running_lora_adapters="a"} NaN`,
			`vllm:lora_requests_info{max_lora="-1",running_lora_adapters=" b ,,b"} 3`),
			&LoRAInfo{Running: []string{"b"}, Waiting: []string{}}},
		{"all invalid", page(`vllm:lora_requests_info{running_lora_adapters="a"} -1`), nil},
		{"no labels says nothing", page(`vllm:lora_requests_info{} 20`, `vllm:lora_requests_info{max_lora="1"} 5`),
			&LoRAInfo{Running: []string{}, Waiting: []string{}, MaxLoRA: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse(strings.NewReader(tc.page), 0)
			if err != nil {
				t.Fatal(err)
			}
			got := r.LoRA
			if (got == nil) != (tc.want == nil) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if got != nil && (!slices.Equal(got.Running, tc.want.Running) || !slices.Equal(got.Waiting, tc.want.Waiting) || got.MaxLoRA != tc.want.MaxLoRA) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	// A page with nothing but an unlabelled series is no reading (the fuzzer found it accepted).
	if r, err := Parse(strings.NewReader("vllm:lora_requests_info{}0"), 0); err == nil {
		t.Errorf("unlabelled lora_requests_info alone accepted: %+v", r)
	}
	// Many series, many adapters: bounded, and the load figures still read.
	var b strings.Builder
	b.WriteString("# TYPE vllm:lora_requests_info gauge\n")
	for i := range 6000 {
		fmt.Fprintf(&b, "vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"%s\",waiting_lora_adapters=\"\"} %d\n",
			strings.Repeat(fmt.Sprintf("a%d,", i), 100), 1000+i%50)
	}
	b.WriteString("vllm:num_requests_running 7\n")
	r, err := Parse(strings.NewReader(b.String()), 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Running != 7 || r.LoRA == nil || len(r.LoRA.Running) > MaxActiveAdapters || r.Ignored < 6000-maxLoRASeries {
		t.Errorf("running %d, lora %d adapters, ignored %d", r.Running, len(r.LoRA.Running), r.Ignored)
	}
}

// The Scraper reads /v1/models beside /metrics, with the configured header on both, at its
// own pace; a list that changes is read again; an unreadable one keeps the last list and
// counts.
func TestScraperReadsModels(t *testing.T) {
	var mu sync.Mutex
	list := `{"object":"list","data":[{"id":"base"},{"id":"ada","parent":"base"}]}`
	var metricsAuth, modelsAuth []string
	var modelReads int
	ts := serve(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case "/metrics":
			metricsAuth = append(metricsAuth, r.Header.Get("Authorization"))
			fmt.Fprintln(w, "vllm:num_requests_running 1")
		case "/v1/models":
			modelsAuth = append(modelsAuth, r.Header.Get("Authorization"))
			modelReads++
			fmt.Fprint(w, list)
		}
	})
	opts := fast
	opts.ModelsEvery = 50 * time.Millisecond
	opts.Header = http.Header{"Authorization": {"Bearer sekrit"}}
	s := newScraper(t, opts)
	start := time.Now()
	if err := s.Add(Target{Key: "k", URL: ts.URL + "/metrics"}); err != nil {
		t.Fatal(err)
	}
	has := func(id string) func() bool {
		return func() bool {
			snap := s.Snapshot("k")
			return snap != nil && snap.Models != nil && slices.ContainsFunc(snap.Models.Models, func(m ServedModel) bool { return m.ID == id })
		}
	}
	waitFor(t, "the first list", has("ada"))
	mu.Lock()
	list = `{"data":[{"id":"base"},{"id":"bob","parent":"base"}]}`
	mu.Unlock()
	waitFor(t, "the changed list", has("bob"))
	if has("ada")() {
		t.Error("the old adapter stayed in the list")
	}
	mu.Lock()
	list = `{"data": garbled`
	// Its own pace: a read, then one at most every 0.9 × ModelsEvery (the jitter) while the
	// reads succeed, however long a loaded machine made this test take so far.
	reads, in := modelReads, time.Since(start)
	mu.Unlock()
	if most := 1 + int(in/(opts.ModelsEvery*9/10)); reads > most {
		t.Errorf("%d reads of /v1/models in %v: more than one every 0.9 × %v (%d); /metrics was read %d times", reads, in, opts.ModelsEvery, most, len(metricsAuth))
	}
	waitFor(t, "a garbled read", func() bool { return s.Snapshot("k").ModelsCounts[OutcomeGarbled] > 0 })
	if snap := s.Snapshot("k"); !has("bob")() || snap.ModelsOutcome != OutcomeGarbled || snap.ModelsError == "" {
		t.Errorf("after a garbled read: outcome %v, error %q, models %+v", snap.ModelsOutcome, snap.ModelsError, snap.Models)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range append(metricsAuth, modelsAuth...) {
		if a != "Bearer sekrit" {
			t.Fatalf("a request came with Authorization %q", a)
		}
	}
}

// Without ModelsEvery, no /v1/models request.
func TestScraperModelsOff(t *testing.T) {
	var mu sync.Mutex
	paths := map[string]int{}
	ts := serve(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths[r.URL.Path]++
		mu.Unlock()
		fmt.Fprintln(w, "vllm:num_requests_running 1")
	})
	s := newScraper(t, fast)
	if err := s.Add(Target{Key: "k", URL: ts.URL + "/metrics"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "five scrapes", func() bool { return s.Snapshot("k") != nil && s.Snapshot("k").Counts[OutcomeOK] >= 5 })
	mu.Lock()
	defer mu.Unlock()
	if paths["/v1/models"] != 0 {
		t.Errorf("paths %v", paths)
	}
}

// A restart (a new process start time) reads the list again at once, not ModelsEvery later.
func TestScraperReadsModelsAgainAfterRestart(t *testing.T) {
	var mu sync.Mutex
	start, list := 1.7e9, `{"data":[{"id":"before"}]}`
	ts := serve(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, list)
			return
		}
		fmt.Fprintf(w, "vllm:num_requests_running 1\nprocess_start_time_seconds %v\n", start)
	})
	opts := fast
	opts.ModelsEvery = time.Hour
	s := newScraper(t, opts)
	if err := s.Add(Target{Key: "k", URL: ts.URL + "/metrics"}); err != nil {
		t.Fatal(err)
	}
	listed := func(id string) func() bool {
		return func() bool {
			snap := s.Snapshot("k")
			return snap != nil && snap.Models != nil && slices.ContainsFunc(snap.Models.Models, func(m ServedModel) bool { return m.ID == id })
		}
	}
	waitFor(t, "the first list", listed("before"))
	mu.Lock()
	list = `{"data":[{"id":"after"}]}`
	mu.Unlock()
	waitFor(t, "five more scrapes", func() bool { return s.Snapshot("k").Counts[OutcomeOK] >= 6 })
	if !listed("before")() {
		t.Fatal("the list was read again without a restart")
	}
	mu.Lock()
	start += 60
	mu.Unlock()
	waitFor(t, "the list read again after the restart", listed("after"))
	if n := s.Snapshot("k").ModelsCounts[OutcomeOK]; n != 2 {
		t.Errorf("%d reads of the list, want 2", n)
	}
}

// TestModelListOllama: Ollama lists a model with its tag (tiny:latest, as v0.6.5's /v1/models
// answers), and serves "tiny" as tiny:latest: Find names it either way.
func TestModelListOllama(t *testing.T) {
	page := `{"object":"list","data":[{"id":"tiny:latest","object":"model","created":1796460909,"owned_by":"library"},` +
		`{"id":"llama3.2:3b","object":"model","created":1796460909,"owned_by":"library"}]}`
	l, err := ParseModels([]byte(page))
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{
		"tiny": true, "tiny:latest": true, "llama3.2:3b": true,
		"llama3.2": false, "tin": false, "tiny:7b": false, "": false,
	} {
		if _, got := l.Find(id); got != want {
			t.Errorf("Find(%q) = %v, want %v", id, got, want)
		}
	}
}
