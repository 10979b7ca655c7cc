package kvroute

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
	"github.com/kvroute/caddy-kvroute/tree"
)

func init() {
	caddy.RegisterModule(new(Disaggregate))
	httpcaddyfile.RegisterHandlerDirective("llm_disaggregate", parseDisaggregate)
}

// Disaggregate is the handler `llm_disaggregate`: for an LLM request it runs the prefill leg on
// its own pool (a child reverse_proxy, whose kv_cache_aware policy picks the prefill engine
// with the shared state) and hands the request, with the transfer parameters the prefill
// engine returned, to the next handler: the decode pool's reverse_proxy. The decode body
// becomes the held body, so every decode attempt resends it. docs/disaggregation.md.
//
//	llm_disaggregate [<matcher>] <prefill upstreams...> {
//		protocol     vllm|sglang
//		split        auto|always
//		min_uncached <tokens>
//		bootstrap_port [<prefill upstream>] <port>
//		<reverse_proxy options for the prefill pool: lb_policy, transport, timeouts, health...>
//	}
type Disaggregate struct {
	// Prefill is the prefill pool's reverse_proxy handler.
	Prefill json.RawMessage `json:"prefill,omitempty" caddy:"namespace=http.handlers inline_key=handler"`
	// Protocol is the KV-transfer handshake: vllm (the KV connector's kv_transfer_params) or
	// sglang (bootstrap host, port and room; both legs at once). Default: vllm.
	Protocol string `json:"protocol,omitempty"`
	// Split: auto splits only a prompt with at least min_uncached tokens the decode side does
	// not hold, and nothing while the prefill pool is saturated; always splits every request
	// that can be. Default: auto with vllm; sglang splits every request (always).
	Split string `json:"split,omitempty"`
	// MinUncached is auto's threshold in tokens. Default: 1024.
	MinUncached *int64 `json:"min_uncached,omitempty"`
	// BootstrapPort (sglang) is the bootstrap port of the prefill upstreams BootstrapPorts does
	// not name: the port of the engine's KV bootstrap server
	// (--disaggregation-bootstrap-port). Default: 8998, SGLang's.
	BootstrapPort int `json:"bootstrap_port,omitempty"`
	// BootstrapPorts (sglang) maps a prefill upstream's dial address to its bootstrap port.
	BootstrapPorts map[string]int `json:"bootstrap_ports,omitempty"`

	prefill *reverseproxy.Handler
	policy  *KVCacheAware // the prefill pool's, when it is kv_cache_aware
	inPool  map[string]bool
	logger  *zap.Logger

	// optLines are the Caddyfile lines of the options read, for errors found once the whole
	// block is read (protocol may come after the options it rules out).
	optLines map[string]caddyfile.Token
}

// Defaults and bounds.
const (
	defaultMinUncached = 1024
	// maxPrefillAnswer bounds what is kept of a prefill engine's answer (one token and the
	// transfer parameters: a few KiB).
	maxPrefillAnswer = 1 << 20
	// prefillBodySlack is room for the fields the prefill leg adds, over the client's body.
	prefillBodySlack = 4 << 10
)

// CaddyModule returns the Caddy module information.
func (*Disaggregate) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.llm_disaggregate",
		New: func() caddy.Module { return new(Disaggregate) },
	}
}

// Provision loads the prefill pool's reverse_proxy.
func (d *Disaggregate) Provision(ctx caddy.Context) error {
	d.logger = ctx.Logger()
	registerMetrics(ctx.GetMetricsRegistry())
	registerDisaggMetrics(ctx)
	if err := d.validate(); err != nil {
		return err
	}
	if len(d.Prefill) == 0 {
		return errors.New("llm_disaggregate: no prefill pool (give its upstreams)")
	}
	mod, err := ctx.LoadModule(d, "Prefill")
	if err != nil {
		return fmt.Errorf("llm_disaggregate: loading the prefill pool: %w", err)
	}
	rp, ok := mod.(*reverseproxy.Handler)
	if !ok {
		return fmt.Errorf("llm_disaggregate: the prefill pool must be a reverse_proxy handler, got %T", mod)
	}
	d.prefill = rp
	d.inPool = make(map[string]bool, len(rp.Upstreams))
	for _, u := range rp.Upstreams {
		d.inPool[u.Dial] = true
	}
	if rp.LoadBalancing != nil {
		d.policy, _ = rp.LoadBalancing.SelectionPolicy.(*KVCacheAware)
	}
	if d.Split == "auto" && d.policy == nil {
		return errors.New("llm_disaggregate: split auto needs lb_policy kv_cache_aware on the prefill pool")
	}
	if d.Protocol == "sglang" {
		if err := d.checkBootstrap(rp); err != nil {
			return err
		}
		// Each prefill attempt learns its engine when the pool picks it: the bootstrap host
		// and port the body names are that engine's (disaggregate_sglang.go).
		rp.LoadBalancing.SelectionPolicy = &bootstrapPolicy{inner: rp.LoadBalancing.SelectionPolicy, d: d}
	}
	return nil
}

