package kvroute

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"golang.org/x/net/http/httpguts"

	"github.com/kvroute/caddy-kvroute/energy"
	"github.com/kvroute/caddy-kvroute/kvroute/cluster"
	"github.com/kvroute/caddy-kvroute/kvroute/decide"
)

// Defaults of the policy's and the matcher's options: the one place where they are defined.
const (
	DefaultCacheThreshold      = 0.1
	DefaultBalanceAbsThreshold = 4
	DefaultBalanceRelThreshold = 1.5
	DefaultOnImbalance         = "prefix_in_band"
	DefaultEvictionInterval    = 120 * time.Second
	DefaultMaxTreeSize         = 64 << 20 // chars
	DefaultSessionHeader       = "X-Session-ID"
	DefaultCookieName          = "kvroute_session"
	DefaultSessionTTL          = 30 * time.Minute
	DefaultMaxSessions         = 100000
	DefaultExpectedTokens      = 256
	DefaultFallback            = "joule"
	DefaultDecision            = decisionThresholds
	DefaultObjective           = objectiveLatency
	DefaultTTFTSlack           = 5.0
	// DefaultMaxBody is how many body bytes are read for routing when neither the matcher nor
	// the policy says otherwise. Larger bodies route on their first DefaultMaxBody bytes and
	// still reach the upstream whole.
	DefaultMaxBody = 4 << 20
)

// Lower bounds that keep options sensible: an eviction pass scans every binding and walks the
// trees, so ticking faster than this only burns CPU; a session shorter than this cannot span
// two turns of a conversation; a cookie secret shorter than this can be guessed.
const (
	maxTTFTSlack        = 100 // a slack of 100× the best TTFT no longer bounds anything
	minEvictionInterval = time.Second
	minSessionTTL       = time.Second
	minSecretBytes      = 16
)

// settings are a policy's options with the defaults applied (and, once provisioned, the
// cookie secret's placeholders replaced).
type settings struct {
	cacheThreshold   float64
	absThreshold     int64
	relThreshold     float64
	onImbalance      string
	evictionInterval time.Duration
	maxTreeSize      int64
	sessionHeader    string
	sessionKey       string // sessionHeader in canonical form: looked up without a copy
	sessionTTL       time.Duration
	maxSessions      int
	expectedTokens   int
	fallback         string
	decision         string
	objective        string
	ttftSlack        float64
	explainHeader    string
	cookie           *SessionCookie // nil: no cookie sessions; Name defaulted
	cookieSecretSet  bool           // a secret was given, even if it resolved to nothing
	resolved         bool           // placeholders in the secret were replaced (Provision)
	secretErr        error          // a placeholder of the secret did not resolve
	telemetry        telemetrySettings
	cluster          *cluster.Config // nil: no cluster; the secret resolved like the cookie's
	clusterSecretSet bool
	telemetryErr     error // telemetry's auth_header did not resolve
	queueTimeout     time.Duration
	flow             *flowSettings // nil: no flow_control
	flowGiven        *FlowControl
}

// settings resolves p's options. With resolve, placeholders in the cookie secret are replaced
// (at provision time: the Caddyfile adapter may run on another machine than Caddy).
func (p *KVCacheAware) settings(resolve bool) settings {
	s := settings{
		cacheThreshold:   valueOr(p.CacheThreshold, DefaultCacheThreshold),
		absThreshold:     int64(valueOr(p.BalanceAbsThreshold, DefaultBalanceAbsThreshold)),
		relThreshold:     valueOr(p.BalanceRelThreshold, DefaultBalanceRelThreshold),
		onImbalance:      or(p.OnImbalance, DefaultOnImbalance),
		evictionInterval: or(time.Duration(p.EvictionInterval), DefaultEvictionInterval),
		maxTreeSize:      or(p.MaxTreeSize, DefaultMaxTreeSize),
		sessionHeader:    or(p.SessionHeader, DefaultSessionHeader),
		sessionKey:       http.CanonicalHeaderKey(or(p.SessionHeader, DefaultSessionHeader)),
		sessionTTL:       or(time.Duration(p.SessionTTL), DefaultSessionTTL),
		maxSessions:      or(p.MaxSessions, DefaultMaxSessions),
		expectedTokens:   or(p.ExpectedTokens, DefaultExpectedTokens),
		fallback:         or(p.Fallback, DefaultFallback),
		decision:         or(p.Decision, DefaultDecision),
		objective:        or(p.Objective, DefaultObjective),
		ttftSlack:        valueOr(p.TTFTSlack, DefaultTTFTSlack),
		explainHeader:    p.ExplainHeader,
		telemetry:        p.Telemetry.settings(),
		queueTimeout:     time.Duration(valueOr(p.QueueTimeout, caddy.Duration(DefaultQueueTimeout))),
		flowGiven:        p.FlowControl,
	}
	s.flow = p.FlowControl.settings(p.QueueTimeout)
	if c := p.SessionCookie; c != nil {
		s.cookie = &SessionCookie{Name: or(c.Name, DefaultCookieName), Secret: c.Secret}
		s.cookieSecretSet = c.Secret != ""
		if resolve && c.Secret != "" {
			s.resolved = true
			// Every placeholder must resolve to something: a typo or an unset variable
			// must not sign cookies with the config's own text, or with nothing.
			s.cookie.Secret, s.secretErr = caddy.NewReplacer().ReplaceOrErr(c.Secret, true, true)
		}
	}
	if resolve {
		s.telemetry.authHeader, s.telemetryErr = resolveAuthHeader(s.telemetry.authHeader)
	}
	if c := p.Cluster; c != nil {
		cfg := c.config(resolve)
		s.cluster, s.clusterSecretSet = &cfg, c.Secret != ""
	}
	return s
}

