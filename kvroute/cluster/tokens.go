package cluster

import (
	"maps"
	"slices"
)

// Tokens served per tenant (flow control's fair shares): a replica publishes, per tenant, the
// tokens its own requests were served (prompt plus weighted output, all its life), so that
// every replica orders its queue by what a tenant got from the whole fleet: a tenant cannot
// get N times its share by spreading its requests over N replicas. Each replica's queue stays
// its own.

// recTokens is a tokens-served record: the layout of recLoad, a tenant name and its tokens
// instead of an upstream and its requests. It goes out in a message of its own, as recPrefill
// does, so that a replica of an older version loses only it.
const recTokens = 12

// maxTenantRecords bounds the tenants of one record: the most served.
const maxTenantRecords = 256

// TokensSource is implemented by a Handler that publishes its tokens served per tenant. The
// Node calls it from its background goroutine with the load (LoadSource); the returned map is
// only read. A Handler without it publishes none.
type TokensSource interface {
	TokensServed() map[string]int64
}

func appendTokens(b []byte, tokens []peerCount) []byte {
	start := len(b)
	b = appendLoad(b, tokens)
	b[start] = recTokens
	return b
}

// tokensRecord returns the record of cur when it differs from last (or force), and the map to
// remember; nil when nothing is to be sent. Beyond maxTenantRecords tenants, the most served
// go.
func tokensRecord(cur, last map[string]int64, force bool) ([]byte, map[string]int64) {
	if !force && maps.Equal(cur, last) {
		return nil, last
	}
	if len(cur) == 0 && len(last) == 0 {
		return nil, last
	}
	tokens := make([]peerCount, 0, min(len(cur), maxTenantRecords))
	for t, c := range cur {
		if c > 0 && len(t) <= maxField {
			tokens = append(tokens, peerCount{t, min(c, maxLoad)})
		}
	}
	if len(tokens) > maxTenantRecords {
		slices.SortFunc(tokens, func(a, b peerCount) int {
			switch {
			case a.n > b.n:
				return -1
			case a.n < b.n:
				return 1
			}
			return 0
		})
		tokens = tokens[:maxTenantRecords]
	}
	return appendTokens(nil, tokens), maps.Clone(cur)
}

// PeerTokens is, per tenant, the sum of the tokens served that live peers last published.
// The map is only read.
func (n *Node) PeerTokens() map[string]int64 {
	if m := n.peerTokens.Load(); m != nil {
		return *m
	}
	return nil
}