func (d *Disaggregate) validate() error {
	if d.Protocol == "" {
		d.Protocol = "vllm"
	}
	switch d.Protocol {
	case "vllm":
		if d.Split == "" {
			d.Split = "auto"
		}
		if d.BootstrapPort != 0 || len(d.BootstrapPorts) > 0 {
			return errors.New("llm_disaggregate: bootstrap_port is for protocol sglang (vllm's prefill engine names its KV source in its answer)")
		}
	case "sglang":
		// An SGLang decode server refuses a request without bootstrap data: there is no
		// aggregated path to choose, so no threshold to choose it by.
		if d.Split == "" {
			d.Split = "always"
		}
		if d.Split != "always" {
			return fmt.Errorf("llm_disaggregate: protocol sglang splits every request (split always), got split %q", d.Split)
		}
		if d.MinUncached != nil {
			return errors.New("llm_disaggregate: min_uncached is for protocol vllm's split auto; protocol sglang splits every request")
		}
		if d.BootstrapPort != 0 && (d.BootstrapPort < 1 || d.BootstrapPort > 65535) {
			return fmt.Errorf("llm_disaggregate: bootstrap_port must be a port (1-65535), got %d", d.BootstrapPort)
		}
		for up, port := range d.BootstrapPorts {
			if port < 1 || port > 65535 {
				return fmt.Errorf("llm_disaggregate: bootstrap_port of %s must be a port (1-65535), got %d", up, port)
			}
		}
	default:
		return fmt.Errorf("llm_disaggregate: protocol must be vllm or sglang, got %q", d.Protocol)
	}
	if d.Split != "auto" && d.Split != "always" {
		return fmt.Errorf("llm_disaggregate: split must be auto or always, got %q", d.Split)
	}
	if d.MinUncached != nil && *d.MinUncached < 0 {
		return fmt.Errorf("llm_disaggregate: min_uncached must not be negative, got %d", *d.MinUncached)
	}
	return nil
}

// Validate checks the options.
func (d *Disaggregate) Validate() error { return d.validate() }

func (d *Disaggregate) minUncached() int64 {
	if d.MinUncached != nil {
		return *d.MinUncached
	}
	return defaultMinUncached
}

// The options llm_disaggregate reads itself; every other option of its block goes to the
// prefill pool's reverse_proxy.
var disaggOptions = map[string]bool{"protocol": true, "split": true, "min_uncached": true, "bootstrap_port": true}

