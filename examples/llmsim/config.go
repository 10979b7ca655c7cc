package llmsim

import "time"

// Defaults of Config.
//
// DefaultCapacityBlocks is 65,536 blocks of 16 tokens, about 1M tokens: the KV cache of an 8B
// model on a large GPU, and the size at which a fleet of 4 makes the Mooncake trace a routing
// problem (see workload.MooncakeFleetBlocks). The chat workload is far smaller and needs far
// smaller workers (workload.ChatFleetBlocks).
const (
	DefaultName             = "llmsim"
	DefaultModel            = "llama-3.1-8b"
	DefaultCapacityBlocks   = 65536
	DefaultSlots            = 8
	DefaultPrefillSlots     = 1
	DefaultPrefillPerToken  = 50 * time.Microsecond
	DefaultDecodePerToken   = 2 * time.Millisecond
	DefaultMaxTokens        = 16
	DefaultMinEventInterval = 10 * time.Millisecond
	DefaultMaxBodyBytes     = 64 << 20
)

// Config describes one simulated worker. Zero fields take the defaults above.
type Config struct {
	// Name is reported in the X-Kvsim-Worker header and the kvsim_* metrics.
	Name string
	// Model is the model served; a request naming another model gets a 404 as from vLLM, a
	// request naming none is served.
	Model string
	// CapacityBlocks is the prefix cache's size in blocks; negative means unlimited.
	CapacityBlocks int
	// BlockTokens is the KV cache block size in tokens.
	BlockTokens int
	// Slots is the number of requests running at once; the others wait in a FIFO queue.
	Slots int
	// PrefillSlots is the number of prefills computed at once. Prefill is compute-bound: a
	// GPU running two prefills runs each at half speed, so by default one runs at a time
	// (FIFO) and a worker prefills at most 1/PrefillPerToken tokens per second, however many
	// Slots it has. Decodes, memory-bound, run in parallel in the slots.
	PrefillSlots int
	// PrefillPerToken is the time to prefill one uncached prompt token; negative means none.
	PrefillPerToken time.Duration
	// DecodePerToken is the time to generate one output token after the first; negative
	// means none.
	DecodePerToken time.Duration
	// Speed divides every simulated duration: 10 runs the simulation ten times faster.
	Speed float64
	// DefaultMaxTokens is the output length of a request that gives no max_tokens.
	DefaultMaxTokens int
	// MinEventInterval is the least time between two streamed events: tokens generated faster
	// are sent together, which bounds the events per second a fleet makes a proxy and a
	// client handle, whatever the speed. Negative sends every token in its own event.
	MinEventInterval time.Duration
	// MaxBodyBytes bounds the request body read.
	MaxBodyBytes int64
	// Role in prefill/decode disaggregation: RoleAggregated (default), RolePrefill or
	// RoleDecode (pd.go). Prefill and decode workers of one fleet share Transfers.
	Role      string
	Transfers *Transfers
	// TransferPerToken is the time a decode worker spends receiving one uncached prompt
	// token's KV instead of prefilling it. Default: DefaultTransferPerToken.
	TransferPerToken time.Duration
	// Protocol of a prefill or decode worker: ProtocolVLLM (default) or ProtocolSGLang
	// (pd_sglang.go).
	Protocol string
	// BootstrapAddr is the host:port a prefill worker announces its rooms under, as its
	// bootstrap server's address (SGLang). Default: the worker's host, DefaultBootstrapPort.
	BootstrapAddr string
	// BootstrapTimeout bounds a decode worker's wait for its room's prefill and a prefill
	// worker's wait for its room's decode (real time). Default: DefaultBootstrapTimeout.
	BootstrapTimeout time.Duration
}

// withDefaults returns cfg with zero fields set to their defaults.
func (cfg Config) withDefaults() Config {
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.Model == "" {
		cfg.Model = DefaultModel
	}
	if cfg.CapacityBlocks == 0 {
		cfg.CapacityBlocks = DefaultCapacityBlocks
	}
	if cfg.BlockTokens <= 0 {
		cfg.BlockTokens = DefaultBlockTokens
	}
	if cfg.Slots <= 0 {
		cfg.Slots = DefaultSlots
	}
	if cfg.PrefillSlots <= 0 {
		cfg.PrefillSlots = DefaultPrefillSlots
	}
	cfg.PrefillPerToken = orDefault(cfg.PrefillPerToken, DefaultPrefillPerToken)
	cfg.DecodePerToken = orDefault(cfg.DecodePerToken, DefaultDecodePerToken)
	cfg.MinEventInterval = orDefault(cfg.MinEventInterval, DefaultMinEventInterval)
	if cfg.Speed <= 0 {
		cfg.Speed = 1
	}
	if cfg.DefaultMaxTokens <= 0 {
		cfg.DefaultMaxTokens = DefaultMaxTokens
	}
	cfg.TransferPerToken = orDefault(cfg.TransferPerToken, DefaultTransferPerToken)
	if cfg.BootstrapTimeout <= 0 {
		cfg.BootstrapTimeout = DefaultBootstrapTimeout
	}
	if cfg.Role != RoleAggregated && cfg.Transfers == nil {
		cfg.Transfers = NewTransfers()
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	return cfg
}

// orDefault maps zero to def and negative durations to zero.
func orDefault(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}

// scaled returns d divided by the speed factor.
func (cfg Config) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) / cfg.Speed)
}
