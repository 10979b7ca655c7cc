package caddyfile

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"

	cf "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/kvroute/caddy-kvroute/energy"
)

// upstreamOptions lists the options of an upstream block, for the error
// that names an unknown one.
const upstreamOptions = "accelerator, models, max_concurrency, energy_per_token, prefill_energy_per_token, " +
	"carbon_intensity, zone, kv_capacity, prefill_tokens_per_second, metrics_url, continuous_batching, paged_kv"

// ParseUpstream parses one upstream block into the upstream's dial address
// and its profile:
//
//	upstream <host:port> {
//		accelerator              gpu|cpu|tpu|npu|other
//		models                   <glob> [<glob>...]
//		max_concurrency          <requests>
//		energy_per_token         <energy>      # J, mJ, uJ, µJ or nJ
//		prefill_energy_per_token <energy>
//		carbon_intensity         <gCO2e/kWh>
//		zone                     <name>
//		kv_capacity              <tokens>      # SI or binary suffix: 2M, 512Ki
//		prefill_tokens_per_second <tokens/s>   # prior until learned from the engine
//		metrics_url              <url>         # http(s) URL of the engine's metrics
//		continuous_batching
//		paged_kv
//	}
//
// Every option is optional and may appear once; the block itself may be
// left out. The address is the upstream's dial address as Caddy holds it:
// host:port with no scheme, "unix//path" for a Unix socket, or anything
// with a placeholder, which is kept unchanged for runtime.
//
// d must be on the directive token ("upstream"), which is where a caller's
// loop leaves it:
//
//	for nesting := d.Nesting(); d.NextBlock(nesting); {
//		switch d.Val() {
//		case "upstream":
//			addr, profile, err := caddyfile.ParseUpstream(d)
//			...
//
// On success d is on the block's closing brace (or on the address when
// there is no block), so that the caller's loop goes on with its next
// option. Errors name the option and carry the file:line. Several blocks
// for one address are the caller's to reject.
func ParseUpstream(d *cf.Dispenser) (addr string, p energy.Profile, err error) {
	var none energy.Profile
	directive := d.Val()
	if directive == "" {
		return "", none, d.Err("upstream: the dispenser is not on the upstream directive")
	}
	if !d.NextArg() {
		return "", none, d.Errf("%s: missing address (want host:port)", directive)
	}
	addr = d.Val()
	if err := checkAddress(addr); err != nil {
		return "", none, d.Errf("%s: %v", directive, err)
	}
	if d.NextArg() {
		return "", none, d.Errf("%s %s: unexpected argument %q (one address per block)", directive, addr, d.Val())
	}
	prefix := directive + " " + addr

	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		option := d.Val()
		if seen[option] {
			return "", none, d.Errf("%s: %s: duplicate option", prefix, option)
		}
		seen[option] = true
		if err := parseUpstreamOption(d, option, &p); err != nil {
			return "", none, fmt.Errorf("%s: %w", prefix, err)
		}
	}
	// Each option was checked as it was read; this catches any rule that
	// spans fields, pointing at the end of the block.
	if err := p.Validate(); err != nil {
		return "", none, d.Errf("%s: %v", prefix, err)
	}
	return addr, p, nil
}

func parseUpstreamOption(d *cf.Dispenser, option string, p *energy.Profile) error {
	switch option {
	case "accelerator":
		s, err := StringArg(d)
		if err != nil {
			return err
		}
		a, err := energy.ParseAccelerator(s)
		if err != nil {
			return d.Errf("%s: %v", option, err)
		}
		p.Accelerator = a

	case "models":
		models := d.RemainingArgs()
		if len(models) == 0 {
			return d.Errf("%s: want at least 1 model name or glob", option)
		}
		for _, m := range models {
			if err := energy.ValidateModelPattern(m); err != nil {
				return d.Errf("%s: %v", option, err)
			}
		}
		if err := noBlock(d, option); err != nil {
			return err
		}
		p.Models = models

	case "max_concurrency":
		n, err := IntArg(d)
		if err != nil {
			return err
		}
		if n < 1 {
			return d.Errf("%s: must be >= 1, got %d (leave it out when unknown)", option, n)
		}
		p.MaxConcurrency = n

	case "energy_per_token":
		j, err := JoulesArg(d)
		if err != nil {
			return err
		}
		p.EnergyPerToken = j

	case "prefill_energy_per_token":
		j, err := JoulesArg(d)
		if err != nil {
			return err
		}
		p.PrefillEnergyPerToken = j

	case "carbon_intensity":
		f, err := FloatArg(d)
		if err != nil {
			return err
		}
		if f <= 0 {
			return d.Errf("%s: must be > 0 gCO2e/kWh, got %v (leave it out when unknown)", option, f)
		}
		p.CarbonIntensity = f

	case "zone":
		s, err := StringArg(d)
		if err != nil {
			return err
		}
		p.Zone = s

	case "kv_capacity":
		n, err := SizeArg(d)
		if err != nil {
			return err
		}
		if n < 1 {
			return d.Errf("%s: must be >= 1 token, got %d (leave it out when unknown)", option, n)
		}
		p.KVCapacity = n

	case "prefill_tokens_per_second":
		f, err := FloatArg(d)
		if err != nil {
			return err
		}
		if !(f > 0) || math.IsInf(f, 0) {
			return d.Errf("%s: must be a finite number of tokens per second > 0, got %v (leave it out when unknown)", option, f)
		}
		p.PrefillTokensPerSecond = f

	case "metrics_url":
		s, err := StringArg(d)
		if err != nil {
			return err
		}
		if err := energy.ValidateMetricsURL(s); err != nil {
			return d.Errf("%s: %v", option, err)
		}
		p.MetricsURL = s

	case "continuous_batching", "paged_kv":
		if d.NextArg() {
			return d.Errf("%s: takes no argument, got %q", option, d.Val())
		}
		if err := noBlock(d, option); err != nil {
			return err
		}
		if option == "paged_kv" {
			p.PagedKV = true
		} else {
			p.ContinuousBatching = true
		}

	default:
		return d.Errf("unknown option %q (want one of %s)", option, upstreamOptions)
	}
	return nil
}

// checkAddress accepts what Caddy holds as an upstream's dial address.
func checkAddress(addr string) error {
	switch {
	case strings.Contains(addr, "{"):
		return nil // a placeholder, known at runtime only
	case strings.HasPrefix(addr, "unix/"):
		if len(addr) == len("unix/") {
			return fmt.Errorf("invalid address %q: missing socket path", addr)
		}
		return nil
	case strings.Contains(addr, "://"):
		return fmt.Errorf("invalid address %q: want the dial address host:port, without a scheme", addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("invalid address %q: want host:port", addr)
	}
	if strings.ContainsAny(host, " \t\r\n/") {
		return fmt.Errorf("invalid address %q: bad host %q", addr, host)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("invalid address %q: port must be 1-65535", addr)
	}
	return nil
}