// UnmarshalCaddyfile reads the directive: its own options, and the rest of the block as the
// prefill pool's reverse_proxy (upstreams, lb_policy, transport, timeouts, health checks).
func (d *Disaggregate) UnmarshalCaddyfile(disp *caddyfile.Dispenser) error {
	disp.Next()
	seg := disp.NextSegment()
	if len(seg) == 0 {
		return disp.Err("llm_disaggregate: expected prefill upstreams")
	}
	name := seg[0]
	name.Text = "reverse_proxy"
	kept := []caddyfile.Token{name}
	depth := 0
	for i := 1; i < len(seg); {
		t := seg[i]
		if depth == 1 && t.Text != "}" && t.Line != seg[i-1].Line && disaggOptions[t.Text] {
			j := i
			for j < len(seg) && seg[j].Line == t.Line && seg[j].File == t.File {
				j++
			}
			if err := d.option(caddyfile.NewDispenser(seg[i:j])); err != nil {
				return err
			}
			i = j
			continue
		}
		switch t.Text {
		case "{":
			depth++
		case "}":
			depth--
		case "handle_response":
			if depth == 1 {
				return fmt.Errorf("%s:%d - llm_disaggregate: handle_response is not available for the prefill pool", t.File, t.Line)
			}
		}
		kept = append(kept, t)
		i++
	}
	if d.MinUncached != nil && d.Split == "always" {
		return disp.Errf("llm_disaggregate: min_uncached applies to split auto only")
	}
	rp := new(reverseproxy.Handler)
	if err := rp.UnmarshalCaddyfile(caddyfile.NewDispenser(kept)); err != nil {
		return err
	}
	if len(rp.Upstreams) == 0 && rp.DynamicUpstreamsRaw == nil {
		return disp.Errf("llm_disaggregate: no prefill upstreams")
	}
	errAt := func(opt string, err error) error {
		t := d.optLines[opt]
		return fmt.Errorf("%s:%d - %w", t.File, t.Line, err)
	}
	if d.Protocol == "sglang" {
		if _, ok := d.optLines["min_uncached"]; ok {
			return errAt("min_uncached", errors.New("llm_disaggregate: min_uncached is for protocol vllm's split auto; protocol sglang splits every request"))
		}
		if d.Split == "auto" {
			return errAt("split", errors.New("llm_disaggregate: protocol sglang splits every request (an SGLang decode server refuses one without bootstrap data): split auto is for protocol vllm"))
		}
	}
	if _, ok := d.optLines["bootstrap_port"]; ok {
		if d.Protocol != "sglang" {
			return errAt("bootstrap_port", errors.New("llm_disaggregate: bootstrap_port is for protocol sglang (add protocol sglang)"))
		}
		if err := d.checkBootstrap(rp); err != nil {
			return errAt("bootstrap_port", err)
		}
	}
	if rp.LoadBalancing == nil {
		rp.LoadBalancing = new(reverseproxy.LoadBalancing)
	}
	if rp.LoadBalancing.SelectionPolicyRaw == nil {
		rp.LoadBalancing.SelectionPolicyRaw = json.RawMessage(`{"policy":"kv_cache_aware"}`)
	}
	var warnings []caddyconfig.Warning
	d.Prefill = caddyconfig.JSONModuleObject(rp, "handler", "reverse_proxy", &warnings)
	return nil
}

// option reads one of llm_disaggregate's own options.
func (d *Disaggregate) option(o *caddyfile.Dispenser) error {
	o.Next()
	opt := o.Val()
	args := o.RemainingArgs()
	switch opt {
	case "protocol":
		if len(args) != 1 || (args[0] != "vllm" && args[0] != "sglang") {
			return o.Errf("llm_disaggregate: protocol takes vllm or sglang")
		}
		d.Protocol = args[0]
	case "split":
		if len(args) != 1 || (args[0] != "auto" && args[0] != "always") {
			return o.Errf("llm_disaggregate: split takes auto or always")
		}
		d.Split = args[0]
	case "min_uncached":
		if len(args) != 1 {
			return o.Errf("llm_disaggregate: min_uncached takes one number of tokens")
		}
		n, err := strconv.ParseInt(args[0], 10, 64)
		if err != nil || n < 0 {
			return o.Errf("llm_disaggregate: min_uncached: %q is not a number of tokens", args[0])
		}
		d.MinUncached = &n
	case "bootstrap_port":
		if len(args) != 1 && len(args) != 2 {
			return o.Errf("llm_disaggregate: bootstrap_port takes [<prefill upstream>] <port>")
		}
		port, err := strconv.Atoi(args[len(args)-1])
		if err != nil || port < 1 || port > 65535 {
			return o.Errf("llm_disaggregate: bootstrap_port: %q is not a port (1-65535)", args[len(args)-1])
		}
		if len(args) == 1 {
			if d.BootstrapPort != 0 {
				return o.Errf("llm_disaggregate: bootstrap_port <port> given twice")
			}
			d.BootstrapPort = port
		} else {
			up := upstreamDial(args[0])
			if _, dup := d.BootstrapPorts[up]; dup {
				return o.Errf("llm_disaggregate: bootstrap_port of %s given twice", args[0])
			}
			if d.BootstrapPorts == nil {
				d.BootstrapPorts = make(map[string]int)
			}
			d.BootstrapPorts[up] = port
		}
	}
	if d.optLines == nil {
		d.optLines = make(map[string]caddyfile.Token)
	}
	if _, seen := d.optLines[opt]; !seen {
		d.optLines[opt] = o.Token()
	}
	return nil
}

