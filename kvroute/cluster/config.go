package cluster

import (
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"time"
)

// MinSecretLen is the shortest secret accepted, in bytes: AES-GCM keys are derived from it, and a
// shorter shared secret would be guessable offline from one captured message.
const MinSecretLen = 16

// Config is what the `cluster` block of the Caddyfile gives, plus tuning knobs whose zero value
// means the default. Equal tells whether a reload changed it (a changed one reconnects).
type Config struct {
	// URLs of the NATS servers (nats://, tls://, ws://, wss://); credentials may be given in the
	// URL (user:pass@ or token@).
	URLs []string
	// Name of the fleet: replicas with the same name share state. It is one NATS subject token.
	Name string
	// Secret seals and authenticates every message. Resolve placeholders before Validate.
	Secret string
	// Creds is an optional NATS credentials file (JWT and NKey seed).
	Creds string
	// TLSCA is an optional PEM file of CAs that tls:// servers are verified against.
	TLSCA string

	// FlushDelay bounds how long a published item waits before its batch goes out (default 5ms).
	FlushDelay time.Duration
	// LoadInterval is how often the in-flight counts are published even when unchanged
	// (default 250ms).
	LoadInterval time.Duration
	// LoadTTL is how long a peer's counts keep counting after it was last heard (default 2s).
	LoadTTL time.Duration
	// QueueLen bounds the items waiting to be published (default 8192).
	QueueLen int
	// QueueBytes bounds the text bytes waiting to be published (default 64 MiB).
	QueueBytes int
	// LogBytes bounds the log of this replica's own recent decisions and bindings kept for peers
	// that catch up, counted as they are stored (compressed) (default 16 MiB, about 50M chars of
	// routing text: with 3 replicas, more than the default max_tree_size of 64Mi chars).
	LogBytes int
	// MaxText is the longest routing text published, in bytes; a longer one is published as its
	// prefix, which is what a prefix tree needs (default 4 MiB).
	MaxText int
	// ReplayWindow is how far a message's time may be from the receiver's clock (default 2m).
	ReplayWindow time.Duration
	// MaxPeers bounds the peers tracked at once (default 256).
	MaxPeers int
	// PeerRate bounds the messages per second accepted from one peer, a burst of twice as many
	// allowed (default 2000).
	PeerRate int
}

const (
	defaultFlushDelay   = 5 * time.Millisecond
	defaultLoadInterval = 250 * time.Millisecond
	defaultLoadTTL      = 2 * time.Second
	defaultQueueLen     = 8192
	defaultQueueBytes   = 64 << 20
	defaultLogBytes     = 16 << 20
	defaultMaxText      = 4 << 20
	defaultReplayWindow = 2 * time.Minute
	defaultMaxPeers     = 256
	defaultPeerRate     = 2000
	// maxNameLen keeps subjects short; NATS itself allows far longer ones.
	maxNameLen = 64
)

// Equal reports whether c and o configure the same node, defaults applied.
func (c Config) Equal(o Config) bool {
	c, o = c.withDefaults(), o.withDefaults()
	if len(c.URLs) == 0 && len(o.URLs) == 0 {
		c.URLs, o.URLs = nil, nil // nil and empty mean the same
	}
	return reflect.DeepEqual(c, o)
}

// withDefaults returns c with every zero tuning knob set to its default.
func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	defInt := func(d *int, v int) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.FlushDelay, defaultFlushDelay)
	def(&c.LoadInterval, defaultLoadInterval)
	def(&c.LoadTTL, defaultLoadTTL)
	def(&c.ReplayWindow, defaultReplayWindow)
	defInt(&c.QueueLen, defaultQueueLen)
	defInt(&c.QueueBytes, defaultQueueBytes)
	defInt(&c.LogBytes, defaultLogBytes)
	defInt(&c.MaxText, defaultMaxText)
	defInt(&c.MaxPeers, defaultMaxPeers)
	defInt(&c.PeerRate, defaultPeerRate)
	return c
}

// Validate reports the first problem of c, naming the option as the Caddyfile spells it. It
// touches neither the network nor the file system, so that `caddy validate` and `caddy adapt`
// can call it anywhere.
func (c Config) Validate() error {
	if len(c.URLs) == 0 {
		return errors.New("cluster: at least one NATS URL is required")
	}
	for _, raw := range c.URLs {
		if err := validateURL(raw); err != nil {
			return fmt.Errorf("cluster: URL %q: %w", redactURL(raw), err)
		}
	}
	if err := validateName(c.Name); err != nil {
		return fmt.Errorf("cluster: name: %w", err)
	}
	if c.Secret == "" {
		return errors.New("cluster: secret: required (every message is sealed with it)")
	}
	if len(c.Secret) < MinSecretLen {
		return fmt.Errorf("cluster: secret: %d bytes, at least %d required", len(c.Secret), MinSecretLen)
	}
	if c.Secret != strings.TrimSpace(c.Secret) {
		// A secret read from a file or an env var with a trailing newline on one replica only
		// would make that replica reject, and be rejected by, all the others.
		return errors.New("cluster: secret: has leading or trailing white space")
	}
	if c.TLSCA != "" && !c.anyTLS() {
		return errors.New("cluster: tls_ca: given but no URL is tls:// or wss://")
	}
	for name, v := range map[string]time.Duration{"flush_delay": c.FlushDelay, "load_interval": c.LoadInterval, "load_ttl": c.LoadTTL, "replay_window": c.ReplayWindow} {
		if v < 0 {
			return fmt.Errorf("cluster: %s: negative (%v)", name, v)
		}
	}
	for name, v := range map[string]int{"queue_len": c.QueueLen, "queue_bytes": c.QueueBytes, "log_bytes": c.LogBytes, "max_text": c.MaxText, "max_peers": c.MaxPeers, "peer_rate": c.PeerRate} {
		if v < 0 {
			return fmt.Errorf("cluster: %s: negative (%d)", name, v)
		}
	}
	d := c.withDefaults()
	if d.LoadTTL < 2*d.LoadInterval {
		return fmt.Errorf("cluster: load_ttl %v: must be at least twice load_interval (%v), or one lost message expires a live peer", d.LoadTTL, d.LoadInterval)
	}
	return nil
}

func (c Config) anyTLS() bool {
	for _, raw := range c.URLs {
		if u, err := url.Parse(raw); err == nil && (u.Scheme == "tls" || u.Scheme == "wss") {
			return true
		}
	}
	return false
}

func validateURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		// url's error repeats the URL, credentials included.
		return errors.New("not a URL")
	}
	switch u.Scheme {
	case "nats", "tls", "ws", "wss":
	default:
		return fmt.Errorf("scheme %q: want nats, tls, ws or wss", u.Scheme)
	}
	if u.Hostname() == "" {
		return errors.New("no host")
	}
	return nil
}

// redactURL drops credentials from a URL for error messages and logs.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable)"
	}
	if u.User != nil {
		u.User = url.User("redacted")
	}
	return u.String()
}

// validateName accepts what is safe as one NATS subject token everywhere: letters, digits, '-'
// and '_' ('.' would split the token, '*' and '>' are wildcards).
func validateName(name string) error {
	if name == "" {
		return errors.New("required (replicas with the same name share state)")
	}
	if len(name) > maxNameLen {
		return fmt.Errorf("%d bytes, at most %d", len(name), maxNameLen)
	}
	for _, r := range name {
		ok := r == '-' || r == '_' || ('0' <= r && r <= '9') || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z')
		if !ok {
			return fmt.Errorf("%q: only letters, digits, '-' and '_' are allowed (it is a NATS subject token)", name)
		}
	}
	return nil
}
