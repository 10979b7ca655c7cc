package peers

import (
	"fmt"
	"math"
	weakrand "math/rand/v2"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/caddy-kvroute/examples/peerrules"
)

func init() {
	caddy.RegisterModule(new(PrefixHash))
}

// PrefixHash routes by a stateless hash of the prompt's first chars (peerrules.Rendezvous and
// peerrules.BoundedLoad, with xxhash), for benchmarks only: the
// available upstreams are ranked by rendezvous (highest random weight) hashing of the first
// prefix_chars chars of the routing text, and the request goes to the first of them whose
// in-flight count (as this policy counts them) is at most load_factor × (mean in-flight over
// the available upstreams + 1); when none is, to the first. A request without routing text
// goes to a random available upstream.
//
// This is the idea behind SGLang's prefix_hash policy and LiteLLM's prompt-prefix affinity.
// Two differences from SGLang: it hashes chars, not token ids (the router has no tokenizer),
// and it walks the rendezvous order instead of jumping to the least loaded upstream when the
// first choice is overloaded, so that an overloaded prefix spills to a stable second choice.
// Rendezvous hashing moves only the prefixes of an upstream that leaves or joins.
type PrefixHash struct {
	// Chars of routing text hashed. Default: 1000.
	PrefixChars int `json:"prefix_chars,omitempty"`
	// An upstream with more than load_factor × (mean + 1) requests in flight is passed over.
	// Default: 1.25.
	LoadFactor float64 `json:"load_factor,omitempty"`

	load      *inflight
	available func(*reverseproxy.Upstream) bool
}

// CaddyModule returns the Caddy module information.
func (*PrefixHash) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.prefix_hash",
		New: func() caddy.Module { return new(PrefixHash) },
	}
}

// Provision validates the options and fills in the defaults.
func (p *PrefixHash) Provision(caddy.Context) error { return p.setup() }

func (p *PrefixHash) setup() error {
	if p.PrefixChars == 0 {
		p.PrefixChars = peerrules.DefaultPrefixChars
	}
	if p.LoadFactor == 0 {
		p.LoadFactor = peerrules.DefaultLoadFactor
	}
	if p.PrefixChars < 0 {
		return fmt.Errorf("prefix_chars: %d is negative", p.PrefixChars)
	}
	if !(p.LoadFactor > 0) || math.IsInf(p.LoadFactor, 1) {
		return fmt.Errorf("load_factor: %v is not a finite number > 0", p.LoadFactor)
	}
	p.load = newInflight()
	if p.available == nil {
		p.available = (*reverseproxy.Upstream).Available
	}
	return nil
}

// Select returns the first upstream in the request's rendezvous order that is not overloaded.
func (p *PrefixHash) Select(pool reverseproxy.UpstreamPool, r *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	var avail []*reverseproxy.Upstream
	for _, u := range pool {
		if p.available(u) {
			avail = append(avail, u)
		}
	}
	if len(avail) == 0 {
		return nil
	}
	req := requestFor(r)
	if req.Text == "" {
		return p.load.acquire(r, req, avail[weakrand.IntN(len(avail))])
	}

	key := xxhash.Sum64String(peerrules.PrefixChars(req.Text, p.PrefixChars))
	order := rendezvous(avail, key)
	return p.load.acquire(r, req, order[peerrules.BoundedLoad(p.load.loads(order), p.LoadFactor)])
}

// rendezvous returns the upstreams in key's rendezvous order (peerrules.Rendezvous, with
// xxhash).
func rendezvous(upstreams []*reverseproxy.Upstream, key uint64) []*reverseproxy.Upstream {
	idx := peerrules.Rendezvous(dials(upstreams), key, xxhash.Sum64String)
	out := make([]*reverseproxy.Upstream, len(idx))
	for i, j := range idx {
		out[i] = upstreams[j]
	}
	return out
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy prefix_hash {
//		prefix_chars 1000
//		load_factor  1.25
//	}
func (p *PrefixHash) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // policy name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		opt := d.Val()
		if !d.NextArg() {
			return d.ArgErr()
		}
		val := d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
		switch opt {
		case "prefix_chars":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 {
				return d.Errf("prefix_chars: %q is not a whole number >= 1", val)
			}
			p.PrefixChars = n
		case "load_factor":
			f, err := strconv.ParseFloat(val, 64)
			if err != nil || !(f > 0) || math.IsInf(f, 1) {
				return d.Errf("load_factor: %q is not a finite number > 0", val)
			}
			p.LoadFactor = f
		default:
			return d.Errf("unrecognized prefix_hash option %q", opt)
		}
	}
	return nil
}

// Interface guards
var (
	_ reverseproxy.Selector = (*PrefixHash)(nil)
	_ caddy.Provisioner     = (*PrefixHash)(nil)
	_ caddyfile.Unmarshaler = (*PrefixHash)(nil)
)