func parseDisaggregate(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	d := new(Disaggregate)
	err := d.UnmarshalCaddyfile(h.Dispenser)
	return d, err
}

// The paths a request takes through llm_disaggregate.
const (
	disaggSplit         = iota // prefill leg, then the decode leg with its parameters
	disaggShort                // split auto: too few uncached tokens on the decode side
	disaggFallback             // not splittable (body not held whole, encoded, format) or the prefill pool saturated
	disaggPrefillFailed        // vllm: the prefill leg failed or returned no parameters: aggregated; sglang: a 502
	disaggRefused              // sglang: not splittable (body not held whole, encoded, format, batch): an error
	disaggShed                 // a pool's flow_control shed the request (429) before any engine got it
	numDisaggPaths
)

var disaggPathNames = [numDisaggPaths]string{"split", "aggregated_short", "aggregated_fallback", "prefill_failed", "refused", "shed"}

// pdFields are the top-level fields that steer disaggregation in vLLM and SGLang (SGLang's
// bootstrap_pair_key and disagg_prefill_dp_rank also say where KV comes from): a client never
// chooses where KV comes from, so they are removed from what it sent.
var pdFields = []string{"kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "disagg_prefill_dp_rank"}

// ServeHTTP runs the prefill leg when the request should be split, then the next handler.
func (d *Disaggregate) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	lr, _ := caddyhttp.GetVar(r.Context(), varRequest).(*llmRequest)
	if lr == nil {
		if !hasVars(r) {
			return next.ServeHTTP(w, r)
		}
		lr = requestFor(r, DefaultMaxBody)
	}
	if d.Protocol == "sglang" {
		return d.serveSGLang(w, r, next, lr)
	}
	fields := heldFields(r, lr)
	if fields == nil || (lr.Format != llmreq.Chat && lr.Format != llmreq.Completion) {
		d.count(disaggFallback)
		return d.aggregated(w, r, next, lr)
	}
	if path, skip := d.skip(r, lr); skip {
		d.count(path)
		return d.aggregated(w, r, next, lr)
	}
	return d.split(w, r, next, lr, fields)
}

