package kvroute

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
)

// SGLang's bootstrap flow (protocol sglang): the router adds the prefill engine's bootstrap host
// and port and a fresh random room to the request and sends it to a prefill and a decode engine
// at once; the decode engine finds the prefill engine through its bootstrap server and receives
// the KV of the room; the client gets the decode engine's answer, the prefill engine's is
// discarded. This is what SGLang's own routers do (sglang.srt.disaggregation.mini_lb and
// sgl-router's PD mode): same body to both, bootstrap_room uniform in [0, 2^63-1], lists of
// bootstrap values for a batch.

const (
	// defaultBootstrapPort is SGLang's --disaggregation-bootstrap-port default.
	defaultBootstrapPort = 8998
	// maxBootstrapBatch bounds the rooms of one batch request (chat n, a list of prompts):
	// the lists are built from a number the client gives.
	maxBootstrapBatch = 1024
	// prefillDrainGrace is how long a prefill leg may still run once the decode leg has
	// answered in full: the KV has been received by then, so what is left is the prefill
	// engine's own (discarded) answer, which must not hold the client's answer open.
	prefillDrainGrace = 5 * time.Second
)

// decodeErrorHold is how long a decode engine's error answer waits for the prefill leg to end
// before it goes to the client: when a prefill engine dies, its decode engine may answer its own
// error (the room is gone) an instant before the prefill leg reports the failure, and the
// client should get the 502 of a failed prefill leg, counted as such. A variable: tests make
// it long, to tell an answer held from one not held without timing it.
var decodeErrorHold = time.Second

// varSGLangLeg is the var of a prefill leg under protocol sglang: bootstrapPolicy finds there
// the request whose body it completes with the chosen engine's bootstrap address.
const varSGLangLeg = "kvroute.sglang_leg"

// upstreamDial is the dial address of an upstream as a Caddyfile names it (a scheme and a
// trailing slash allowed), to compare with reverse_proxy's Upstream.Dial.
func upstreamDial(s string) string {
	for _, scheme := range []string{"http://", "https://", "h2c://"} {
		if rest, ok := strings.CutPrefix(s, scheme); ok {
			s = rest
			break
		}
	}
	return strings.TrimSuffix(s, "/")
}

// checkBootstrap checks protocol sglang's view of the prefill pool: every static upstream has a
// host an SGLang decode engine can reach (not a unix socket), and bootstrap_port names only
// prefill upstreams.
func (d *Disaggregate) checkBootstrap(rp *reverseproxy.Handler) error {
	dials := make([]string, 0, len(rp.Upstreams))
	for _, u := range rp.Upstreams {
		if u == nil {
			continue
		}
		dials = append(dials, u.Dial)
		if strings.Contains(u.Dial, "{") {
			continue // a placeholder: checked when the request fills it in
		}
		if _, _, err := bootstrapHostOf(u.Dial); err != nil {
			return fmt.Errorf("llm_disaggregate: protocol sglang: prefill upstream %s: %w", u.Dial, err)
		}
	}
	if rp.DynamicUpstreamsRaw != nil {
		return nil // bootstrap_port may name upstreams the dynamic source gives later
	}
	for _, up := range slices.Sorted(maps.Keys(d.BootstrapPorts)) {
		if !slices.Contains(dials, up) {
			return fmt.Errorf("llm_disaggregate: bootstrap_port names %s, which is not a prefill upstream (%s)", up, strings.Join(dials, ", "))
		}
	}
	return nil
}

// bootstrapHostOf returns the host an SGLang decode engine reaches a prefill upstream's
// bootstrap server at (an IPv6 address in brackets, as SGLang joins host and port with a
// colon), and the upstream's port.
func bootstrapHostOf(dial string) (string, string, error) {
	if strings.HasPrefix(dial, "unix/") || strings.HasPrefix(dial, "unix+h2c/") {
		return "", "", errors.New("a unix socket has no host a decode engine can reach")
	}
	host, port, err := net.SplitHostPort(dial)
	if err != nil || host == "" {
		return "", "", fmt.Errorf("not host:port (%q)", dial)
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host, port, nil
}

// bootstrapPort is a prefill upstream's bootstrap port.
func (d *Disaggregate) bootstrapPort(dial string) int {
	if p, ok := d.BootstrapPorts[dial]; ok {
		return p
	}
	if d.BootstrapPort != 0 {
		return d.BootstrapPort
	}
	return defaultBootstrapPort
}

// newRoom returns a fresh bootstrap room: uniform in [0, 2^63-1] as SGLang's routers draw it,
// from crypto/rand so that no client can predict (and race for) another request's room.
func newRoom() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand's Read panics rather than return an error)
	return binary.LittleEndian.Uint64(b[:]) & (1<<63 - 1)
}

