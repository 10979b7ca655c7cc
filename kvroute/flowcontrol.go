package kvroute

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	kvcf "github.com/kvroute/caddy-kvroute/caddyfile"
)

// Defaults of the queue's options (docs/design.md "When the fleet is full").
const (
	// DefaultQueueTimeout is how long a request may wait at the router for a slot without
	// flow_control: 0, never. The fleet simulator's card measured late binding alone and it
	// did not pay (docs/simulator.md "Issue 34": chat-closed-64's goodput 0.42 of what it is
	// without it); flow_control's bands wait (DefaultBandTimeout).
	DefaultQueueTimeout = 0
	// DefaultBandTimeout is a band's queue_timeout when neither the band nor the policy gives
	// one: apart from DefaultQueueTimeout, so that turning late binding off by default leaves
	// flow_control's bands waiting (they would otherwise shed at once).
	DefaultBandTimeout = 10 * time.Second
	// DefaultMaxQueued bounds the requests waiting with flow_control, all flows together.
	DefaultMaxQueued = 10000
	// DefaultOutputWeight is what an output token costs against a prompt token in a tenant's
	// tokens served (the Virtual Token Counter's weights: 1 per input, 2 per output token).
	DefaultOutputWeight = 2.0
	// defaultBand names the one band of a queue without bands.
	defaultBand = "default"
	// defaultTenant names the tenant of requests without one (no tenant placeholder, or one
	// that is empty), in the queue, the admin API and the metrics alike.
	defaultTenant = "default"
	// maxTenantLen bounds a tenant name (a longer one is replaced by its digest).
	maxTenantLen = 128
	// tenantLabels is how many tenants the metrics and the admin API name: the most served;
	// the rest are summed as "other".
	tenantLabels = 20
)

// FlowControl decides who waits first when the fleet is full: each request belongs to a
// flow (tenant, band). The highest band with a waiting request goes first; inside a band, the
// tenant with the fewest tokens served; inside a tenant, arrival order per model.
type FlowControl struct {
	// The request's tenant (fairness id): a Caddy placeholder expression evaluated per request,
	// e.g. {http.auth.user.id} or {http.request.header.X-Tenant}. Default: one tenant.
	Tenant string `json:"tenant,omitempty"`
	// The request's band by name: a placeholder expression. Empty: the first band; a name no
	// band has: the last (lowest) band, so that a misspelled or forged value never outranks a
	// named band.
	Priority string `json:"priority,omitempty"`
	// Bands in priority order, highest first (at most 16). Default: one band, "default".
	Bands []FlowBand `json:"bands,omitempty"`
	// Requests waiting, all flows together. Default: 10000.
	MaxQueued int `json:"max_queued,omitempty"`
	// Requests of one tenant waiting. Default: no bound beyond max_queued.
	MaxQueuedPerTenant int `json:"max_queued_per_tenant,omitempty"`
	// What an output token weighs against a prompt token in tokens served. Default: 2.
	OutputWeight *float64 `json:"output_weight,omitempty"`
}

// FlowBand is one priority band.
type FlowBand struct {
	Name string `json:"name"`
	// How long its requests may wait before they are shed (429). Default: the policy's
	// queue_timeout when given and not 0, else 10s.
	QueueTimeout *caddy.Duration `json:"queue_timeout,omitempty"`
}

// flowSettings are flow_control's options with the defaults applied.
type flowSettings struct {
	tenant, priority string
	bands            []bandSettings
	maxQueued        int
	maxPerTenant     int
	outputWeight     float64
}

type bandSettings struct {
	name    string
	timeout time.Duration
}

// settings applies the defaults; queueTimeout is the policy's, nil when not given.
func (f *FlowControl) settings(given *caddy.Duration) *flowSettings {
	if f == nil {
		return nil
	}
	s := &flowSettings{
		tenant: f.Tenant, priority: f.Priority,
		maxQueued:    or(f.MaxQueued, DefaultMaxQueued),
		maxPerTenant: f.MaxQueuedPerTenant,
		outputWeight: valueOr(f.OutputWeight, DefaultOutputWeight),
	}
	// The policy's queue_timeout, when given and not 0, is its bands' default; 0 turns off
	// late binding without flow_control and leaves the bands their own default.
	queueTimeout := DefaultBandTimeout
	if given != nil && *given > 0 {
		queueTimeout = time.Duration(*given)
	}
	for _, b := range f.Bands {
		t := queueTimeout
		if b.QueueTimeout != nil {
			t = time.Duration(*b.QueueTimeout)
		}
		s.bands = append(s.bands, bandSettings{name: b.Name, timeout: t})
	}
	if len(s.bands) == 0 {
		s.bands = []bandSettings{{name: defaultBand, timeout: queueTimeout}}
	}
	return s
}

