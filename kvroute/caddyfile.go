package kvroute

import (
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	kvcf "github.com/kvroute/caddy-kvroute/caddyfile"
	"github.com/kvroute/caddy-kvroute/energy"
)

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax (every option is
// optional; the values shown are the defaults, except session_cookie, which is off unless given):
//
//	lb_policy kv_cache_aware {
//		cache_threshold        0.1
//		balance_abs_threshold  4
//		balance_rel_threshold  1.5
//		on_imbalance           prefix_in_band   # prefix_in_band | least_busy
//		eviction_interval      120s
//		max_tree_size          64Mi         # chars in all trees together (SI or binary suffix)
//		session_header         X-Session-ID
//		session_cookie         kvroute_session [<secret>]
//		session_ttl            30m
//		max_sessions           100000
//		expected_tokens        256
//		fallback               joule        # joule | carbon | least_busy | round_robin | random
//		upstream 10.0.0.1:8000 {
//			accelerator              gpu    # gpu | cpu | tpu | npu | other
//			models                   llama-3.1-8b qwen*
//			max_concurrency          64
//			energy_per_token         150uJ  # J, mJ, uJ (µJ), nJ
//			prefill_energy_per_token 20uJ
//			carbon_intensity         56     # gCO2e/kWh
//			zone                     EU-FR
//			kv_capacity              2M     # tokens
//			continuous_batching
//			paged_kv
//		}
//	}
func (p *KVCacheAware) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume policy name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := make(map[string]bool)
	for d.NextBlock(0) {
		opt := d.Val()
		if opt != "upstream" {
			if seen[opt] {
				return d.Errf("%s: given twice", opt)
			}
			seen[opt] = true
		}
		switch opt {
		case "cache_threshold":
			v, err := kvcf.FloatArg(d)
			if err != nil {
				return err
			}
			if v < 0 || v > 1 {
				return d.Errf("cache_threshold: must be between 0 and 1, got %v", v)
			}
			p.CacheThreshold = &v
		case "balance_abs_threshold":
			v, err := kvcf.IntArg(d)
			if err != nil {
				return err
			}
			if v < 0 {
				return d.Errf("balance_abs_threshold: must be >= 0, got %d", v)
			}
			p.BalanceAbsThreshold = &v
		case "balance_rel_threshold":
			v, err := kvcf.FloatArg(d)
			if err != nil {
				return err
			}
			if v < 1 {
				return d.Errf("balance_rel_threshold: must be >= 1, got %v", v)
			}
			p.BalanceRelThreshold = &v
		case "on_imbalance":
			v, err := kvcf.StringArg(d)
			if err != nil {
				return err
			}
			if v != "least_busy" && v != "prefix_in_band" {
				return d.Errf("on_imbalance: must be least_busy or prefix_in_band, got %q", v)
			}
			p.OnImbalance = v
		case "eviction_interval":
			v, err := kvcf.DurationArg(d)
			if err != nil {
				return err
			}
			if v <= 0 {
				return d.Errf("eviction_interval: must be positive")
			}
			p.EvictionInterval = caddy.Duration(v)
		case "max_tree_size":
			v, err := kvcf.SizeArg(d)
			if err != nil {
				return err
			}
			if v <= 0 {
				return d.Errf("max_tree_size: must be positive")
			}
			p.MaxTreeSize = v
		case "session_header":
			v, err := kvcf.StringArg(d)
			if err != nil {
				return err
			}
			p.SessionHeader = v
		case "session_cookie":
			args := d.RemainingArgs()
			if len(args) > 2 {
				return d.Errf("session_cookie: expected [name] [secret], got %d arguments", len(args))
			}
			c := &SessionCookie{}
			if len(args) > 0 {
				if strings.ContainsAny(args[0], " \t;,=\"") {
					return d.Errf("session_cookie: invalid cookie name %q", args[0])
				}
				c.Name = args[0]
			}
			if len(args) > 1 {
				c.Secret = args[1]
			}
			p.SessionCookie = c
		case "session_ttl":
			v, err := kvcf.DurationArg(d)
			if err != nil {
				return err
			}
			if v <= 0 {
				return d.Errf("session_ttl: must be positive")
			}
			p.SessionTTL = caddy.Duration(v)
		case "max_sessions":
			v, err := kvcf.IntArg(d)
			if err != nil {
				return err
			}
			if v <= 0 {
				return d.Errf("max_sessions: must be positive")
			}
			p.MaxSessions = v
		case "expected_tokens":
			v, err := kvcf.IntArg(d)
			if err != nil {
				return err
			}
			if v <= 0 {
				return d.Errf("expected_tokens: must be positive")
			}
			p.ExpectedTokens = v
		case "fallback":
			v, err := kvcf.StringArg(d)
			if err != nil {
				return err
			}
			if _, err := energy.ParseStrategy(v); err != nil {
				return d.Errf("fallback: %v", err)
			}
			p.Fallback = v
		case "upstream":
			addr, prof, err := kvcf.ParseUpstream(d)
			if err != nil {
				return err
			}
			if p.Upstreams == nil {
				p.Upstreams = make(map[string]energy.Profile)
			}
			if _, dup := p.Upstreams[addr]; dup {
				return d.Errf("upstream %s: given twice", addr)
			}
			p.Upstreams[addr] = prof
		default:
			return d.Errf("unrecognized kv_cache_aware option %q", opt)
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the matcher from Caddyfile tokens. Syntax:
//
//	@llm llm_prompt {
//		max_body 4MiB                # bytes read for routing; larger bodies pass through intact
//		model    llama-3.1-8b qwen*  # optional: match only these models (globs)
//	}
func (m *LLMPrompt) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	for d.Next() {
		if d.NextArg() {
			return d.ArgErr()
		}
		for d.NextBlock(0) {
			switch d.Val() {
			case "max_body":
				v, err := kvcf.SizeArg(d)
				if err != nil {
					return err
				}
				if v <= 0 {
					return d.Errf("max_body: must be positive")
				}
				m.MaxBody = v
			case "model", "models":
				args := d.RemainingArgs()
				if len(args) == 0 {
					return d.ArgErr()
				}
				m.Models = append(m.Models, args...)
			default:
				return d.Errf("unrecognized llm_prompt option %q", d.Val())
			}
		}
	}
	if err := m.Validate(); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

// Interface guards.
var (
	_ caddyfile.Unmarshaler    = (*KVCacheAware)(nil)
	_ caddyfile.Unmarshaler    = (*LLMPrompt)(nil)
	_ caddyhttp.RequestMatcher = (*LLMPrompt)(nil)
)
