package kvroute

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// fairPolicy is flow_control by an X-Tenant header, with a band that waits long enough for a
// backlog of hundreds released one at a time under -race.
const fairPolicy = `flow_control {
				tenant {http.request.header.X-Tenant}
				band all {
					queue_timeout 5m
				}
			}`

// fairConfig is queueConfig (one upstream of max_concurrency 1) with fairPolicy and
// llm_feedback, so that each answer's usage settles its request.
func fairConfig(g *gated) string {
	cfg := queueConfig(g, fairPolicy, "")
	return strings.Replace(cfg, "\t@llm llm_prompt\n", "\t@llm llm_prompt\n\tllm_feedback\n", 1)
}

// withMaxTokens is a chat body that declares maxTokens (none when 0).
func withMaxTokens(prompt string, maxTokens int64) string {
	declared := ""
	if maxTokens > 0 {
		declared = fmt.Sprintf(`,"max_tokens":%d`, maxTokens)
	}
	return strings.Replace(chatBody("m", prompt), `,"max_tokens":16}`, declared+"}", 1)
}

// The order (issue 40, item 1): a tenant sends one request declaring max_tokens
// 2,147,483,647 to an idle fleet, then keeps requests waiting; a victim's requests arrive
// after. Every answer reports the same usage. The over-declared figure must buy the attacker
// nothing: once its first answer shows what it used, the victim's first request goes, and
// then the two alternate (a tie goes to the earlier request).
func TestFairShareOverDeclaredOrder(t *testing.T) {
	g := newGated(t)
	startCaddy(t, fairConfig(g))
	first := postAsync(context.Background(), "/v1/chat/completions", withMaxTokens("R1 declares the most an engine takes", 2147483647), "X-Req", "R1", "X-Tenant", "order-attacker")
	waitFor(t, func() bool { return len(g.arrived()) == 1 }, "R1 reaches the upstream")
	var chs []<-chan result
	for i := range 6 {
		id := fmt.Sprint("A", i)
		chs = append(chs, enqueue(t, "/v1/chat/completions", withMaxTokens("attacker "+id, 0), "X-Req", id, "X-Tenant", "order-attacker"))
	}
	for i := range 3 {
		id := fmt.Sprint("V", i)
		chs = append(chs, enqueue(t, "/v1/chat/completions", withMaxTokens("victim "+id, 0), "X-Req", id, "X-Tenant", "order-victim"))
	}
	g.releaseN(t, 10)
	mustOK(t, first)
	mustOK(t, chs...)
	if got, want := strings.Join(g.arrived(), ","), "R1,V0,A0,V1,A1,V2,A2,A3,A4,A5"; got != want {
		t.Errorf("order at the upstream %s, want %s", got, want)
	}
}

// The fairness property through Caddy (max_concurrency 1, llm_feedback): two backlogged
// tenants whose answers report the same usage get 100 ± 10 each of the first 200 dispatches,
// whatever each declares as max_tokens; the first request, from the one that declares more,
// went to an idle fleet before both backlogs arrived.
func TestFairShareWhateverDeclared(t *testing.T) {
	for _, c := range []struct{ attacker, victim int64 }{{2147483647, 0}, {100000, 0}, {0, 2147483647}} {
		t.Run(fmt.Sprintf("attacker=%d/victim=%d", c.attacker, c.victim), func(t *testing.T) {
			g := newGated(t)
			startCaddy(t, fairConfig(g))
			attacker, victim := fmt.Sprint("share-attacker-", c.attacker, "-", c.victim), fmt.Sprint("share-victim-", c.attacker, "-", c.victim)
			first := postAsync(context.Background(), "/v1/chat/completions", withMaxTokens("the first request", c.attacker), "X-Req", "first", "X-Tenant", attacker)
			waitFor(t, func() bool { return len(g.arrived()) == 1 }, "the first request reaches the upstream")
			const each = 200
			var chs []<-chan result
			for i := range each {
				chs = append(chs,
					postAsync(context.Background(), "/v1/chat/completions", withMaxTokens(fmt.Sprint("attacker ", i), c.attacker), "X-Req", "a", "X-Tenant", attacker),
					postAsync(context.Background(), "/v1/chat/completions", withMaxTokens(fmt.Sprint("victim ", i), c.victim), "X-Req", "v", "X-Tenant", victim))
			}
			waitFor(t, func() bool { return queued() == 2*each }, "both backlogs wait at the router")
			g.releaseN(t, 2*each+1)
			mustOK(t, first)
			mustOK(t, chs...)
			order := g.arrived()[1:201]
			n := strings.Count(strings.Join(order, ""), "v")
			t.Logf("of the first 200 dispatches: victim %d, attacker %d", n, 200-n)
			if n < 90 || n > 110 {
				t.Errorf("of the first 200 dispatches the victim got %d, the attacker %d; want 100 ± 10 each", n, 200-n)
			}
		})
	}
}
