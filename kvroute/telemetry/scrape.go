package telemetry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	DefaultInterval   = time.Second
	DefaultTimeout    = 500 * time.Millisecond
	DefaultMaxBackoff = 10 * time.Second
	DefaultMaxTargets = 1024
	// PropsRefresh is how often llama.cpp's /props is read again while the server stays up:
	// n_ctx changes only when the server restarts, which a failed scrape notices first.
	PropsRefresh = 5 * time.Minute
)

// maxKeptBuffer is the largest page buffer a target keeps between scrapes: a real page is
// tens of KB, and keeping the buffer of one huge page for every later scrape would hold up to
// MaxBytes per target for nothing.
const maxKeptBuffer = 1 << 20

// ErrTooManyTargets is returned by Add beyond Options.MaxTargets.
var ErrTooManyTargets = errors.New("too many telemetry targets")

// Outcome classifies one scrape attempt. Only OutcomeRefused says anything of the upstream's
// health; the others say something of its metrics endpoint.
type Outcome uint8

// The outcomes of a scrape.
const (
	// OutcomeNone: no attempt yet.
	OutcomeNone Outcome = iota
	// OutcomeOK: a reading.
	OutcomeOK
	// OutcomeRefused: no connection could be made (refused, unreachable, the dial timed out).
	// A caller counts it as a health failure of the upstream.
	OutcomeRefused
	// OutcomeNotFound: the endpoint answered 404, 410 or 501: the upstream has no telemetry.
	OutcomeNotFound
	// OutcomeStale: the endpoint accepted the connection but did not answer within Timeout.
	// The last reading stays, and ages.
	OutcomeStale
	// OutcomeBroken: the connection failed after it was made (reset, closed early).
	OutcomeBroken
	// OutcomeStatus: the endpoint answered with a status other than 200, 404, 410 and 501.
	OutcomeStatus
	// OutcomeTooLarge: the page was larger than MaxBytes.
	OutcomeTooLarge
	// OutcomeGarbled: the page is not Prometheus text.
	OutcomeGarbled
	// OutcomeNoEngine: the page has none of the families Parse understands.
	OutcomeNoEngine
	// OutcomeInvalid: the families are there, but every value was invalid (NaN, negative,
	// a capacity of 0...).
	OutcomeInvalid
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"none", "ok", "refused", "not_found", "stale", "broken", "status", "too_large", "garbled", "no_engine", "invalid"}

func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return "outcome(" + fmt.Sprint(uint8(o)) + ")"
}

// MarshalText writes String, for the admin API's JSON.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// Outcomes lists every outcome but OutcomeNone, in order: the label values of a counter of
// scrapes by outcome.
func Outcomes() []Outcome {
	out := make([]Outcome, 0, numOutcomes-1)
	for o := OutcomeOK; o < numOutcomes; o++ {
		out = append(out, o)
	}
	return out
}

// Counts counts a target's scrapes by outcome, since the target was added.
type Counts [numOutcomes]uint64