// errNotSplit is a request protocol sglang cannot split, with the status it is answered.
type errNotSplit struct {
	status int
	why    string
}

func (e *errNotSplit) Error() string { return "llm_disaggregate: not split: " + e.why }

// bootstrapBatch returns the number of rooms a request needs: 0 for one (scalar bootstrap
// fields), n for a batch (lists of n), as SGLang's routers count them: chat and completions
// n > 1 (parallel sampling), a completions prompt that is a list of prompts, a generate text
// list or input_ids list of lists.
func bootstrapBatch(format llmreq.Format, fields map[string]json.RawMessage) (int, error) {
	n := 0
	if raw, ok := fields["n"]; ok && format != llmreq.Generate {
		var v float64
		if json.Unmarshal(raw, &v) == nil && v > 1 {
			if v > maxBootstrapBatch || v != float64(int(v)) {
				return 0, &errNotSplit{http.StatusBadRequest, fmt.Sprintf("n %v: at most %d rooms a request", v, maxBootstrapBatch)}
			}
			n = int(v)
		}
	}
	var list json.RawMessage
	switch format {
	case llmreq.Completion:
		list = fields["prompt"]
	case llmreq.Generate:
		if list = fields["text"]; len(list) == 0 || string(list) == "null" {
			list = fields["input_ids"]
		}
	}
	var items []json.RawMessage
	if len(list) > 0 && list[0] == '[' && json.Unmarshal(list, &items) == nil {
		// A list of numbers is one tokenized prompt; a list of strings or of lists is a batch.
		if len(items) == 0 {
			return 0, &errNotSplit{http.StatusBadRequest, "an empty batch"}
		}
		if first := bytes.TrimSpace(items[0]); len(first) > 0 && (first[0] == '"' || first[0] == '[') {
			if n > 0 {
				// Which of the prompts' n samples gets which room is not something SGLang's
				// routers agree on: refused rather than guessed.
				return 0, &errNotSplit{http.StatusBadRequest, "n > 1 with a list of prompts"}
			}
			if len(items) > maxBootstrapBatch {
				return 0, &errNotSplit{http.StatusBadRequest, fmt.Sprintf("a batch of %d prompts: at most %d rooms a request", len(items), maxBootstrapBatch)}
			}
			n = len(items)
		}
	}
	return n, nil
}

// sglangLeg is one request split under protocol sglang: the client's fields, its rooms, and the
// body of the prefill attempt under way, which the decode leg sends too once the prefill leg
// reached its engine.
type sglangLeg struct {
	d      *Disaggregate
	fields map[string]json.RawMessage // the client's, its P/D fields removed
	rooms  json.RawMessage            // bootstrap_room: a number, or a list for a batch
	batch  int

	mu        sync.Mutex
	body      []byte // the body of the latest prefill attempt
	pickErr   error
	reached   chan struct{} // closed when the prefill leg has a connection to its engine
	reachOnce sync.Once
}

// pick makes the body of a prefill attempt on the upstream dial: the client's fields with the
// engine's bootstrap host and port and the request's rooms. A retry of the prefill leg (a dial
// error: the engine never got the request) names the new engine with the same rooms.
func (l *sglangLeg) pick(dial string) ([]byte, error) {
	host, _, err := bootstrapHostOf(dial)
	if err != nil {
		return nil, err
	}
	port := l.d.bootstrapPort(dial)
	fields := maps.Clone(l.fields)
	if l.batch > 0 {
		hosts, ports := make([]string, l.batch), make([]int, l.batch)
		for i := range hosts {
			hosts[i], ports[i] = host, port
		}
		fields["bootstrap_host"], _ = json.Marshal(hosts)
		fields["bootstrap_port"], _ = json.Marshal(ports)
	} else {
		fields["bootstrap_host"], _ = json.Marshal(host)
		fields["bootstrap_port"] = json.RawMessage(strconv.Itoa(port))
	}
	fields["bootstrap_room"] = l.rooms
	return json.Marshal(fields)
}

func (l *sglangLeg) reach() { l.reachOnce.Do(func() { close(l.reached) }) }