// split hands the request to the decode pool with its prefill leg deferred: the decode pool's
// policy admits it first (kv_cache_aware: a batch slot, after any wait in its queue), and the
// prefill leg runs only once a decode engine is chosen (runDeferredPrefill, from Select). A
// request the decode pool sheds, or whose client leaves while it waits, costs no prefill, and
// no prefill engine holds KV that no decode engine will take: vLLM's KV connector gives a
// router no call to release a prefill's blocks (the prefill engine holds them until a decode
// engine reads them, or tells it of a request it aborted or refused, else until
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s by default). Under a decode policy that runs none of
// this (not kv_cache_aware), the prefill leg runs when the decode engine's connection reads the
// body (prefillOnRead).
func (d *Disaggregate) split(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, lr *llmRequest, fields map[string]json.RawMessage) error {
	// Until the prefill leg has run, the held body is the client's without its P/D fields, as
	// a request that goes on aggregated sends it: nothing the client forged goes out, whatever
	// path the request takes.
	raw, _ := lr.body.Prefix(lr.maxBody + 1)
	plain, err := stripPD(raw)
	if err != nil {
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	pf := &deferredPrefill{d: d, r: r, lr: lr, fields: fields, plain: plain}
	holdBody(r, lr, plain)
	lr.split = pf
	lr.leg = legDecode
	r.Body = &prefillOnRead{pf: pf}
	r.ContentLength = -1
	r.Header.Del("Content-Length")
	err = next.ServeHTTP(w, r)
	if !pf.ran() && lr.shed.Load() {
		d.count(disaggShed)
	}
	return err
}

// deferredPrefill is the prefill leg of a request split under protocol vllm, run once, when
// the decode pool placed the request.
type deferredPrefill struct {
	d      *Disaggregate
	r      *http.Request // the client's
	lr     *llmRequest
	fields map[string]json.RawMessage // the client's
	plain  []byte                     // the body without a split: the client's without its P/D fields

	once sync.Once
	done atomic.Bool
	body []byte // the decode body: with the prefill engine's transfer parameters, or plain
}

// run runs the prefill leg (once) and returns the decode body: the client's fields with the
// transfer parameters the prefill engine answered, or, when the leg failed, the plain body (a
// vLLM decode engine serves a request without transfer parameters whole).
func (pf *deferredPrefill) run() []byte {
	pf.once.Do(func() {
		defer pf.done.Store(true)
		d, r := pf.d, pf.r
		params, err := d.prefillLeg(r, pf.lr, pf.fields)
		if err != nil {
			d.count(disaggPrefillFailed)
			if r.Context().Err() == nil {
				d.logger.Debug("prefill leg failed: the request goes on aggregated", zap.Error(err))
			}
			pf.body = pf.plain
			return
		}
		body, err := decodeBody(pf.fields, params)
		if err != nil {
			d.count(disaggPrefillFailed)
			d.logger.Error("encoding the decode body: the request goes on aggregated", zap.Error(err))
			pf.body = pf.plain
			return
		}
		d.count(disaggSplit)
		pf.body = body
	})
	return pf.body
}

// ran reports whether the prefill leg has run.
func (pf *deferredPrefill) ran() bool { return pf.done.Load() }

// runDeferredPrefill runs the prefill leg of a split request whose decode engine the decode
// pool's policy just chose (Select, r the attempt's request), and makes the decode body the
// attempt's: every later attempt resends it.
func runDeferredPrefill(r *http.Request) {
	lr, _ := caddyhttp.GetVar(r.Context(), varRequest).(*llmRequest)
	if lr == nil || lr.split == nil || lr.split.ran() {
		return
	}
	holdBody(r, lr, lr.split.run())
}

// prefillOnRead is the decode leg's body until its prefill leg ran: kv_cache_aware replaces
// it when it places the request (runDeferredPrefill). A decode pool under another policy reads
// it once the decode engine's connection wants the body: the prefill leg runs then, and the
// decode body goes out as it would have.
type prefillOnRead struct {
	pf *deferredPrefill
	rd *bytes.Reader
}

func (b *prefillOnRead) Read(p []byte) (int, error) {
	if b.rd == nil {
		b.rd = bytes.NewReader(b.pf.run())
	}
	return b.rd.Read(p)
}

func (b *prefillOnRead) Close() error { return nil }

// aggregated sends the request to the decode pool unsplit, without the P/D fields a client sent
// (pdFilter: the top-level ones and vllm_xargs' kv_transfer_params). A body held whole is
// filtered at once and held again, so that every decode attempt resends it; any other (over
// max_body, or gzip or deflate, decoded on the way) streams through the filter with bounded
// memory and goes out without Content-Length or Content-Encoding. A body the filter cannot
// read as one JSON object never reaches the decode pool: 400 when that shows in what is held,
// else the decode attempt fails (502); another Content-Encoding is a 415.
func (d *Disaggregate) aggregated(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, lr *llmRequest) error {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return next.ServeHTTP(w, r)
	}
	ce := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding")))
	identity := ce == "" || ce == "identity"
	if identity && lr.body != nil && lr.body.Whole() && lr.err == nil {
		raw, _ := lr.body.Prefix(lr.maxBody + 1)
		body, err := stripPD(raw)
		if err != nil {
			return caddyhttp.Error(http.StatusBadRequest, err)
		}
		if len(body) != len(raw) { // a member removed (the output is a subsequence of the input)
			holdBody(r, lr, body)
		}
		return next.ServeHTTP(w, r)
	}
	if !identity && lr.body != nil && lr.body.Whole() && lr.err == nil {
		// A gzip or deflate body held whole that decodes to at most max_body: filtered at once
		// and held decoded, so that retries resend it. A larger one streams below.
		raw, _ := lr.body.Prefix(lr.maxBody + 1)
		if dec, truncated, err := llmreq.Decode(raw, false, ce, lr.maxBody); err == nil && !truncated {
			body, err := stripPD(dec)
			if err != nil {
				return caddyhttp.Error(http.StatusBadRequest, err)
			}
			r.Header.Del("Content-Encoding")
			holdBody(r, lr, body)
			return next.ServeHTTP(w, r)
		}
	}
	if identity && lr.body != nil && lr.err == nil {
		// What is held is the body's start: a body that is no JSON object is refused before a
		// byte of it goes out.
		prefix, _ := lr.body.Prefix(lr.maxBody)
		if err := checkPDPrefix(prefix); err != nil {
			return caddyhttp.Error(http.StatusBadRequest, err)
		}
	}
	src := io.Reader(r.Body)
	switch ce {
	case "", "identity":
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("llm_disaggregate: Content-Encoding %s: %w", ce, err))
		}
		src = zr
	case "deflate":
		br := bufio.NewReader(r.Body)
		if h, _ := br.Peek(2); len(h) == 2 && h[0]&0x0f == 8 && (uint(h[0])<<8|uint(h[1]))%31 == 0 {
			zr, err := zlib.NewReader(br)
			if err != nil {
				return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("llm_disaggregate: Content-Encoding %s: %w", ce, err))
			}
			src = zr
		} else {
			src = flate.NewReader(br)
		}
	default:
		w.Header().Set("Accept-Encoding", "gzip, deflate")
		return caddyhttp.Error(http.StatusUnsupportedMediaType, fmt.Errorf("llm_disaggregate: a body with Content-Encoding %q: the client's P/D fields cannot be removed from it", ce))
	}
	if !identity {
		// A decoded stream is bounded: a small body must not become gigabytes at an engine
		// (which, unlike the router, may read a body whole).
		src = &decodedLimit{r: src, left: max(maxDecodedStream, 16*lr.maxBody)}
	}
	lr.body = llmreq.Stream(r, newPDStripper(src, r.Body.Close))
	r.Header.Del("Content-Length")
	r.Header.Del("Content-Encoding")
	r.Header.Del("Transfer-Encoding")
	return next.ServeHTTP(w, r)
}

