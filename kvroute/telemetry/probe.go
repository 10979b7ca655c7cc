package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// maxPropsBytes bounds llama.cpp's /props answer: a few KB of JSON (its chat template is
// the largest part).
const maxPropsBytes = 1 << 20

// ParseProps reads llama.cpp's GET /props answer (at most limit bytes; limit <= 0 means 1 MiB)
// and returns its KV cache size in tokens: default_generation_settings.n_ctx (older servers
// wrote n_ctx at the top level). llama.cpp's metric llamacpp:n_tokens_max is the most tokens
// seen at once, a high-water mark, not a capacity, and is not used.
func ParseProps(r io.Reader, limit int64) (int64, error) {
	if limit <= 0 {
		limit = maxPropsBytes
	}
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return 0, fmt.Errorf("reading /props: %w", err)
	}
	if int64(len(b)) > limit {
		return 0, fmt.Errorf("/props: %w (%d bytes)", ErrTooLarge, limit)
	}
	var props struct {
		Default struct {
			NCtx json.Number `json:"n_ctx"`
		} `json:"default_generation_settings"`
		NCtx json.Number `json:"n_ctx"`
	}
	if err := json.Unmarshal(b, &props); err != nil {
		return 0, fmt.Errorf("/props: %w: %v", ErrGarbled, err)
	}
	for _, n := range []json.Number{props.Default.NCtx, props.NCtx} {
		if n == "" {
			continue
		}
		v, err := n.Int64()
		if err != nil || v < 1 || v > maxCapacity {
			return 0, fmt.Errorf("/props: n_ctx %q: %w", n, ErrInvalid)
		}
		return v, nil
	}
	return 0, errors.New("/props: no n_ctx")
}

// Probe reports whether a connection to addr on network ("tcp", "tcp4", "tcp6" with host:port;
// "unix" with a socket path) can be made within timeout: the cheap check a caller uses to see
// whether a down upstream without a metrics endpoint is back. It sends nothing; the connection
// is closed at once.
func Probe(ctx context.Context, network, addr string, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return fmt.Errorf("probe %s %s: %w", network, addr, err)
	}
	return conn.Close()
}