// bootstrapPolicy wraps the prefill pool's selection policy under protocol sglang: the body of
// each prefill attempt names the engine the policy chose (its bootstrap host and port), which
// only the policy knows and only when it chooses. Any policy works (kv_cache_aware,
// round_robin...); the attempt is its, tried list, health and feedback included.
type bootstrapPolicy struct {
	inner reverseproxy.Selector
	d     *Disaggregate
}

// Select runs the pool's policy, then writes the chosen engine's bootstrap address into the
// attempt's body (held, so that the policy's next attempt restores it).
func (p *bootstrapPolicy) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	up := p.inner.Select(pool, r, w)
	l, _ := caddyhttp.GetVar(r.Context(), varSGLangLeg).(*sglangLeg)
	if up == nil || l == nil {
		return up
	}
	dial := up.Dial
	if strings.Contains(dial, "{") {
		if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
			dial = repl.ReplaceAll(dial, "")
		}
	}
	body, err := l.pick(dial)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.pickErr = fmt.Errorf("prefill upstream %s: %w", dial, err)
		return nil
	}
	l.body = body
	if lr, ok := caddyhttp.GetVar(r.Context(), varRequest).(*llmRequest); ok {
		lr.body = llmreq.Hold(r, body)
		lr.maxBody = max(lr.maxBody, int64(len(body)))
	} else {
		llmreq.Hold(r, body)
	}
	r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return up
}

// refusal says why protocol sglang cannot split a request the matcher matched, or nil. A body
// not held whole or content-encoded is a 502, as the table of errors in docs/disaggregation.md
// ("SGLang") says (the client's request is fine; this gateway cannot forward it the SGLang
// way); a body that is not a JSON object is the client's error (400); a format SGLang's
// engines do not split is a 501.
func refusal(r *http.Request, lr *llmRequest, fields map[string]json.RawMessage) *errNotSplit {
	switch {
	case lr.body == nil:
		return &errNotSplit{http.StatusBadRequest, "no request body"}
	case !lr.body.Whole():
		return &errNotSplit{http.StatusBadGateway, "the body is over llm_prompt's max_body (an SGLang decode server needs the bootstrap fields in it)"}
	case lr.err != nil:
		return &errNotSplit{http.StatusBadRequest, "reading the body: " + lr.err.Error()}
	}
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return &errNotSplit{http.StatusBadGateway, "a body with Content-Encoding " + ce + " (the bootstrap fields go into the body)"}
	}
	if fields == nil {
		return &errNotSplit{http.StatusBadRequest, "the body is not a JSON object"}
	}
	switch lr.Format {
	case llmreq.Chat, llmreq.Completion, llmreq.Generate:
		return nil
	}
	return &errNotSplit{http.StatusNotImplemented, "protocol sglang splits chat, completions and generate requests, not " + lr.Format.String()}
}

