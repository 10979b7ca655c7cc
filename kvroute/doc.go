// Package kvroute provides the Caddy modules of kvroute.
package kvroute

import (
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	_ "github.com/dustin/go-humanize"
	_ "go.uber.org/zap"
)