// optionChecks holds the check of every option, in the order the Caddyfile documents them. The
// Caddyfile parser runs an option's check right after reading it (so that the error carries
// file:line); Provision runs them all (for JSON configs).
var optionChecks = []struct {
	name  string
	check func(s *settings) error
}{
	{"cache_threshold", func(s *settings) error {
		if !(s.cacheThreshold >= 0 && s.cacheThreshold <= 1) { // false for NaN too
			return fmt.Errorf("must be between 0 and 1, got %v", s.cacheThreshold)
		}
		return nil
	}},
	{"balance_abs_threshold", func(s *settings) error {
		if s.absThreshold < 0 {
			return fmt.Errorf("must be >= 0, got %d", s.absThreshold)
		}
		return nil
	}},
	{"balance_rel_threshold", func(s *settings) error {
		if !(s.relThreshold >= 1) || math.IsInf(s.relThreshold, 0) {
			return fmt.Errorf("must be a finite number >= 1, got %v", s.relThreshold)
		}
		return nil
	}},
	{"on_imbalance", func(s *settings) error {
		if s.onImbalance != "least_busy" && s.onImbalance != "prefix_in_band" {
			return fmt.Errorf("must be prefix_in_band or least_busy, got %q", s.onImbalance)
		}
		return nil
	}},
	{"eviction_interval", func(s *settings) error {
		if s.evictionInterval < minEvictionInterval {
			return fmt.Errorf("must be at least %v (each pass scans every session binding), got %v", minEvictionInterval, s.evictionInterval)
		}
		return nil
	}},
	{"max_tree_size", func(s *settings) error {
		if s.maxTreeSize <= 0 {
			return fmt.Errorf("must be positive, got %d", s.maxTreeSize)
		}
		return nil
	}},
	{"session_header", func(s *settings) error {
		if !httpguts.ValidHeaderFieldName(s.sessionHeader) {
			return fmt.Errorf("%q is not a valid HTTP header name", s.sessionHeader)
		}
		return nil
	}},
	{"session_cookie", func(s *settings) error {
		c := s.cookie
		if c == nil {
			return nil
		}
		if err := (&http.Cookie{Name: c.Name, Value: "x"}).Valid(); err != nil {
			return fmt.Errorf("invalid cookie name %q (a cookie name is an HTTP token: letters, digits and !#$%%&'*+-.^_`|~)", c.Name)
		}
		if !s.cookieSecretSet {
			return nil // no secret: unsigned ids
		}
		if s.secretErr != nil {
			return fmt.Errorf("the secret did not resolve (is its environment variable set?): %v; make one with `openssl rand -base64 32`", s.secretErr)
		}
		if !s.resolved && strings.Contains(c.Secret, "{") {
			return nil // a placeholder, replaced at provision
		}
		if len(c.Secret) < minSecretBytes {
			what := fmt.Sprintf("is %d bytes", len(c.Secret))
			if c.Secret == "" {
				what = "resolved to nothing (is its environment variable set?)"
			}
			return fmt.Errorf("the secret %s; it must be at least %d bytes: make one with `openssl rand -base64 32`", what, minSecretBytes)
		}
		return nil
	}},
	{"session_ttl", func(s *settings) error {
		if s.sessionTTL < minSessionTTL {
			return fmt.Errorf("must be at least %v, got %v", minSessionTTL, s.sessionTTL)
		}
		return nil
	}},
	{"max_sessions", func(s *settings) error {
		if s.maxSessions < 1 {
			return fmt.Errorf("must be positive, got %d", s.maxSessions)
		}
		return nil
	}},
	{"expected_tokens", func(s *settings) error {
		if s.expectedTokens < 1 {
			return fmt.Errorf("must be positive, got %d", s.expectedTokens)
		}
		return nil
	}},
	{"fallback", func(s *settings) error {
		_, err := energy.ParseStrategy(s.fallback)
		return err
	}},
	{"decision", func(s *settings) error {
		if s.decision != decisionCost && s.decision != decisionThresholds {
			return fmt.Errorf("must be cost or thresholds, got %q", s.decision)
		}
		return nil
	}},
	{"objective", func(s *settings) error {
		switch s.objective {
		case objectiveLatency, objectiveCompletion, objectiveEnergy, objectiveCarbon:
			return nil
		}
		return fmt.Errorf("must be latency, completion, energy or carbon, got %q", s.objective)
	}},
	{"ttft_slack", func(s *settings) error {
		if !(s.ttftSlack >= 0 && s.ttftSlack <= maxTTFTSlack) { // false for NaN too
			return fmt.Errorf("must be a fraction between 0 and %v (0.25: within 25%% of the best predicted TTFT), got %v", float64(maxTTFTSlack), s.ttftSlack)
		}
		return nil
	}},
	{"explain_header", func(s *settings) error {
		if s.explainHeader != "" && !httpguts.ValidHeaderFieldName(s.explainHeader) {
			return fmt.Errorf("%q is not a valid HTTP header name", s.explainHeader)
		}
		return nil
	}},
	{"telemetry", func(s *settings) error {
		if s.telemetryErr != nil {
			return s.telemetryErr
		}
		return checkTelemetry(s.telemetry)
	}},
	{"cluster", func(s *settings) error { return checkCluster(s.cluster, s.clusterSecretSet) }},
	{"queue_timeout", func(s *settings) error {
		if s.queueTimeout < 0 {
			return fmt.Errorf("must be >= 0 (0: never wait), got %v", s.queueTimeout)
		}
		return nil
	}},
	{"flow_control", func(s *settings) error { return checkFlow(s.flowGiven) }},
}