// MarshalJSON writes the counts as an object keyed by outcome name, zeros left out.
func (c Counts) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for o := OutcomeOK; o < numOutcomes; o++ {
		if c[o] == 0 {
			continue
		}
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:%d", o.String(), c[o])
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Target is one upstream's metrics endpoint.
type Target struct {
	// Key names the target: the upstream's dial address, as the caller's state keys upstreams.
	Key string
	// URL is the metrics endpoint: the upstream's metrics_url, or "<scheme>://<dial>/metrics".
	URL string
}

// MetricsURL is an upstream's default metrics endpoint: scheme ("http" or "https", from the
// proxy's transport), the upstream's dial address (host:port, an IPv6 host in brackets) and
// path ("/metrics" when empty).
func MetricsURL(scheme, dial, path string) string {
	if path == "" {
		path = "/metrics"
	} else if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return (&url.URL{Scheme: scheme, Host: dial, Path: path}).String()
}

// Snapshot is the state of one target after its latest scrape. Snapshots are immutable: a
// scrape publishes a new one, so a reader holds a consistent view for as long as it likes.
type Snapshot struct {
	Key string `json:"key"`
	URL string `json:"url"`
	// Reading is the latest successful reading; Reading.At is zero when there has been none.
	Reading Reading `json:"reading"`
	// Outcome is that of the latest attempt, made at Attempted.
	Outcome   Outcome   `json:"outcome"`
	Attempted time.Time `json:"attempted"`
	// Failures counts the attempts since the latest OutcomeOK (0 after a reading).
	Failures int `json:"failures"`
	// LastError is the text of the latest failed attempt's error, at LastErrorAt; it stays
	// after later successes, for the admin API.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// Counts counts the attempts by outcome; Ignored adds up the readings' ignored samples.
	Counts  Counts `json:"counts"`
	Ignored uint64 `json:"ignored_samples"`
	// FromPeer: Reading came from another replica that read the engine (Adopt), not from an
	// attempt of this Scraper.
	FromPeer bool `json:"from_peer,omitempty"`
	// Delta is what the engine's totals say of the time since this Scraper's previous reading
	// of it (Diff); nil unless this attempt brought a reading and there was a previous one.
	Delta *Delta `json:"delta,omitempty"`
	// Restarts counts the restarts Diff saw; Anomalies the deltas it found something wrong
	// with (a wobble, a total gone, another model, an absurd rate, changed buckets).
	Restarts  uint64 `json:"restarts"`
	Anomalies uint64 `json:"anomalies"`
	// Models is the latest model list read from the engine's /v1/models (Options.ModelsEvery),
	// at ModelsAt; nil until one was read. It stays when a later read fails.
	Models   *ModelList `json:"models,omitempty"`
	ModelsAt time.Time  `json:"models_at,omitzero"`
	// ModelsOutcome is that of the latest read of the list (OutcomeNoEngine: not a model
	// list), ModelsError its error; ModelsCounts counts the reads by outcome.
	ModelsOutcome Outcome `json:"models_outcome"`
	ModelsError   string  `json:"models_error,omitempty"`
	ModelsCounts  Counts  `json:"models_counts"`
}

// Age is the age of the latest reading at now, or -1 when there has been none.
func (s *Snapshot) Age(now time.Time) time.Duration {
	if s == nil || s.Reading.At.IsZero() {
		return -1
	}
	return now.Sub(s.Reading.At)
}

// Fresh reports whether the latest reading is at most maxAge old at now.
func (s *Snapshot) Fresh(now time.Time, maxAge time.Duration) bool {
	age := s.Age(now)
	return age >= 0 && age <= maxAge
}

// Options configure a Scraper. Zero fields take the defaults.
type Options struct {
	// Interval is the time between two scrapes of one target.
	Interval time.Duration
	// Timeout bounds one scrape: connecting, the headers and the whole page.
	Timeout time.Duration
	// MaxBackoff bounds the wait after failures: the wait doubles from Interval with each
	// failure in a row, up to MaxBackoff (or Interval, when that is longer).
	MaxBackoff time.Duration
	// MaxBytes bounds a page (DefaultMaxBytes).
	MaxBytes int64
	// MaxTargets bounds the targets: Add refuses more.
	MaxTargets int
	// Client does the requests. The default has its own transport: no proxy from the
	// environment (the endpoint is the upstream's own), no compression (pages are small
	// and, on the local network engines sit on, gunzip costs more CPU than it saves), one
	// idle connection per upstream, 64 KiB of response headers at most. A caller whose
	// upstreams need TLS settings gives its own.
	Client *http.Client
	// Observe, when set, is called after every attempt with the target's previous and new
	// snapshots (prev is nil after the first attempt), from the target's own goroutine: it
	// must return quickly. It is where a caller logs telemetry appearing or going away and
	// counts refused connections as health failures. A scrape that ends as its target is
	// removed may still be observed once.
	Observe func(prev, cur *Snapshot)
	// ModelsEvery, when positive, makes each target's loop also read the engine's GET
	// /v1/models (beside the metrics URL: ModelsURL) this often, and again at once after a
	// restart or a run of refused connections (the engine may come back with other models).
	// A failed read is retried with the scrapes' backoff, up to ModelsEvery. Zero: not read.
	ModelsEvery time.Duration
	// Resolver, when set, resolves the targets' host names for the default Client (a proxy
	// whose transport names its own DNS resolvers: the readers dial as the proxy does).
	Resolver *net.Resolver
	// Header is added to every request (the metrics page, /v1/models, llama.cpp's /props):
	// an engine started with an API key wants it on /v1/models. Never logged.
	Header http.Header
	// Skip, when set, is asked before each scrape of a target (from its goroutine; it must
	// return quickly): true leaves this scrape out, and the target is asked again an interval
	// later. A cluster replica skips an engine another replica reads for it (Adopt).
	Skip func(key string) bool
}

func (o Options) withDefaults() Options {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	o.MaxBackoff = max(o.MaxBackoff, o.Interval)
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxTargets <= 0 {
		o.MaxTargets = DefaultMaxTargets
	}
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{
			DialContext:            (&net.Dialer{KeepAlive: 30 * time.Second, Resolver: o.Resolver}).DialContext,
			DisableCompression:     true,
			MaxIdleConnsPerHost:    1,
			IdleConnTimeout:        90 * time.Second,
			MaxResponseHeaderBytes: 64 << 10,
			ForceAttemptHTTP2:      true,
			TLSHandshakeTimeout:    o.Timeout,
		}}
	}
	return o
}