// serveSGLang splits a request the SGLang way: the prefill leg and the decode leg at once, the
// client answered by the decode leg. A request that cannot be split is answered an error: an
// SGLang decode server refuses a request without bootstrap data, so there is no aggregated path.
func (d *Disaggregate) serveSGLang(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, lr *llmRequest) error {
	fields := heldFields(r, lr)
	if e := refusal(r, lr, fields); e != nil {
		d.count(disaggRefused)
		return caddyhttp.Error(e.status, e)
	}
	for _, k := range pdFields {
		delete(fields, k)
	}
	batch, err := bootstrapBatch(lr.Format, fields)
	if err != nil {
		d.count(disaggRefused)
		return caddyhttp.Error(err.(*errNotSplit).status, err)
	}
	l := &sglangLeg{d: d, fields: fields, batch: batch, reached: make(chan struct{})}
	if batch > 0 {
		rooms := make([]uint64, batch)
		for i := range rooms {
			rooms[i] = newRoom()
		}
		l.rooms, _ = json.Marshal(rooms)
	} else {
		l.rooms = json.RawMessage(strconv.FormatUint(newRoom(), 10))
	}
	// Until the pool picks an engine the leg's body has no bootstrap fields; it is never sent so.
	base, err := json.Marshal(fields)
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}

	// The prefill leg, in the client's context: a client that goes away cancels it.
	pctx, pcancel := context.WithCancel(r.Context())
	defer pcancel()
	pctx = httptrace.WithClientTrace(pctx, &httptrace.ClientTrace{
		// The request is on its way to the prefill engine: the decode leg may go. Before a
		// connection, a dial error may still move the leg to another engine (another host).
		GotConn: func(httptrace.GotConnInfo) { l.reach() },
	})
	rec := &drainRecorder{header: make(http.Header), reached: l.reach}
	leg, out, finish := legRequest(pctx, r, lr, base, rec)
	caddyhttp.SetVar(leg.Context(), varSGLangLeg, l)
	dctx, dcancel := context.WithCancel(r.Context())
	defer dcancel()
	var prefillErr error
	var refused bool // the prefill engine answered a 4xx: the client's answer unless the decode engine's comes
	var shed bool    // the prefill pool shed the leg: its policy's 429 is the client's answer
	prefillDone := make(chan struct{})
	prefillEnded := make(chan struct{}) // the prefill leg's outcome is known
	gate := &decodeGate{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, prefillEnded: prefillEnded, committed: make(chan struct{}), lr: lr}
	go func() {
		defer close(prefillDone)
		start := time.Now()
		err := serveLeg(d.prefill, out, leg)
		finish(err)
		switch {
		case pctx.Err() != nil && r.Context().Err() == nil:
			// Cancelled here with the client still there: the decode leg is over (its outcome,
			// or the 502 of a leg that never went, is the client's answer) and this one's is
			// no one's. Caddy's reverse proxy records a cancelled leg as a 499 of its own
			// ("client closed request"), no engine's refusal: taken for one, it was the
			// client's answer.
			close(prefillEnded)
			return
		case legShed(leg):
			// The prefill pool is full and its flow_control shed the leg before any engine got
			// it: the 429 its policy wrote (Retry-After, the error body) is the client's
			// answer, as from a pool without P/D. The reverse proxy's own error that follows
			// (no upstream) is not a failed leg.
			shed = true
			close(prefillEnded)
			return
		case err != nil:
		case rec.over:
			err = errors.New("prefill answer over its bound")
		case rec.status >= 400 && rec.status <= 499:
			// The engine refused the request (too long a prompt, a bad parameter): not a failed
			// leg but the client's answer. The decode engine checks the same body and most
			// likely refuses it too: its answer, if it comes within decodeErrorHold, is the
			// client's; else the decode leg, which waits for a room no prefill will fill, is
			// cancelled and the client gets this one.
			refused = true
			close(prefillEnded)
			t := time.NewTimer(decodeErrorHold)
			select {
			case <-gate.committed:
			case <-t.C:
			case <-pctx.Done(): // the client left: nothing to wait for
			}
			t.Stop()
			if gate.abort() {
				dcancel()
			}
			return
		case rec.status < 200 || rec.status > 299:
			err = fmt.Errorf("prefill answer status %d", rec.status)
		default:
			disaggMetrics.prefillSeconds.Observe(time.Since(start).Seconds())
		}
		defer close(prefillEnded)
		if err != nil {
			l.mu.Lock()
			if l.pickErr != nil {
				err = fmt.Errorf("%w (%w)", err, l.pickErr)
			}
			l.mu.Unlock()
			prefillErr = err
			// The decode engine waits for a room no prefill engine will fill: unless it has
			// answered already (the KV arrived), the request fails here, cleanly.
			if gate.abort() {
				dcancel()
			}
		}
	}()

	select {
	case <-l.reached:
	case <-prefillDone:
	}
	select {
	case <-l.reached:
	default:
		if shed {
			d.count(disaggShed)
			return rec.answer(w)
		}
		if refused {
			d.count(disaggSplit)
			return rec.answer(w)
		}
		// The prefill leg ended without reaching an engine (none available, dial errors, a
		// refusal): the decode leg is never sent.
		d.count(disaggPrefillFailed)
		if r.Context().Err() != nil {
			return caddyhttp.Error(499, r.Context().Err())
		}
		d.logger.Debug("prefill leg failed: the request is not split", zap.Error(prefillErr))
		return caddyhttp.Error(http.StatusBadGateway, fmt.Errorf("llm_disaggregate: prefill leg: %w", prefillErr))
	}

	l.mu.Lock()
	body := l.body
	l.mu.Unlock()
	if body == nil {
		// Reached without a pick: a policy that returned an upstream bootstrapPolicy never saw.
		pcancel()
		<-prefillDone
		d.count(disaggPrefillFailed)
		return caddyhttp.Error(http.StatusBadGateway, errors.New("llm_disaggregate: the prefill leg went out without bootstrap fields"))
	}
	holdBody(r, lr, body)
	lr.leg = legDecode
	// The decode answer's headers go into w's as the proxy reads them, before the gate knows
	// whether the answer is the client's: an answer the gate stopped leaves them behind.
	saved := w.Header().Clone()
	decodeErr := decodeLeg(gate, next, r.WithContext(dctx))
	if decodeErr == nil {
		gate.release() // a 2xx answer without a body: its header goes now
	}

	// The prefill leg: once the decode leg answered in full, a short grace for its own answer;
	// after a decode failure, none (its KV will not be taken).
	if decodeErr == nil && gate.ok() {
		select {
		case <-prefillDone:
		case <-time.After(prefillDrainGrace):
		}
	}
	pcancel()
	<-prefillDone
	if gate.aborted() || errors.Is(decodeErr, errDecodeCut) {
		// Nothing of the decode answer went out: none of its headers (a Content-Length of
		// its own would make the error below a broken answer).
		restoreHeader(w.Header(), saved)
	}
	if gate.aborted() && refused && r.Context().Err() == nil {
		d.count(disaggSplit)
		return rec.answer(w)
	}
	if gate.aborted() {
		d.count(disaggPrefillFailed)
		if r.Context().Err() != nil {
			return caddyhttp.Error(499, r.Context().Err())
		}
		d.logger.Debug("prefill leg failed before the decode engine answered", zap.Error(prefillErr))
		return caddyhttp.Error(http.StatusBadGateway, fmt.Errorf("llm_disaggregate: prefill leg: %w", prefillErr))
	}
	if lr.shed.Load() {
		d.count(disaggShed)
		return decodeErr
	}
	d.count(disaggSplit)
	if errors.Is(decodeErr, errDecodeCut) {
		return caddyhttp.Error(http.StatusBadGateway, decodeErr)
	}
	return decodeErr
}

