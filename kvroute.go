// Package caddykvroute registers the kvroute Caddy modules. It exists so that
//
//	xcaddy build --with github.com/kvroute/caddy-kvroute
//
// builds Caddy with the plugin; the modules themselves live in package kvroute.
package caddykvroute

import _ "github.com/kvroute/caddy-kvroute/kvroute"