// Scraper reads the metrics endpoints of a set of targets, one goroutine per target, and keeps
// each target's latest Snapshot where readers find it without a lock. It is safe for
// concurrent use. A process has one (the caller's shared state owns it): however many
// policies name an upstream, it is read once per interval.
type Scraper struct {
	opts Options

	mu      sync.Mutex // serializes Add, Remove and Stop
	stopped bool
	// targets is replaced, never changed, under mu: Snapshot reads it with one atomic load.
	targets atomic.Pointer[map[string]*target]
	wg      sync.WaitGroup
}

// target is one scrape loop and its published snapshot.
type target struct {
	Target
	snap   atomic.Pointer[Snapshot]
	cancel context.CancelFunc

	// Owned by the loop's goroutine.
	buf      []byte
	parser   parser
	nCtx     int64 // llama.cpp's n_ctx from /props, 0 when unknown
	nCtxRead time.Time
	last     *Reading // the previous reading of this Scraper's own, for Diff
	// The model list's schedule: read when modelsNext is due (zero: at the next scrape).
	modelsNext     time.Time
	modelsFailures int
	modelsBuf      []byte
}

// NewScraper returns a Scraper with no targets.
func NewScraper(opts Options) *Scraper {
	s := &Scraper{opts: opts.withDefaults()}
	s.targets.Store(&map[string]*target{})
	return s
}

