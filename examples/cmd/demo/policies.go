package main

import (
	"fmt"
	"slices"
	"strings"
)

// Caddy module IDs the demo looks for in `caddy list-modules`.
const (
	policyModulePrefix = "http.reverse_proxy.selection_policies."
	moduleKV           = policyModulePrefix + "kv_cache_aware"
	moduleMatcher      = "http.matchers.llm_prompt"
	moduleFeedback     = "http.handlers.llm_feedback"
)

// policy is one contender: an lb_policy line (and block) of the generated Caddyfile.
type policy struct {
	Name   string   // short name, as given to -policies and shown in the table
	Module string   // selection policy module name (after policyModulePrefix)
	Args   []string // arguments after the module name on the lb_policy line
	Block  []string // lines inside the lb_policy block
	Peer   bool     // a benchmark-only peer from examples/peers

	// -replicas: behind a front Caddy, on this many replicas (0: Caddy alone, no front),
	// sharing over NATS when Cluster; Suffix tells the variants apart in the tables.
	Replicas int
	Cluster  bool
	Outage   bool // -nats-outage: NATS is stopped mid-run and started again
	Late     bool // -late-replica: the last replica starts mid-run
	Suffix   string
	// Variant: kv_cache_aware with one option set, run only when -policies names it.
	Variant bool
	// Feedback puts `llm_feedback @llm` in the site, ahead of the policy's reverse_proxy
	// (-compare-feedback).
	Feedback bool
}

// title is the policy as the tables show it: its label and the replicas variant.
func (p policy) title() string { return p.label() + p.Suffix }

// label is the policy as shown in tables: the lb_policy line without the block.
func (p policy) label() string {
	return strings.Join(append([]string{p.Module}, p.Args...), " ")
}

// allPolicies returns the contenders in table order. kv_cache_aware gets the -kv-options lines.
func allPolicies(kvOptions []string) []policy {
	return []policy{
		{Name: "kv_cache_aware", Module: "kv_cache_aware", Block: kvOptions},
		{Name: "sglang_cache_aware", Module: "sglang_cache_aware", Peer: true},
		{Name: "prefix_hash", Module: "prefix_hash", Peer: true},
		{Name: "round_robin", Module: "round_robin"},
		{Name: "least_conn", Module: "least_conn"},
		{Name: "random", Module: "random"},
		{Name: "header", Module: "header", Args: []string{"X-Session-ID"}},
	}
}

// variantPolicies returns kv_cache_aware with one option set, run only when -policies names
// them.
func variantPolicies(kvOptions []string) []policy {
	return []policy{
		{Name: "kv_cost", Module: "kv_cache_aware", Block: append(slices.Clone(kvOptions), "decision cost"), Suffix: " (decision cost)", Variant: true},
		{Name: "kv_thresholds", Module: "kv_cache_aware", Block: append(slices.Clone(kvOptions), "decision thresholds"), Suffix: " (decision thresholds)", Variant: true},
		// Without -energy's annotations every upstream costs the same joules and this is
		// kv_cost.
		{Name: "kv_energy", Module: "kv_cache_aware", Block: append(slices.Clone(kvOptions), "decision cost", "objective energy"), Suffix: " (objective energy)", Variant: true},
		// kv_cache_aware with issue 35's flow control: tenants and bands from the requests'
		// headers (the flow workloads send them). A default run of a flow workload adds it.
		{Name: "kv_flow", Module: "kv_cache_aware", Block: append(slices.Clone(kvOptions), flowControlBlock...), Suffix: " (flow_control)", Variant: true},
	}
}

// flowControlBlock is kv_flow's flow_control block, as issue 35 sketches it: the tenant from
// X-Tenant, the band from X-Priority, an interactive band that sheds after 10 s of waiting
// and a batch band after 5 minutes. The sketch's one-line band blocks
// (`band batch { queue_timeout 5m }`) are not Caddyfile: a block's contents start on the line
// after its "{".
var flowControlBlock = []string{
	"flow_control {",
	"\ttenant   {http.request.header.X-Tenant}",
	"\tpriority {http.request.header.X-Priority}",
	"\tband interactive {",
	"\t\tqueue_timeout 10s",
	"\t}",
	"\tband batch {",
	"\t\tqueue_timeout 5m",
	"\t}",
	"}",
}