// maxDecodedStream bounds a gzip or deflate body decoded as it streams to a decode engine (at
// least 16 × max_body): past it the decode attempt fails, as for a body that breaks off.
var maxDecodedStream int64 = 64 << 20

// decodedLimit reads at most left bytes of r, then fails.
type decodedLimit struct {
	r    io.Reader
	left int64
}

func (l *decodedLimit) Read(p []byte) (int, error) {
	if l.left <= 0 {
		var one [1]byte
		if n, err := l.r.Read(one[:]); n == 0 {
			return 0, err // the end (io.EOF) right at the bound, an error, or nothing yet
		}
		return 0, errors.New("llm_disaggregate: the decoded body is over its bound")
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// stripXargs removes kv_transfer_params from vllm_xargs, which vLLM merges into the request's
// extra arguments (a top-level kv_transfer_params overrides it, when given).
func stripXargs(fields map[string]json.RawMessage) {
	raw, ok := fields["vllm_xargs"]
	if !ok {
		return
	}
	var x map[string]json.RawMessage
	if json.Unmarshal(raw, &x) != nil {
		return // not an object: vLLM refuses the request
	}
	if _, ok := x["kv_transfer_params"]; ok {
		delete(x, "kv_transfer_params")
		fields["vllm_xargs"], _ = json.Marshal(x)
	}
}

// decodeBody encodes a split request's decode body: the client's fields without its P/D
// fields (vllm_xargs' kv_transfer_params included), with the transfer parameters the prefill
// engine answered.
func decodeBody(client map[string]json.RawMessage, params json.RawMessage) ([]byte, error) {
	fields := maps.Clone(client)
	for _, k := range pdFields {
		delete(fields, k)
	}
	stripXargs(fields)
	fields["kv_transfer_params"] = params
	body, err := json.Marshal(fields)
	if err != nil {
		return nil, fmt.Errorf("llm_disaggregate: encoding the decode body: %w", err)
	}
	return body, nil
}

// heldFields returns the top-level fields of a body held whole, unencoded, a JSON object; nil
// for any other: such a body cannot be split, nor rewritten.
func heldFields(r *http.Request, lr *llmRequest) map[string]json.RawMessage {
	if lr.body == nil || !lr.body.Whole() || lr.err != nil {
		return nil
	}
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return nil
	}
	raw, _ := lr.body.Prefix(lr.maxBody + 1)
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil
	}
	return fields
}

