package caddyfile

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	cf "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"

	"github.com/kvroute/caddy-kvroute/energy"
)

// ParseSize parses a count of bytes, chars or tokens, with an optional SI
// or binary suffix, case-insensitive, via go-humanize: "1000", "2k" (2000),
// "64M", "64Mi" (64×2^20), "4MiB", "4 MB". Fractions are allowed when
// a suffix makes them whole ("1.5k").
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, errors.New("empty size")
	}
	if t[0] < '0' || t[0] > '9' {
		return 0, fmt.Errorf("invalid size %q: must start with a digit", s)
	}
	n, err := humanize.ParseBytes(t)
	if err != nil {
		if strings.HasPrefix(err.Error(), "too large") {
			return 0, fmt.Errorf("invalid size %q: too large", s)
		}
		return 0, fmt.Errorf("invalid size %q (want a count with an optional suffix such as 2k, 64Mi or 4MiB)", s)
	}
	if n > math.MaxInt64 {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	if strings.Contains(t, ".") {
		unit := strings.ToLower(strings.TrimSpace(strings.TrimLeft(t, "0123456789.,")))
		if unit == "" || unit == "b" {
			return 0, fmt.Errorf("invalid size %q: not a whole number", s)
		}
	}
	return int64(n), nil
}

// oneArg reads the single argument of the option d is on, and rejects a
// missing or extra argument and a block after it.
func oneArg(d *cf.Dispenser) (option, arg string, err error) {
	option = d.Val()
	args := d.RemainingArgs()
	if len(args) != 1 {
		return option, "", d.Errf("%s: want 1 argument, got %d", option, len(args))
	}
	if err := noBlock(d, option); err != nil {
		return option, "", err
	}
	return option, args[0], nil
}

// noBlock rejects a block opening after the current token, where the
// option takes none.
func noBlock(d *cf.Dispenser, option string) error {
	before := d.Val()
	if d.NextBlock(d.Nesting()) {
		d.Prev() // back to the brace, on the option's line
		return d.Errf("%s: unexpected block", option)
	}
	if d.Val() != before { // an empty "{ }" was consumed
		return d.Errf("%s: unexpected block", option)
	}
	return nil
}

// SizeArg reads the single argument of the option d is on as a size, as
// ParseSize does. On success d is on the argument, so that a caller's range
// error made with d.Errf points at the same line.
func SizeArg(d *cf.Dispenser) (int64, error) {
	option, arg, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := ParseSize(arg)
	if err != nil {
		return 0, d.Errf("%s: %v", option, err)
	}
	return n, nil
}

// IntArg reads the single argument of the option d is on as a decimal
// integer.
func IntArg(d *cf.Dispenser) (int, error) {
	option, arg, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(arg)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, d.Errf("%s: %q is out of range", option, arg)
		}
		return 0, d.Errf("%s: invalid integer %q", option, arg)
	}
	return n, nil
}

// FloatArg reads the single argument of the option d is on as a finite
// number.
func FloatArg(d *cf.Dispenser) (float64, error) {
	option, arg, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(arg, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, d.Errf("%s: invalid number %q", option, arg)
	}
	return f, nil
}

// DurationArg reads the single argument of the option d is on as a
// duration, with caddy.ParseDuration's syntax: Go durations ("120s",
// "1h30m") plus days ("1d", "1.5d").
func DurationArg(d *cf.Dispenser) (time.Duration, error) {
	option, arg, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	v, err := caddy.ParseDuration(arg)
	if err != nil {
		return 0, d.Errf("%s: invalid duration %q (want e.g. 120s, 30m, 1d)", option, arg)
	}
	return v, nil
}

// StringArg reads the single argument of the option d is on, which must not
// be empty.
func StringArg(d *cf.Dispenser) (string, error) {
	option, arg, err := oneArg(d)
	if err != nil {
		return "", err
	}
	if arg == "" {
		return "", d.Errf("%s: empty value", option)
	}
	return arg, nil
}

// JoulesArg reads the single argument of the option d is on as an energy
// with a unit, as energy.ParseJoules does: "150uJ", "0.5mJ".
func JoulesArg(d *cf.Dispenser) (energy.Joules, error) {
	option, arg, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	j, err := energy.ParseJoules(arg)
	if err != nil {
		return 0, d.Errf("%s: %v", option, err)
	}
	return j, nil
}
