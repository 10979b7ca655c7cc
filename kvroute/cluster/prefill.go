package cluster

import "maps"

// Queued prefill: besides its in-flight counts (recLoad), a replica publishes per upstream the
// uncached prompt tokens of its requests there that have not produced a first token, so that
// every replica predicts the same time to first token for each upstream (decision cost).

// recPrefill is a queued-prefill record: the layout of recLoad, tokens instead of requests. It
// goes out in a message of its own, so that a replica of an older version, which rejects an
// unknown record and the rest of its message, loses only it (counted as malformed), never a
// decision or a count.
const recPrefill = 10

// PrefillSource is implemented by a Handler that publishes its queued prefill: per upstream
// (dial address), the uncached prompt tokens of this replica's requests that have not produced
// a first token. The Node calls it from its background goroutine with the load (LoadSource);
// the returned map is only read. A Handler without it publishes none.
type PrefillSource interface {
	PrefillTokens() map[string]int64
}

func appendPrefill(b []byte, tokens []peerCount) []byte {
	start := len(b)
	b = appendLoad(b, tokens)
	b[start] = recPrefill
	return b
}

// prefillRecord returns the record of cur when it differs from last (or force), and the map
// to remember; nil when nothing is to be sent.
func prefillRecord(cur, last map[string]int64, force bool) ([]byte, map[string]int64) {
	if !force && maps.Equal(cur, last) {
		return nil, last
	}
	tokens := make([]peerCount, 0, len(cur))
	for u, c := range cur {
		if c > 0 && len(tokens) < maxUpstreams && len(u) <= maxField {
			tokens = append(tokens, peerCount{u, min(c, maxLoad)})
		}
	}
	return appendPrefill(nil, tokens), maps.Clone(cur)
}

// PeerPrefill is the sum of the queued prefill tokens on upstream that live peers last
// published. It is one atomic load and one map lookup.
func (n *Node) PeerPrefill(upstream string) int64 {
	if m := n.peerPrefill.Load(); m != nil {
		return (*m)[upstream]
	}
	return 0
}
