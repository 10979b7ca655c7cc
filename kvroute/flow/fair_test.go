package flow

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// Declared output limits a client may send: the largest max_tokens a 32-bit engine accepts,
// one vLLM accepts, and none (0).
var declared = []int64{2147483647, 100000, 0}

// fairRun plays two backlogged tenants through q with slots requests in flight at most, and
// returns how many of the first n dispatches from the queue each got. Every request uses the
// same real tokens (prompt 100, output 50); what each declares as max_tokens differs. As in
// the issue, the attacker's first request goes to an idle fleet (charged at dispatch, never
// waiting) before both tenants' backlogs arrive. Requests end in a random order (seeded);
// an answer's usage settles its request before its slot frees, as llm_feedback's does in
// Caddy.
func fairRun(q *Queue, seed uint64, slots, n int, attacker, victim int64) map[string]int {
	const prompt, output, weight, expected = 100.0, 50.0, 2.0, 256.0
	type flight struct {
		tenant  string
		charged float64
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	var running []flight
	dispatch := func(tenant string, maxTokens int64) {
		c := fairCharge(q, tenant, prompt, maxTokens, expected, weight)
		running = append(running, flight{tenant, c})
	}
	decl := map[string]int64{"attacker": attacker, "victim": victim}
	dispatch("attacker", attacker)
	for i := range n {
		q.Push(&Item{Model: "m", Tenant: "attacker", Value: i})
		q.Push(&Item{Model: "m", Tenant: "victim", Value: i})
	}
	got := map[string]int{}
	for done := 0; done < n; {
		for len(running) < slots && done < n {
			it := q.Next(all)
			if it == nil {
				break
			}
			got[it.Tenant]++
			done++
			dispatch(it.Tenant, decl[it.Tenant])
		}
		i := rng.IntN(len(running))
		f := running[i]
		running = append(running[:i], running[i+1:]...)
		fairSettle(q, f.tenant, f.charged, prompt+weight*output)
	}
	return got
}

// Two backlogged tenants with the same real usage get the same share of the dispatches,
// whatever each declares as max_tokens: no declared figure buys precedence beyond what the
// answers show was used (issue 40, item 1).
func TestFairShareWhateverDeclared(t *testing.T) {
	for _, slots := range []int{1, 4} {
		for _, a := range declared {
			for _, v := range declared {
				t.Run(fmt.Sprintf("slots=%d/attacker=%d/victim=%d", slots, a, v), func(t *testing.T) {
					for seed := range uint64(3) {
						got := fairRun(New(Config{}), seed, slots, 200, a, v)
						t.Logf("seed %d: victim %d, attacker %d", seed, got["victim"], got["attacker"])
						if got["victim"] < 90 || got["victim"] > 110 {
							t.Errorf("seed %d: of the first 200 dispatches the victim got %d, the attacker %d; want 100 ± 10 each",
								seed, got["victim"], got["attacker"])
						}
					}
				})
			}
		}
	}
}

// fairCharge charges a dispatched request as kvroute's Select does, and returns the charge.
func fairCharge(q *Queue, tenant string, prompt float64, maxTokens int64, expected, weight float64) float64 {
	c := Estimate(prompt, int(maxTokens), expected, weight)
	q.Charge(tenant, c)
	return c
}

// fairSettle replaces a request's charge by what its answer shows was used.
func fairSettle(q *Queue, tenant string, charged, used float64) {
	q.Settle(tenant, charged, used)
}

// A tenant that starts waiting is lifted to the others' settled tokens, not to what they have
// pending: a pending estimate that the answer corrects down must not stay in the lift.
func TestLiftIgnoresPending(t *testing.T) {
	q := New(Config{})
	q.Serve("a", 1000)
	q.Charge("a", 4e9) // in flight: an estimate its answer will correct
	push(t, q, "m", "a", 0, 1)
	push(t, q, "m", "v", 0, 2)
	if settled, pending := q.Served("v"); settled != 1000 || pending != 0 {
		t.Fatalf("v lifted to %v (+%v pending), want a's settled 1000", settled, pending)
	}
	q.Settle("a", 4e9, 20) // the answer: 20 used
	if settled, pending := q.Served("a"); settled != 1020 || pending != 0 {
		t.Fatalf("a after its answer: %v + %v pending, want 1020 + 0", settled, pending)
	}
	if it := q.Next(all); it.Value != 2 {
		t.Fatalf("first %v, want v's 2 (a was served 20 more)", it.Value)
	}
	// While a request is in flight its estimate counts in the order: v's goes after a's.
	push(t, q, "m", "v", 0, 3)
	q.Charge("v", 100)
	if it := q.Next(all); it.Value != 1 {
		t.Fatalf("second %v, want a's 1 (v has 100 pending)", it.Value)
	}
}

func TestEstimate(t *testing.T) {
	for _, c := range []struct {
		prompt    float64
		maxTokens int
		expected  float64
		want      float64
	}{
		{100, 0, 256, 100 + 2*256},          // none declared: the expectation
		{100, 2147483647, 256, 100 + 2*256}, // more declared: the expectation
		{100, 16, 256, 100 + 2*16},          // less declared: the engine stops there
		{100, 0, math.NaN(), 100},           // no expectation: the prompt alone
		{-5, 0, 256, 2 * 256},
	} {
		if got := Estimate(c.prompt, c.maxTokens, c.expected, 2); got != c.want {
			t.Errorf("Estimate(%v, %d, %v, 2) = %v, want %v", c.prompt, c.maxTokens, c.expected, got, c.want)
		}
	}
}

// A tenant with a request in flight is not forgotten when the tenants' bound is reached: its
// answer settles where it was charged.
func TestInFlightTenantKept(t *testing.T) {
	q := New(Config{MaxTenants: 10})
	q.Charge("flying", 500)
	for i := range 100 {
		q.Serve(fmt.Sprint("t", i), 1)
	}
	if _, pending := q.Served("flying"); pending != 500 {
		t.Fatalf("pending %v after many tenants, want 500 kept", pending)
	}
	q.Settle("flying", 500, 30)
	if settled, pending := q.Served("flying"); settled != 30 || pending != 0 {
		t.Fatalf("after its answer %v + %v, want 30 + 0", settled, pending)
	}
	// Settled, it may go like any idle tenant.
	for i := range 100 {
		q.Serve(fmt.Sprint("u", i), 1)
	}
	if settled, _ := q.Served("flying"); settled != 0 {
		t.Fatalf("an idle tenant kept beyond the bound (%v)", settled)
	}
}