// skip reports, under split auto, whether the request goes to the decode pool alone: its
// uncached tokens on the decode side are below min_uncached, or every prefill upstream is
// down, unavailable or at its max_concurrency.
func (d *Disaggregate) skip(r *http.Request, lr *llmRequest) (int, bool) {
	if d.Split != "auto" || d.policy == nil {
		return 0, false
	}
	st := d.policy.state
	if d.saturated(st) {
		return disaggFallback, true
	}
	text := lr.Text
	if text == "" {
		text = lr.routingText(r)
	}
	runes := int64(lr.Runes)
	held := int64(0)
	if text != "" {
		if t := st.forest.Get(lr.Model); t != nil {
			m := matchPool.Get().(*tree.Match)
			m.Runes, m.Tenants = 0, m.Tenants[:0]
			t.Match(text, m)
			for _, tm := range m.Tenants {
				if tm.Runes >= minMatchRunes && !d.inPool[tm.Tenant] {
					held = int64(tm.Runes)
					break // longest first
				}
			}
			matchPool.Put(m)
		}
	}
	uncached := st.tokensOf(lr.Model, max(0, runes-held))
	if uncached < d.minUncached() {
		return disaggShort, true
	}
	return 0, false
}

// saturated reports whether no prefill upstream can take a request now.
func (d *Disaggregate) saturated(st *state) bool {
	now := time.Now().UnixNano()
	for _, up := range d.prefill.Upstreams {
		if up == nil || !up.Available() {
			continue
		}
		u := st.upstream(up.Dial)
		if u.health.down.Load() || saturatedAt(d.policy.profiles[up.Dial], st.load(u, now)) {
			continue
		}
		return false
	}
	return true
}

// prefillLeg runs the prefill leg through the prefill pool's reverse_proxy, as a request of its
// own (its own vars, replacer, attempts and outcome) in the client's context, so that a client
// that goes away cancels it. It returns the transfer parameters the engine answered.
func (d *Disaggregate) prefillLeg(r *http.Request, lr *llmRequest, client map[string]json.RawMessage) (json.RawMessage, error) {
	fields := maps.Clone(client)
	for _, k := range append([]string{"stream", "stream_options", "min_tokens", "max_tokens", "max_completion_tokens"}, pdFields...) {
		delete(fields, k)
	}
	stripXargs(fields)
	fields["kv_transfer_params"] = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)
	fields["stream"] = json.RawMessage("false")
	fields["max_tokens"] = json.RawMessage("1")
	if _, ok := client["max_completion_tokens"]; ok && lr.Format == llmreq.Chat {
		fields["max_completion_tokens"] = json.RawMessage("1")
	}
	body, err := json.Marshal(fields)
	if err != nil {
		return nil, err
	}

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel() // ends the leg's attempt: its outcome is judged, its engine's count released
	rec := &legRecorder{header: make(http.Header)}
	leg, out, finish := legRequest(ctx, r, lr, body, rec)
	start := time.Now()
	err = serveLeg(d.prefill, out, leg)
	finish(err)
	if err != nil {
		return nil, err
	}
	disaggMetrics.prefillSeconds.Observe(time.Since(start).Seconds())
	switch {
	case rec.over:
		return nil, errors.New("prefill answer over 1 MiB")
	case rec.status < 200 || rec.status > 299:
		return nil, fmt.Errorf("prefill answer status %d", rec.status)
	}
	var ans struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(rec.buf.Bytes(), &ans); err != nil {
		return nil, fmt.Errorf("prefill answer: %w", err)
	}
	if len(ans.KV) == 0 || ans.KV[0] != '{' {
		return nil, errors.New("prefill answer without kv_transfer_params")
	}
	return ans.KV, nil
}

// serveLeg runs a prefill leg through the prefill pool's reverse_proxy. Caddy's proxy panics
// with http.ErrAbortHandler when an answer breaks off after its header (an engine that dies
// mid-answer, or a recorder that refuses an answer over its bound): on a handler's goroutine
// net/http would take that as "abort the client's connection", on a goroutine of its own
// (protocol sglang) it would end the process. A prefill leg's answer never reaches the client,
// so for it that is a failed leg, nothing more.
func serveLeg(h *reverseproxy.Handler, w http.ResponseWriter, r *http.Request) (err error) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				err = errors.New("prefill answer broke off")
				return
			}
			err = fmt.Errorf("prefill leg panicked: %v", v)
		}
	}()
	return h.ServeHTTP(w, r, noNext)
}

// noNext ends a leg's handler chain: the prefill pool's reverse_proxy is the last handler.
var noNext = caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })

