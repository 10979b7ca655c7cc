package kvroute

import (
	"testing"

	"github.com/kvroute/caddy-kvroute/kvroute/decide"
)

// The fleet simulator runs kvroute's decision with decide.DefaultOptions: they must be the
// options kvroute's own defaults give (a default changed in options.go and not there would
// measure another decision than the one that ships).
func TestDecideDefaultOptionsAreKvroutes(t *testing.T) {
	got := (&KVCacheAware{}).settings(false).core()
	want := decide.DefaultOptions()
	if got.Placer.Strategy() != want.Placer.Strategy() {
		t.Errorf("fallback placer: kvroute %v, decide.DefaultOptions %v", got.Placer.Strategy(), want.Placer.Strategy())
	}
	got.Placer, want.Placer = nil, nil
	if got != want {
		t.Errorf("kvroute's defaults give %+v, decide.DefaultOptions %+v", got, want)
	}
}
