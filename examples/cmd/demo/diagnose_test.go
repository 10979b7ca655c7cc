package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/fleetsim"
)

// TestDiagnose runs -diagnose through the Caddy in KVROUTE_CADDY on a small chat workload:
// every request of every run has a record; kv_cache_aware's carry what it believed of each
// worker (from its decision trace) and say it chose the worker the request arrived at; every
// record has what each worker held and the request's TTFT at the client and at its engine.
func TestDiagnose(t *testing.T) {
	path := os.Getenv("KVROUTE_CADDY")
	if path == "" {
		t.Skip("KVROUTE_CADDY not set: no Caddy binary to run")
	}
	out := filepath.Join(t.TempDir(), "decisions.jsonl")
	cfg, err := parseFlags([]string{"-caddy", path, "-policies", "kv_cache_aware,round_robin", "-conversations", "6", "-turns", "3",
		"-concurrency", "4", "-walkthrough=false", "-report", "", "-diagnose", "-decisions", out})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type line struct {
		Policy string `json:"policy"`
		fleetsim.DecisionRecord
	}
	per := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		per[l.Policy]++
		r := &l.DecisionRecord
		if len(r.Truth) != 4 || r.Chosen < 0 || r.Chosen > 3 || r.ID == "" {
			t.Fatalf("%s: record %+v", l.Policy, r)
		}
		for i, tr := range r.Truth {
			if tr.Slots != 8 || tr.TTFT <= 0 {
				t.Errorf("%s %s: worker %d held %+v", l.Policy, r.ID, i, tr)
			}
		}
		if r.EngineTTFT <= 0 || r.TTFT < r.EngineTTFT {
			t.Errorf("%s %s: TTFT %v at the client, %v at the engine", l.Policy, r.ID, r.TTFT, r.EngineTTFT)
		}
		switch l.Policy {
		case "kv_cache_aware":
			if r.Path == "" || len(r.Believed) != 4 || !r.Believed[r.Chosen].Candidate || r.PromptChars == 0 {
				t.Errorf("kv_cache_aware %s: path %q, believed %+v (chosen %d)", r.ID, r.Path, r.Believed, r.Chosen)
			}
		default:
			if r.Path != "" || r.Believed != nil {
				t.Errorf("%s %s: path %q and beliefs %v without a decision trace", l.Policy, r.ID, r.Path, r.Believed)
			}
		}
	}
	if per["kv_cache_aware"] != 18 || per["round_robin"] != 18 {
		t.Errorf("records per policy %v, want 18 each (6 conversations of 3 turns)", per)
	}
}