// checkFlow is flow_control's check.
func checkFlow(f *FlowControl) error {
	if f == nil {
		return nil
	}
	if len(f.Bands) > maxBands {
		return fmt.Errorf("at most %d bands, got %d", maxBands, len(f.Bands))
	}
	seen := map[string]bool{}
	for _, b := range f.Bands {
		if b.Name == "" {
			return errors.New("band: a band needs a name")
		}
		if seen[b.Name] {
			return fmt.Errorf("band %s: given twice", b.Name)
		}
		seen[b.Name] = true
		if b.QueueTimeout != nil && *b.QueueTimeout < 0 {
			return fmt.Errorf("band %s: queue_timeout: must be >= 0, got %v", b.Name, time.Duration(*b.QueueTimeout))
		}
	}
	if f.MaxQueued < 0 {
		return fmt.Errorf("max_queued: must be positive, got %d", f.MaxQueued)
	}
	if f.MaxQueuedPerTenant < 0 {
		return fmt.Errorf("max_queued_per_tenant: must be positive, got %d", f.MaxQueuedPerTenant)
	}
	if w := f.OutputWeight; w != nil && (!(*w >= 0) || math.IsInf(*w, 0)) {
		return fmt.Errorf("output_weight: must be a finite number >= 0, got %v", *w)
	}
	for _, e := range []struct{ name, v string }{{"tenant", f.Tenant}, {"priority", f.Priority}} {
		if strings.Count(e.v, "{") != strings.Count(e.v, "}") {
			return fmt.Errorf("%s: unbalanced braces in placeholder %q", e.name, e.v)
		}
	}
	return nil
}

// parseFlowControl reads a flow_control block. Syntax:
//
//	flow_control {
//		tenant   {http.request.header.X-Tenant}   # default: one tenant
//		priority {http.request.header.X-Priority} # a band's name; default: the first band
//		band interactive {                        # bands in priority order, highest first
//			queue_timeout 10s                     # default: the policy's queue_timeout
//		}
//		band batch {
//			queue_timeout 5m
//		}
//		max_queued            10000
//		max_queued_per_tenant 1000                # default: no bound beyond max_queued
//		output_weight         2                   # an output token against a prompt token
//	}
func parseFlowControl(d *caddyfile.Dispenser) (*FlowControl, error) {
	if d.NextArg() {
		return nil, d.Errf("flow_control: takes a block, not %q", d.Val())
	}
	f := &FlowControl{}
	seen := map[string]bool{}
	for d.NextBlock(1) {
		sub := d.Val()
		if sub != "band" {
			if seen[sub] {
				return nil, d.Errf("flow_control: %s: given twice", sub)
			}
			seen[sub] = true
		}
		var err error
		switch sub {
		case "tenant":
			f.Tenant, err = kvcf.StringArg(d)
		case "priority":
			f.Priority, err = kvcf.StringArg(d)
		case "max_queued":
			f.MaxQueued, err = kvcf.IntArg(d)
			if err == nil && f.MaxQueued <= 0 {
				err = d.Errf("flow_control: max_queued: must be positive, got %d", f.MaxQueued)
			}
		case "max_queued_per_tenant":
			f.MaxQueuedPerTenant, err = kvcf.IntArg(d)
			if err == nil && f.MaxQueuedPerTenant <= 0 {
				err = d.Errf("flow_control: max_queued_per_tenant: must be positive, got %d", f.MaxQueuedPerTenant)
			}
		case "output_weight":
			var v float64
			v, err = kvcf.FloatArg(d)
			f.OutputWeight = &v
		case "band":
			var b FlowBand
			b, err = parseBand(d)
			f.Bands = append(f.Bands, b)
		default:
			return nil, d.Err("flow_control: " + unknownIn("flow_control", sub,
				[]string{"tenant", "priority", "band", "max_queued", "max_queued_per_tenant", "output_weight"}).Error())
		}
		if err != nil {
			return nil, err
		}
		if err := checkFlow(f); err != nil {
			return nil, d.Errf("flow_control: %v", err)
		}
	}
	return f, nil
}

// parseBand reads `band NAME { queue_timeout D }`.
func parseBand(d *caddyfile.Dispenser) (FlowBand, error) {
	var b FlowBand
	if !d.NextArg() {
		return b, d.Errf("flow_control: band: expected a name")
	}
	b.Name = d.Val()
	if d.NextArg() {
		return b, d.Errf("flow_control: band %s: expected a name and a block, got %q", b.Name, d.Val())
	}
	for d.NextBlock(2) {
		switch d.Val() {
		case "queue_timeout":
			if b.QueueTimeout != nil {
				return b, d.Errf("flow_control: band %s: queue_timeout: given twice", b.Name)
			}
			v, err := kvcf.DurationArg(d)
			if err != nil {
				return b, err
			}
			cd := caddy.Duration(v)
			b.QueueTimeout = &cd
		default:
			return b, d.Errf("flow_control: band %s: unrecognized option %q (options: queue_timeout)", b.Name, d.Val())
		}
	}
	return b, nil
}