// legShed reports whether the prefill pool's policy shed the leg (kv_cache_aware's
// flow_control: answered 429 into the leg's recorder).
func legShed(leg *http.Request) bool {
	plr, _ := caddyhttp.GetVar(leg.Context(), varRequest).(*llmRequest)
	return plr != nil && plr.shed.Load()
}

// restoreHeader makes h what it was (saved).
func restoreHeader(h, saved http.Header) {
	for k := range h {
		delete(h, k)
	}
	for k, v := range saved {
		h[k] = v
	}
}

var errDecodeCut = errors.New("llm_disaggregate: the decode answer broke off before its first byte of body")

// decodeLeg runs the decode pool's handler through the gate. The gate holds a 2xx header until
// the answer's first byte of body, so a decode leg that ends after its header and before any
// body (the gate aborted it: the prefill leg failed; or the decode engine broke off) ends in
// the reverse proxy's panic(http.ErrAbortHandler), which is for a response already under way:
// nothing of it reached the client, so the panic is recovered and the request answered.
func decodeLeg(gate *decodeGate, next caddyhttp.Handler, r *http.Request) (err error) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler || gate.passed() {
				panic(v)
			}
			if gate.aborted() {
				err = errGateAborted
			} else {
				err = errDecodeCut
			}
		}
	}()
	return next.ServeHTTP(gate, r)
}

// holdBody makes body the request's held body: every attempt of the decode pool resends it.
func holdBody(r *http.Request, lr *llmRequest, body []byte) {
	lr.body = llmreq.Hold(r, body)
	lr.maxBody = max(lr.maxBody, int64(len(body)))
	r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	r.Header.Del("Transfer-Encoding")
}

// decodeGate passes the decode leg's answer to the client unless the request failed first: a
// prefill leg that fails before the decode engine answered turns the request into a clean
// error (nothing of the decode leg written); one that fails after it leaves the answer be.
// A decode engine has answered with its first byte of body, or an error status: SGLang's
// streamed answers send their 200 header at once and then wait for the room's KV, so a 2xx
// header is held (pending) until the first byte of body, or the answer's end.
type decodeGate struct {
	caddyhttp.ResponseWriterWrapper
	lr           *llmRequest // the decode leg's: shed when the decode pool's flow_control answered
	prefillEnded <-chan struct{}
	committed    chan struct{} // closed when the decode answer starts going to the client
	mu           sync.Mutex
	state        int // gateOpen, gateCommitted, gateAborted
	status       int
	pending      int // a 2xx status held until the first byte of body
}

const (
	gateOpen = iota
	gateCommitted
	gateAborted
)

var errGateAborted = errors.New("llm_disaggregate: the prefill leg failed; the decode answer is dropped")

// abort closes the gate if nothing passed yet, and reports whether it did.
func (g *decodeGate) abort() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state == gateOpen {
		g.state = gateAborted
	}
	return g.state == gateAborted
}

func (g *decodeGate) open() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state == gateOpen
}

