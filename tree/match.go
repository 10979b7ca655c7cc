package tree

import "slices"

// Match is the result of Tree.Match. Reuse one Match across calls: Match fills it without
// allocating once its buffers have grown.
type Match struct {
	Runes   int           // length of the input in runes
	Tenants []TenantMatch // every tenant met on the matched path, longest match first; equal lengths: most recently used first

	hits []hit
	seen []int32 // tenant id -> index+1 in hits; all zero between calls
}

// TenantMatch is one tenant's share of a match.
type TenantMatch struct {
	Tenant string
	Runes  int // leading runes of the input this tenant holds
}

type hit struct {
	runes int
	stamp uint64 // the tenant's stamp on its deepest node of the path
	id    uint32
}

func (m *Match) reset() {
	m.Runes = 0
	clear(m.Tenants)
	m.Tenants = m.Tenants[:0]
	m.hits = m.hits[:0]
}

func (m *Match) grow(ids int) {
	if len(m.seen) < ids {
		m.seen = make([]int32, ids+ids/4)
	}
}

// record notes that tenant id holds the path down to runes. Nodes come from the root down,
// so the last call for a tenant is its deepest node. Ids interned after the walk began are
// left out.
func (m *Match) record(id uint32, stamp uint64, runes int) {
	if int(id) >= len(m.seen) {
		return
	}
	if i := m.seen[id]; i > 0 {
		m.hits[i-1].runes = runes
		m.hits[i-1].stamp = stamp
		return
	}
	m.hits = append(m.hits, hit{runes: runes, stamp: stamp, id: id})
	m.seen[id] = int32(len(m.hits))
}

func (m *Match) finish(table []*tenant) {
	slices.SortFunc(m.hits, func(a, b hit) int {
		switch {
		case a.runes != b.runes:
			return b.runes - a.runes
		case a.stamp != b.stamp:
			if a.stamp > b.stamp {
				return -1
			}
			return 1
		}
		return int(a.id) - int(b.id)
	})
	for _, h := range m.hits {
		m.seen[h.id] = 0
		if int(h.id) < len(table) && table[h.id] != nil {
			m.Tenants = append(m.Tenants, TenantMatch{Tenant: table[h.id].name, Runes: h.runes})
		}
	}
}