// legRequest makes the prefill leg of r: a request of its own (its own vars, replacer,
// attempts and outcome) in ctx, derived from the client's, so that a client that goes away
// cancels it, whose held body is body. Its answer goes to rec, through llm_feedback's writer
// when the site has llm_feedback, so that the leg is credited to its engine; finish closes
// that crediting once the leg is over.
func legRequest(ctx context.Context, r *http.Request, lr *llmRequest, body []byte, rec http.ResponseWriter) (*http.Request, http.ResponseWriter, func(error)) {
	// The leg's own vars: the attempts of the prefill pool are not the request's.
	vars := make(map[string]any)
	if orig, ok := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any); ok {
		for k, v := range orig {
			if k != varRequest && k != varFeedback {
				vars[k] = v
			}
		}
	}
	repl := caddy.NewReplacer()
	if orig, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Map(orig.Get)
	}
	ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, vars)
	ctx = context.WithValue(ctx, caddy.ReplacerCtxKey, repl)
	leg := r.Clone(ctx)
	leg.Header.Del("Accept-Encoding")
	leg.Header.Del("Expect")
	leg.Header.Set("Content-Length", strconv.Itoa(len(body)))
	leg.Header.Del("Transfer-Encoding")
	leg.Body = http.NoBody
	plr := &llmRequest{Request: lr.Request, maxBody: int64(len(body))}
	plr.Text = lr.Text
	if plr.Text == "" {
		plr.Text = lr.routingText(r)
	}
	plr.body = llmreq.Hold(leg, body)
	plr.leg = legPrefill
	plr.legOf, plr.legEnd = lr, r.Context() // charged once, in the client's request (queue.go)
	vars[varRequest] = plr

	out := rec
	var fw *feedbackWriter
	if _, ok := caddyhttp.GetVar(r.Context(), varFeedback).(*feedbackWriter); ok {
		fw = &feedbackWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: rec}, r: leg}
		vars[varFeedback] = fw
		out = fw
	}
	return leg, out, func(err error) {
		if fw != nil {
			fw.finish()
		}
		if err != nil {
			repl.Set("http.error", err)
		}
	}
}

// legRecorder keeps the prefill leg's answer, up to maxPrefillAnswer bytes.
type legRecorder struct {
	header http.Header
	status int
	buf    bytes.Buffer
	over   bool
}

var errPrefillAnswerTooLarge = errors.New("llm_disaggregate: prefill answer over its bound")

func (w *legRecorder) Header() http.Header { return w.header }

func (w *legRecorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
}

func (w *legRecorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.buf.Len()+len(p) > maxPrefillAnswer {
		w.over = true
		return 0, errPrefillAnswerTooLarge
	}
	return w.buf.Write(p)
}

// Flush does nothing: the answer is kept whole.
func (w *legRecorder) Flush() {}

func (d *Disaggregate) count(path int) {
	disaggMetrics.paths[path].Inc()
	disaggCounts[path].Add(1)
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Disaggregate)(nil)
	_ caddy.Validator             = (*Disaggregate)(nil)
	_ caddyhttp.MiddlewareHandler = (*Disaggregate)(nil)
	_ caddyfile.Unmarshaler       = (*Disaggregate)(nil)
)

// disaggCounts counts the paths for GET /kvroute/.
var disaggCounts [numDisaggPaths]atomic.Uint64

var disaggMetrics = func() (m struct {
	vec            *prometheus.CounterVec
	paths          [numDisaggPaths]prometheus.Counter
	prefillSeconds prometheus.Histogram
}) {
	m.vec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "disaggregate_total",
		Help: "Requests llm_disaggregate handled, by path: split, aggregated_short, aggregated_fallback, prefill_failed, refused, shed.",
	}, []string{"path"})
	for i, name := range disaggPathNames {
		m.paths[i] = m.vec.WithLabelValues(name)
	}
	m.prefillSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "prefill_leg_seconds",
		Help:    "Duration of llm_disaggregate's prefill legs that got an answer.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	})
	return m
}()

func registerDisaggMetrics(ctx caddy.Context) {
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return
	}
	for _, c := range []prometheus.Collector{disaggMetrics.vec, disaggMetrics.prefillSeconds} {
		_ = reg.Register(c) // already registered by an earlier config: it keeps counting
	}
}

// disaggStatus is what GET /kvroute/ shows of llm_disaggregate: its requests by path.
func disaggStatus() map[string]uint64 {
	var out map[string]uint64
	for i := range disaggCounts {
		if n := disaggCounts[i].Load(); n > 0 {
			if out == nil {
				out = make(map[string]uint64, numDisaggPaths)
			}
			out[disaggPathNames[i]] = n
		}
	}
	return out
}