// Add starts reading t, if it is not read already. A target with a known Key and another URL
// is restarted on the new URL (its counts start again). It returns ErrTooManyTargets when the
// Scraper has MaxTargets targets, and an error for a URL that is not http or https.
func (s *Scraper) Add(t Target) error {
	u, err := url.Parse(t.URL)
	if err != nil {
		return fmt.Errorf("telemetry target %s: %w", t.Key, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("telemetry target %s: metrics URL %q: want http:// or https:// and a host", t.Key, t.URL)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errors.New("telemetry: scraper stopped")
	}
	old := *s.targets.Load()
	if cur, ok := old[t.Key]; ok {
		if cur.URL == t.URL {
			return nil
		}
	} else if len(old) >= s.opts.MaxTargets {
		return fmt.Errorf("telemetry target %s: %w (%d)", t.Key, ErrTooManyTargets, s.opts.MaxTargets)
	}
	next := make(map[string]*target, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	if cur, ok := old[t.Key]; ok {
		cur.cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	tg := &target{Target: t, cancel: cancel}
	next[t.Key] = tg
	s.targets.Store(&next)
	s.wg.Add(1)
	go s.run(ctx, tg)
	return nil
}

// Remove stops reading the target named key; its loop ends without waiting for a scrape in
// flight to finish.
func (s *Scraper) Remove(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.targets.Load()
	tg, ok := old[key]
	if !ok {
		return
	}
	tg.cancel()
	next := make(map[string]*target, len(old))
	for k, v := range old {
		if k != key {
			next[k] = v
		}
	}
	s.targets.Store(&next)
}

// Keys returns the keys of the targets, sorted.
func (s *Scraper) Keys() []string {
	m := *s.targets.Load()
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Snapshot returns the latest snapshot of the target named key, or nil when there is no such
// target or it has not been scraped yet. It takes no lock: the decision path may call it on
// every request.
func (s *Scraper) Snapshot(key string) *Snapshot {
	tg := (*s.targets.Load())[key]
	if tg == nil {
		return nil
	}
	return tg.snap.Load()
}

// Snapshots returns the latest snapshot of every target that has been scraped, sorted by key:
// the admin API's and the metrics' view.
func (s *Scraper) Snapshots() []*Snapshot {
	m := *s.targets.Load()
	out := make([]*Snapshot, 0, len(m))
	for _, tg := range m {
		if snap := tg.snap.Load(); snap != nil {
			out = append(out, snap)
		}
	}
	slices.SortFunc(out, func(a, b *Snapshot) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Interval is the time between two scrapes of one target.
func (s *Scraper) Interval() time.Duration { return s.opts.Interval }

// Adopt publishes r, a reading another replica took of the target named key, as the target's
// latest reading (FromPeer set, Outcome OK, its attempt counts unchanged), and returns the
// previous and new snapshots for the caller to observe as it observes a scrape. It does
// nothing (ok false) when there is no such target or r is not newer than the latest reading.
// It does not call Options.Observe: it runs on the caller's goroutine.
func (s *Scraper) Adopt(key string, r Reading) (prev, cur *Snapshot, ok bool) {
	tg := (*s.targets.Load())[key]
	if tg == nil || r.At.IsZero() {
		return nil, nil, false
	}
	for {
		prev = tg.snap.Load()
		next := &Snapshot{Key: tg.Key, URL: tg.URL}
		if prev != nil {
			if !r.At.After(prev.Reading.At) {
				return nil, nil, false
			}
			*next = *prev
		}
		next.Reading, next.Outcome, next.Failures, next.FromPeer = r, OutcomeOK, 0, true
		next.Delta = nil // a peer's reading has no totals: the interval is the owner's
		if tg.snap.CompareAndSwap(prev, next) {
			return prev, next, true
		}
	}
}

// Stop ends every loop and waits for them: when it returns, no goroutine of the Scraper is
// left. Add fails after Stop.
func (s *Scraper) Stop() {
	s.mu.Lock()
	s.stopped = true
	for _, tg := range *s.targets.Load() {
		tg.cancel()
	}
	s.targets.Store(&map[string]*target{})
	s.mu.Unlock()
	s.wg.Wait()
	// Idle keep-alive connections hold two goroutines each in net/http's transport.
	s.opts.Client.CloseIdleConnections()
}

// firstScrapeSpread spreads the first scrapes of targets added at once (a config load) so that
// they do not all connect in the same instant; it is short because the first reading brings
// the upstream's KV capacity. The ±10% jitter of later waits keeps them apart after that.
const firstScrapeSpread = 100 * time.Millisecond

// run is a target's loop: the first scrape soon after Add, then one per interval, backing off
// after failures.
func (s *Scraper) run(ctx context.Context, tg *target) {
	defer s.wg.Done()
	timer := time.NewTimer(jitter(min(s.opts.Interval, firstScrapeSpread), 0, 1))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if s.opts.Skip != nil && s.opts.Skip(tg.Key) {
			// Another replica reads the metrics; the model list is not shared, so it is read
			// here still.
			if s.opts.ModelsEvery > 0 && !time.Now().Before(tg.modelsNext) && !s.modelsOnly(ctx, tg) {
				return
			}
			timer.Reset(s.wait(0))
			continue
		}
		snap := s.scrape(ctx, tg)
		if snap == nil {
			return // stopped during the scrape
		}
		prev := tg.snap.Swap(snap)
		if s.opts.Observe != nil {
			s.opts.Observe(prev, snap)
		}
		timer.Reset(s.wait(snap.Failures))
	}
}

// wait is the time to the next scrape after failures failures in a row, with ±10% of jitter.
func (s *Scraper) wait(failures int) time.Duration {
	d := s.opts.Interval
	for i := 0; i < failures && d < s.opts.MaxBackoff; i++ {
		d *= 2
	}
	return jitter(min(d, s.opts.MaxBackoff), 0.9, 1.1)
}

func jitter(d time.Duration, lo, hi float64) time.Duration {
	return time.Duration(float64(d) * (lo + rand.Float64()*(hi-lo)))
}

// scrape makes one attempt and returns the target's next snapshot, or nil when ctx ended.
func (s *Scraper) scrape(ctx context.Context, tg *target) *Snapshot {
	now := time.Now()
	reading, outcome, err := s.fetch(ctx, tg)
	if ctx.Err() != nil {
		return nil
	}
	next := &Snapshot{Key: tg.Key, URL: tg.URL, Outcome: outcome, Attempted: now}
	if prev := tg.snap.Load(); prev != nil {
		next.Reading, next.Failures = prev.Reading, prev.Failures
		next.LastError, next.LastErrorAt = prev.LastError, prev.LastErrorAt
		next.Counts, next.Ignored = prev.Counts, prev.Ignored
		next.FromPeer = prev.FromPeer
		next.Restarts, next.Anomalies = prev.Restarts, prev.Anomalies
		next.Models, next.ModelsAt = prev.Models, prev.ModelsAt
		next.ModelsOutcome, next.ModelsError, next.ModelsCounts = prev.ModelsOutcome, prev.ModelsError, prev.ModelsCounts
	}
	next.Counts[outcome]++
	next.Ignored += uint64(reading.Ignored)
	if outcome == OutcomeOK {
		next.Reading, next.Failures, next.FromPeer = reading, 0, false
		if tg.last != nil {
			d := Diff(tg.last, &reading)
			next.Delta = &d
			if d.Restart {
				next.Restarts++
			}
			if d.Anomalies != 0 {
				next.Anomalies++
			}
		}
		tg.last = &next.Reading
		if next.Delta != nil && next.Delta.Restart {
			tg.modelsNext = time.Time{} // a restarted engine may serve other models
		}
	} else {
		next.Failures++
		next.LastError, next.LastErrorAt = err.Error(), now
		tg.nCtxRead = time.Time{} // a restarted llama.cpp may have another n_ctx
	}
	if outcome == OutcomeRefused {
		// Down, perhaps restarting: the list is read again as soon as the engine answers.
		tg.modelsNext = time.Time{}
	} else if s.opts.ModelsEvery > 0 && !now.Before(tg.modelsNext) {
		s.readModels(ctx, tg, next, now)
		if ctx.Err() != nil {
			return nil
		}
	}
	return next
}

// modelsOnly reads the target's model list without a scrape and publishes it in a new
// snapshot (not observed: nothing else changed). It reports false when ctx ended.
func (s *Scraper) modelsOnly(ctx context.Context, tg *target) bool {
	now := time.Now()
	tmp := &Snapshot{}
	if prev := tg.snap.Load(); prev != nil {
		tmp.ModelsCounts = prev.ModelsCounts
	}
	s.readModels(ctx, tg, tmp, now)
	if ctx.Err() != nil {
		return false
	}
	for {
		prev := tg.snap.Load()
		next := &Snapshot{Key: tg.Key, URL: tg.URL}
		if prev != nil {
			*next = *prev
			next.Delta = nil
		}
		if tmp.Models != nil {
			next.Models, next.ModelsAt = tmp.Models, tmp.ModelsAt
		}
		next.ModelsOutcome, next.ModelsError, next.ModelsCounts = tmp.ModelsOutcome, tmp.ModelsError, tmp.ModelsCounts
		if tg.snap.CompareAndSwap(prev, next) {
			return true
		}
	}
}

// readModels reads the target's model list into next and schedules the next read: after
// ModelsEvery, or after a failure with the scrapes' backoff (capped at ModelsEvery).
func (s *Scraper) readModels(ctx context.Context, tg *target, next *Snapshot, now time.Time) {
	outcome, err := s.fetchModels(ctx, tg, next)
	if ctx.Err() != nil {
		return
	}
	next.ModelsOutcome = outcome
	next.ModelsCounts[outcome]++
	if err != nil {
		next.ModelsError = err.Error()
		tg.modelsFailures++
		tg.modelsNext = now.Add(min(s.wait(tg.modelsFailures), s.opts.ModelsEvery))
		return
	}
	next.ModelsError = ""
	tg.modelsFailures = 0
	tg.modelsNext = now.Add(jitter(s.opts.ModelsEvery, 0.9, 1.1))
}

// fetchModels reads and parses the target's /v1/models.
func (s *Scraper) fetchModels(ctx context.Context, tg *target, next *Snapshot) (Outcome, error) {
	u, err := ModelsURL(tg.URL)
	if err != nil {
		return OutcomeStatus, err
	}
	body, answered, outcome, err := s.get(ctx, u, &tg.modelsBuf, MaxModelsBytes)
	defer func() {
		if cap(tg.modelsBuf) > maxKeptBuffer {
			tg.modelsBuf = nil
		}
	}()
	if err != nil {
		return outcome, err
	}
	l, err := ParseModels(body)
	if err != nil {
		return OutcomeGarbled, fmt.Errorf("GET %s: %w", u, err)
	}
	next.Models, next.ModelsAt = &l, answered
	return OutcomeOK, nil
}

// fetch reads and parses the target's page, classifying what went wrong.
func (s *Scraper) fetch(ctx context.Context, tg *target) (Reading, Outcome, error) {
	body, answered, outcome, err := s.get(ctx, tg.URL, &tg.buf, s.opts.MaxBytes)
	// Parse works on body, in the buffer: a buffer grown by a huge page is dropped only once
	// parsed, and an oversized page's buffer at once.
	defer func() {
		if cap(tg.buf) > maxKeptBuffer {
			tg.buf = nil
		}
		if cap(tg.parser.kept) > maxKeptBuffer {
			tg.parser.kept = nil
		}
	}()
	if err != nil {
		return Reading{}, outcome, err
	}
	r, err := tg.parser.parse(body)
	switch {
	case errors.Is(err, ErrGarbled):
		return r, OutcomeGarbled, err
	case errors.Is(err, ErrNoEngine):
		return r, OutcomeNoEngine, err
	case errors.Is(err, ErrInvalid):
		return r, OutcomeInvalid, err
	case err != nil:
		return r, OutcomeGarbled, err
	}
	if r.Engine == EngineLlamaCpp && !r.Known.Has(HasKVCapacity) {
		if n := s.llamaCppContext(ctx, tg); n > 0 {
			r.KVCapacityTokens, r.Known = n, r.Known|HasKVCapacity
		}
	}
	r.At = answered
	return r, OutcomeOK, nil
}

// llamaCppContext returns llama.cpp's n_ctx from /props beside the metrics URL, read at most
// every PropsRefresh (or again after a failed scrape); 0 when unknown. A failure here costs
// the reading nothing but its capacity.
func (s *Scraper) llamaCppContext(ctx context.Context, tg *target) int64 {
	if !tg.nCtxRead.IsZero() && time.Since(tg.nCtxRead) < PropsRefresh {
		return tg.nCtx
	}
	u, err := url.Parse(tg.URL)
	if err != nil {
		return 0
	}
	u.Path, u.RawQuery = strings.TrimSuffix(u.Path, "/metrics")+"/props", ""
	var buf []byte
	body, _, _, err := s.get(ctx, u.String(), &buf, maxPropsBytes)
	tg.nCtxRead = time.Now()
	tg.nCtx = 0
	if err == nil {
		if n, err := ParseProps(bytes.NewReader(body), maxPropsBytes); err == nil {
			tg.nCtx = n
		}
	}
	return tg.nCtx
}

// get reads url into buf, at most limit bytes, within the scrape timeout. answered is when the
// response headers arrived: the moment the engine wrote its gauges.
func (s *Scraper) get(ctx context.Context, url string, buf *[]byte, limit int64) (body []byte, answered time.Time, _ Outcome, _ error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	// Whether a connection was made tells a down upstream (refused, unreachable: a health
	// failure) from a slow or broken endpoint (not one).
	var connected atomic.Bool
	// ConnectDone marks the TCP connection (a TLS handshake that fails after it is a broken
	// endpoint, not a down upstream); GotConn marks a reused one, which has no ConnectDone.
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		ConnectDone: func(_, _ string, err error) {
			if err == nil {
				connected.Store(true)
			}
		},
		GotConn: func(httptrace.GotConnInfo) { connected.Store(true) },
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, time.Time{}, OutcomeStatus, fmt.Errorf("GET %s: %w", url, err)
	}
	for k, v := range s.opts.Header {
		req.Header[k] = v
	}
	// The text format only: an engine that also speaks protobuf or OpenMetrics keeps to it.
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		return nil, time.Time{}, transportOutcome(err, connected.Load()), fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	answered = time.Now()
	switch {
	// 501 is llama.cpp's server started without --metrics ("This server does not support
	// metrics endpoint"): no telemetry, as a 404 is.
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone || resp.StatusCode == http.StatusNotImplemented:
		return nil, answered, OutcomeNotFound, fmt.Errorf("GET %s: %s: no telemetry", url, resp.Status)
	case resp.StatusCode != http.StatusOK:
		return nil, answered, OutcomeStatus, fmt.Errorf("GET %s: %s", url, resp.Status)
	case resp.ContentLength > limit:
		return nil, answered, OutcomeTooLarge, fmt.Errorf("GET %s: %w (Content-Length %d > %d)", url, ErrTooLarge, resp.ContentLength, limit)
	}
	*buf, err = readBounded(resp.Body, *buf, limit)
	if err != nil {
		return nil, answered, transportOutcome(err, true), fmt.Errorf("GET %s: reading the page: %w", url, err)
	}
	if int64(len(*buf)) > limit {
		return nil, answered, OutcomeTooLarge, fmt.Errorf("GET %s: %w (more than %d bytes)", url, ErrTooLarge, limit)
	}
	return *buf, answered, OutcomeOK, nil
}

// readBounded reads r into buf[:0] until EOF or until it holds more than limit bytes. The
// buffer grows as bytes arrive, whatever the headers announced, doubling but never beyond
// limit+1: a page cut at the bound costs about twice the bound in all, not the page.
func readBounded(r io.Reader, buf []byte, limit int64) ([]byte, error) {
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > limit {
				return buf, nil
			}
			size := max(2*int64(cap(buf)), 16<<10)
			if size >= limit {
				size = limit + 1 // the last step: one byte more than the bound tells a page over it
			}
			next := make([]byte, len(buf), size)
			copy(next, buf)
			buf = next
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// transportOutcome classifies a failed request: no connection made is Refused whatever the
// cause (refused, no route, the dial timed out); once connected, a timeout makes the reading
// stale and anything else is a broken connection.
func transportOutcome(err error, connected bool) Outcome {
	switch {
	case !connected:
		return OutcomeRefused
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return OutcomeStale
	default:
		return OutcomeBroken
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
