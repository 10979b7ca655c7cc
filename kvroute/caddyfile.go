package kvroute

import (
	"time"

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
//		session_cookie         kvroute_session [<secret>]   # secret: >= 16 bytes, e.g. {env.KVROUTE_COOKIE_SECRET}
//		session_ttl            30m
//		max_sessions           100000
//		expected_tokens        256
//		fallback               joule        # joule | carbon | least_busy | round_robin | random
//		decision               thresholds   # thresholds | cost (docs/decision.md)
//		objective              latency      # latency | completion | energy | carbon (decision cost)
//		ttft_slack             5            # decision cost: a session stays while its TTFT is within (1+this) × the best move's
//		explain_header         X-Kvroute-Decision   # off unless given
//		telemetry {                         # on by default; `telemetry off` disables it
//			path     /metrics               # on each upstream's own host:port
//			interval 1s
//			timeout  500ms
//			auth_header "Bearer {env.VLLM_API_KEY}"   # optional: sent on every read (never logged)
//		}
//		cluster nats://10.0.0.9:4222 [<url>...] {   # off unless given; process-wide
//			name   fleet-a                          # required: replicas of one fleet share it
//			secret {env.KVROUTE_CLUSTER_SECRET}     # required, >= 16 bytes
//			creds  /etc/nats/kvroute.creds          # optional
//			tls_ca /etc/nats/ca.pem                 # optional, for tls:// URLs
//		}
//		upstream 10.0.0.1:8000 {
//			accelerator              gpu    # gpu | cpu | tpu | npu | other
//			models                   llama-3.1-8b qwen*
//			max_concurrency          64
//			energy_per_token         150uJ  # J, mJ, uJ (µJ), nJ
//			prefill_energy_per_token 20uJ
//			carbon_intensity         56     # gCO2e/kWh
//			zone                     EU-FR
//			kv_capacity              2M     # tokens; default: what telemetry reads
//			metrics_url              http://10.0.0.1:8000/metrics
//			continuous_batching
//			paged_kv
//		}
//		queue_timeout 10s               # wait at the router while every upstream is full; 0: never
//		flow_control {                  # off unless given: who waits first (flowcontrol.go)
//			tenant   {http.request.header.X-Tenant}
//			priority {http.request.header.X-Priority}
//			band interactive {
//				queue_timeout 10s
//			}
//			band batch {
//				queue_timeout 5m
//			}
//			max_queued            10000
//			max_queued_per_tenant 1000
//			output_weight         2
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
		if err := p.unmarshalOption(d, opt); err != nil {
			return err
		}
		if opt == "upstream" {
			continue
		}
		if zeroGiven(p, opt) {
			// In JSON an absent option is zero and means the default; a Caddyfile says so by
			// leaving the option out.
			return d.Errf("%s: must be positive", opt)
		}
		// The same check Provision runs for JSON configs, here with the option's file:line.
		s := p.settings(false)
		if err := s.check(opt); err != nil {
			return d.Err(err.Error())
		}
	}
	return nil
}

// zeroGiven reports whether opt, just read, is one whose zero value means "the default".
func zeroGiven(p *KVCacheAware, opt string) bool {
	switch opt {
	case "eviction_interval":
		return p.EvictionInterval == 0
	case "max_tree_size":
		return p.MaxTreeSize == 0
	case "session_ttl":
		return p.SessionTTL == 0
	case "max_sessions":
		return p.MaxSessions == 0
	case "expected_tokens":
		return p.ExpectedTokens == 0
	}
	return false
}

// unmarshalOption reads the option opt that d is on into p.
func (p *KVCacheAware) unmarshalOption(d *caddyfile.Dispenser, opt string) error {
	var err error
	switch opt {
	case "cache_threshold":
		var v float64
		v, err = kvcf.FloatArg(d)
		p.CacheThreshold = &v
	case "balance_abs_threshold":
		var v int
		v, err = kvcf.IntArg(d)
		p.BalanceAbsThreshold = &v
	case "balance_rel_threshold":
		var v float64
		v, err = kvcf.FloatArg(d)
		p.BalanceRelThreshold = &v
	case "on_imbalance":
		p.OnImbalance, err = kvcf.StringArg(d)
	case "eviction_interval":
		var v time.Duration
		v, err = kvcf.DurationArg(d)
		p.EvictionInterval = caddy.Duration(v)
	case "max_tree_size":
		p.MaxTreeSize, err = kvcf.SizeArg(d)
	case "session_header":
		p.SessionHeader, err = kvcf.StringArg(d)
	case "session_cookie":
		args := d.RemainingArgs()
		if len(args) > 2 {
			return d.Errf("session_cookie: expected [name] [secret], got %d arguments", len(args))
		}
		c := &SessionCookie{}
		if len(args) > 0 {
			c.Name = args[0]
		}
		if len(args) > 1 {
			if args[1] == "" {
				// "{$VAR}" of an unset variable, which the Caddyfile replaced before this
				// ran: an empty secret would turn signing off without a word.
				return d.Errf("session_cookie: the secret is empty (an unset {$VAR}?): give one of 16 bytes or more (openssl rand -base64 32), {env.VAR} to read it when the config loads, or no secret for unsigned ids")
			}
			c.Secret = args[1]
		}
		p.SessionCookie = c
	case "session_ttl":
		var v time.Duration
		v, err = kvcf.DurationArg(d)
		p.SessionTTL = caddy.Duration(v)
	case "max_sessions":
		p.MaxSessions, err = kvcf.IntArg(d)
	case "expected_tokens":
		p.ExpectedTokens, err = kvcf.IntArg(d)
	case "fallback":
		p.Fallback, err = kvcf.StringArg(d)
	case "decision":
		p.Decision, err = kvcf.StringArg(d)
	case "objective":
		p.Objective, err = kvcf.StringArg(d)
	case "ttft_slack":
		var v float64
		v, err = kvcf.FloatArg(d)
		p.TTFTSlack = &v
	case "explain_header":
		p.ExplainHeader, err = kvcf.StringArg(d)
	case "telemetry":
		err = p.unmarshalTelemetry(d)
	case "cluster":
		p.Cluster, err = parseCluster(d)
	case "queue_timeout":
		var v time.Duration
		v, err = kvcf.DurationArg(d)
		cd := caddy.Duration(v)
		p.QueueTimeout = &cd
	case "flow_control":
		p.FlowControl, err = parseFlowControl(d)
	case "upstream":
		addr, prof, perr := kvcf.ParseUpstream(d)
		if perr != nil {
			return perr
		}
		if p.Upstreams == nil {
			p.Upstreams = make(map[string]energy.Profile)
		}
		if _, dup := p.Upstreams[addr]; dup {
			return d.Errf("upstream %s: given twice", addr)
		}
		p.Upstreams[addr] = prof
	default:
		return d.Err(unknownOption(opt).Error())
	}
	return err
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
				return d.Err(unknownIn("llm_prompt", d.Val(), []string{"max_body", "model", "models"}).Error())
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