// check runs the check of the option named name.
func (s *settings) check(name string) error {
	for _, c := range optionChecks {
		if c.name == name {
			if err := c.check(s); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	return nil
}

// validate runs every option's check and returns the first error.
func (s *settings) validate() error {
	for _, c := range optionChecks {
		if err := s.check(c.name); err != nil {
			return err
		}
	}
	return nil
}

// validateUpstreams checks the upstream blocks' annotations.
func validateUpstreams(ups map[string]energy.Profile) error {
	addrs := make([]string, 0, len(ups))
	for a := range ups {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs) // the same error every time
	for _, a := range addrs {
		prof := ups[a]
		if err := prof.Validate(); err != nil {
			return fmt.Errorf("upstream %s: %w", a, err)
		}
	}
	return nil
}

// optionNames lists the policy's options, for "did you mean".
func optionNames() []string {
	names := make([]string, 0, len(optionChecks)+1)
	for _, c := range optionChecks {
		names = append(names, c.name)
	}
	return append(names, "upstream")
}

// unknownOption is the error for an option the policy does not have, suggesting the nearest
// known one when it is a likely typo.
func unknownOption(opt string) error {
	return unknownIn("kv_cache_aware", opt, optionNames())
}

// unknownIn is the error for an option a directive does not have: the nearest of names when it
// is a likely typo, else the list of them.
func unknownIn(directive, opt string, names []string) error {
	best, dist := "", math.MaxInt
	for _, n := range names {
		if d := editDistance(opt, n); d < dist {
			best, dist = n, d
		}
	}
	if dist <= max(2, len(opt)/4) {
		return fmt.Errorf("unrecognized %s option %q; did you mean %q?", directive, opt, best)
	}
	return fmt.Errorf("unrecognized %s option %q (options: %s)", directive, opt, strings.Join(names, ", "))
}

// editDistance is the Levenshtein distance of a and b, in bytes (option names are ASCII).
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return math.MaxInt // not a typo of an option name
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func valueOr[T any](v *T, def T) T {
	if v == nil {
		return def
	}
	return *v
}

// or returns v, or def when v is the zero value (JSON leaves an absent option at zero).
func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// core returns the options the decision reads (kvroute/decide), with a placer of its own for
// the fallback (round_robin keeps its position in it).
func (s settings) core() decide.Options {
	o := decide.Options{
		CacheThreshold:       s.cacheThreshold,
		BalanceAbs:           s.absThreshold,
		BalanceRel:           s.relThreshold,
		LeastBusyOnImbalance: s.onImbalance != "prefix_in_band",
		ExpectedTokens:       s.expectedTokens,
		TTFTSlack:            s.ttftSlack,
		// Issue 34: decision thresholds sees batch slots and slower engines, and keeps warm
		// requests when every batch is full (no option: the fleet simulator's scorecard chose
		// them, docs/decision.md).
		SlotRank:  true,
		SlotMove:  true,
		SpeedRank: true,
		FullStay:  true,
	}
	strategy, _ := energy.ParseStrategy(s.fallback)
	o.Placer = energy.NewPlacer(strategy)
	if s.decision == decisionCost {
		o.Rule = decide.Cost
	}
	switch s.objective {
	case objectiveCompletion:
		o.Objective = decide.Completion
	case objectiveEnergy:
		o.Objective = decide.Energy
	case objectiveCarbon:
		o.Objective = decide.Carbon
	}
	return o
}
