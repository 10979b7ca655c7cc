package llmsim

import (
	"time"

	"github.com/kvroute/caddy-kvroute/examples/llmsim/engine"
)

// Defaults of Config. The engine's are the fleet simulator's (package engine), but for the
// batch slots.
//
// DefaultCapacityBlocks is 65,536 blocks of 16 tokens, about 1M tokens: the KV cache of an 8B
// model on a large GPU, and the size at which a fleet of 4 makes the Mooncake trace a routing
// problem (see workload.MooncakeFleetBlocks). The chat workload is far smaller and needs far
// smaller workers (workload.ChatFleetBlocks).
const (
	DefaultName             = "llmsim"
	DefaultModel            = "llama-3.1-8b"
	DefaultCapacityBlocks   = engine.DefaultCapacityBlocks
	DefaultSlots            = 8
	DefaultMaxBatchTokens   = engine.DefaultMaxBatchTokens
	DefaultStepFixed        = engine.DefaultStepFixed
	DefaultPrefillPerToken  = engine.DefaultPerPrefillToken
	DefaultPerSeq           = engine.DefaultPerSeq
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
	// The worker is an engine.Engine run on the wall clock (the fleet simulator's model of
	// vLLM's scheduler): these are its parameters (engine.Config).
	//
	// CapacityBlocks is the KV cache's size in blocks (vLLM's num_gpu_blocks): the running
	// requests' blocks (prompt and output, reserved at admission) and the prefix cache's
	// share it. Negative means unlimited.
	CapacityBlocks int
	// BlockTokens is the KV cache block size in tokens.
	BlockTokens int
	// Slots is the most requests in a batch (vLLM's max_num_seqs); the others wait in a FIFO
	// queue.
	Slots int
	// MaxBatchTokens is a step's token budget (max_num_batched_tokens): a decode takes one
	// token of it, prefills the rest, a long prompt in chunks over several steps.
	MaxBatchTokens int
	// A step lasts StepFixed + PrefillPerToken × prefill tokens in it + PerSeq × sequences in
	// it: prefills share the accelerator with each other and with the decodes, and a decode
	// step of n sequences makes one token each in StepFixed + n × PerSeq. Negative means none.
	StepFixed       time.Duration
	PrefillPerToken time.Duration
	PerSeq          time.Duration
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
	if cfg.MaxBatchTokens <= 0 {
		cfg.MaxBatchTokens = DefaultMaxBatchTokens
	}
	cfg.StepFixed = orDefault(cfg.StepFixed, DefaultStepFixed)
	cfg.PrefillPerToken = orDefault(cfg.PrefillPerToken, DefaultPrefillPerToken)
	cfg.PerSeq = orDefault(cfg.PerSeq, DefaultPerSeq)
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

// engine returns the engine a worker of cfg (defaults filled in) runs: its parameters, the
// durations divided by Speed.
func (cfg Config) engine() engine.Config {
	// The engine takes zero for its default and a negative duration for none.
	none := func(d time.Duration) time.Duration {
		if d = cfg.scaled(d); d <= 0 {
			return -1
		}
		return d
	}
	return engine.Config{
		MaxNumSeqs:      cfg.Slots,
		MaxBatchTokens:  cfg.MaxBatchTokens,
		BlockTokens:     cfg.BlockTokens,
		CapacityBlocks:  cfg.CapacityBlocks,
		MaxLoras:        -1,
		StepFixed:       none(cfg.StepFixed),
		PerPrefillToken: none(cfg.PrefillPerToken),
		PerSeq:          none(cfg.PerSeq),
	}
}