// selectPolicies returns the policies to compare: those named by -policies (all by default)
// that the Caddy binary has. A default run skips the missing peers with a note; a policy named
// explicitly and missing is an error.
func selectPolicies(cfg *config, bin *caddyBinary) ([]policy, []string, error) {
	all := allPolicies(cfg.kvOptions)
	if strings.TrimSpace(cfg.policies) == "none" || cfg.sweep {
		return nil, nil, nil
	}
	if !bin.has(moduleMatcher) {
		return nil, nil, fmt.Errorf("%s has no %s module: build it with ./xcaddy.sh build", cfg.caddy, moduleMatcher)
	}
	var notes []string
	if cfg.policies == "" {
		var out, missing []policy
		if cfg.defaultPolicies != nil {
			all = slices.DeleteFunc(all, func(p policy) bool { return !slices.Contains(cfg.defaultPolicies, p.Name) })
		}
		for _, p := range all {
			if bin.has(policyModulePrefix + p.Module) {
				out = append(out, p)
			} else {
				missing = append(missing, p)
			}
		}
		if len(cfg.flow) > 0 && bin.has(moduleKV) {
			// The flow workloads compare kv_cache_aware with and without flow control.
			vs := variantPolicies(cfg.kvOptions)
			flow := vs[slices.IndexFunc(vs, func(p policy) bool { return p.Name == "kv_flow" })]
			i := slices.IndexFunc(out, func(p policy) bool { return p.Name == "kv_cache_aware" })
			out = slices.Insert(out, i+1, flow)
		}
		for _, p := range missing {
			hint := ""
			if p.Peer {
				hint = " (a benchmark-only peer: ./xcaddy.sh demo builds a Caddy with it)"
			}
			notes = append(notes, fmt.Sprintf("%s skipped: %s has no %s module%s", p.Name, cfg.caddy, p.Module, hint))
		}
		return out, notes, nil
	}
	var out []policy
	all = append(all, variantPolicies(cfg.kvOptions)...)
	for _, name := range strings.Split(cfg.policies, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		// A name wins over a label: the variants kv_cost, kv_thresholds and kv_energy share
		// the label kv_cache_aware, and the last of them must not stand in for it.
		// "kv_cost:ttft_slack 1; balance_abs_threshold 2": the policy with these lines added
		// to its block, so that settings compare in one run (-kv-options sets them for all).
		base, extra, hasLines := strings.Cut(name, ":")
		base = strings.TrimSpace(base)
		i := slices.IndexFunc(all, func(p policy) bool { return p.Name == base })
		if i < 0 {
			i = slices.IndexFunc(all, func(p policy) bool { return p.label() == base })
		}
		if i < 0 {
			names := make([]string, len(all))
			for j, p := range all {
				names[j] = p.Name
			}
			return nil, nil, fmt.Errorf("-policies: unknown policy %q (want some of %s, or none)", name, strings.Join(names, ", "))
		}
		p := all[i]
		if !bin.has(policyModulePrefix + p.Module) {
			return nil, nil, fmt.Errorf("-policies: %s has no %s module", cfg.caddy, policyModulePrefix+p.Module)
		}
		if hasLines {
			lines := splitOptions(extra)
			if p.Module != "kv_cache_aware" || len(lines) == 0 {
				return nil, nil, fmt.Errorf("-policies: %q: only kv_cache_aware and its variants take lines after \":\", and at least one", name)
			}
			p.Name = base + ":" + strings.Join(lines, "; ")
			if slices.ContainsFunc(out, func(q policy) bool { return q.Name == p.Name }) {
				return nil, nil, fmt.Errorf("-policies: %q named twice", p.Name)
			}
			p.Block = withLines(p.Block, lines)
			p.Suffix = strings.TrimSuffix(p.Suffix, ")")
			if p.Suffix == "" {
				p.Suffix = " ("
			} else {
				p.Suffix += "; "
			}
			p.Suffix += strings.Join(lines, "; ") + ")"
			p.Variant = true
		}
		out = append(out, p)
	}
	return out, notes, nil
}

// withLines returns block with lines added, each in place of a line of block that sets the
// same option (its first word): a Caddyfile block refuses an option given twice, and the
// lines after a policy's colon are meant to override -kv-options and the variant's own.
func withLines(block, lines []string) []string {
	out := slices.Clone(block)
	for _, l := range lines {
		opt := strings.Fields(l)[0]
		if i := slices.IndexFunc(out, func(b string) bool { f := strings.Fields(b); return len(f) > 0 && f[0] == opt }); i >= 0 {
			out[i] = l
		} else {
			out = append(out, l)
		}
	}
	return out
}