// passed reports whether anything of the decode answer went to the client.
func (g *decodeGate) passed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state == gateCommitted
}

// release lets a held 2xx header through once the decode answer ended without a body.
func (g *decodeGate) release() {
	g.mu.Lock()
	code := g.pending
	g.mu.Unlock()
	if code != 0 && g.commit(code) {
		g.ResponseWriter.WriteHeader(code)
	}
}

func (g *decodeGate) aborted() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state == gateAborted
}

// ok reports whether the decode leg answered a success.
func (g *decodeGate) ok() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state == gateCommitted && g.status >= 200 && g.status <= 299
}

// commit lets the answer through from its first byte of body or its error header on; false
// once aborted.
func (g *decodeGate) commit(code int) bool {
	ok, _ := g.commitFirst(code)
	return ok
}

// commitFirst is commit, and reports whether this call committed.
func (g *decodeGate) commitFirst(code int) (ok, first bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch g.state {
	case gateAborted:
		return false, false
	case gateOpen:
		if code < 200 {
			return true, false // an informational answer commits nothing
		}
		g.state, g.status = gateCommitted, code
		close(g.committed)
		return true, true
	}
	return true, false
}

func (g *decodeGate) WriteHeader(code int) {
	if code >= 300 && g.open() && !g.lr.shed.Load() {
		// An error answer waits, at most decodeErrorHold, for the prefill leg to end: if that
		// failed, the gate is closed by then and the client gets the prefill leg's 502. Not the
		// 429 of a decode pool that shed the leg: no decode engine got it, so nothing of the
		// prefill leg's fate changes it, and the prefill engine would only hold its KV longer
		// (it is cancelled once this answer is out).
		t := time.NewTimer(decodeErrorHold)
		select {
		case <-g.prefillEnded:
		case <-t.C:
		}
		t.Stop()
	}
	if code >= 200 && code <= 299 {
		g.mu.Lock()
		if g.state == gateOpen {
			if g.pending == 0 {
				g.pending = code // goes with the first byte of body
			}
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
	}
	if g.commit(code) {
		g.ResponseWriter.WriteHeader(code)
	}
}

func (g *decodeGate) Write(p []byte) (int, error) {
	if len(p) == 0 {
		if g.aborted() {
			return 0, errGateAborted
		}
		return 0, nil
	}
	g.mu.Lock()
	code := g.pending
	g.mu.Unlock()
	if code == 0 {
		code = http.StatusOK
	}
	ok, first := g.commitFirst(code)
	if !ok {
		return 0, errGateAborted
	}
	if first {
		g.ResponseWriter.WriteHeader(code)
	}
	return g.ResponseWriter.Write(p)
}

// FlushError flushes what passed the gate; before that, nothing (a flush would send the held
// header).
func (g *decodeGate) FlushError() error {
	if !g.passed() {
		return nil
	}
	return http.NewResponseController(g.ResponseWriter).Flush()
}

// Flush is FlushError for callers that know only http.Flusher.
func (g *decodeGate) Flush() { _ = g.FlushError() }

// ReadFrom goes through Write: the embedded wrapper's would bypass the gate.
func (g *decodeGate) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{g}, r)
}

// drainRecorder takes a prefill leg's answer under protocol sglang: the status, and the body
// read and discarded, at most maxPrefillAnswer bytes of it (the answer is one token; more is
// an engine gone wrong, and the leg ends); the body of a 4xx answer is kept, for the client.
type drainRecorder struct {
	header  http.Header
	status  int
	n       int
	over    bool
	reached func() // the prefill engine answered: it was reached, whatever the transport said
	refusal bytes.Buffer
}

// answer writes a 4xx answer of the prefill engine to the client as the engine gave it.
func (w *drainRecorder) answer(to http.ResponseWriter) error {
	h := to.Header()
	for k, v := range w.header {
		if k != "Content-Length" {
			h[k] = v
		}
	}
	to.WriteHeader(w.status)
	_, err := to.Write(w.refusal.Bytes())
	return err
}

func (w *drainRecorder) Header() http.Header { return w.header }

func (w *drainRecorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
		if code <= 299 {
			w.reached()
		}
	}
}

func (w *drainRecorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.n+len(p) > maxPrefillAnswer {
		w.over = true
		return 0, errPrefillAnswerTooLarge
	}
	w.n += len(p)
	if w.status >= 400 && w.status <= 499 {
		w.refusal.Write(p)
	}
	return len(p), nil
}

// Flush does nothing: the answer is discarded.
func (w *drainRecorder) Flush() {}
