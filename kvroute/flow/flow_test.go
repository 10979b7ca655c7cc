package flow

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func all(string) bool { return true }

func push(t *testing.T, q *Queue, model, tenant string, band int, v int) *Item {
	t.Helper()
	it := &Item{Model: model, Tenant: tenant, Band: band, Value: v}
	if got := q.Push(it); got != Queued {
		t.Fatalf("Push(%s,%s,%d) = %v, want queued", model, tenant, band, got)
	}
	return it
}

func drain(q *Queue, ready func(string) bool) []int {
	var out []int
	for it := q.Next(ready); it != nil; it = q.Next(ready) {
		out = append(out, it.Value.(int))
	}
	return out
}

func TestArrivalOrderPerModel(t *testing.T) {
	q := New(Config{})
	push(t, q, "a", "", 0, 1)
	push(t, q, "b", "", 0, 2)
	push(t, q, "a", "", 0, 3)
	push(t, q, "b", "", 0, 4)
	// Model a is full: b's requests go, in their order, without waiting behind a's.
	onlyB := func(m string) bool { return m == "b" }
	if got := drain(q, onlyB); !slices.Equal(got, []int{2, 4}) {
		t.Fatalf("with only b ready: %v, want [2 4]", got)
	}
	if q.Len() != 2 || q.LenModel("a") != 2 || q.LenModel("b") != 0 {
		t.Fatalf("Len %d, a %d, b %d; want 2, 2, 0", q.Len(), q.LenModel("a"), q.LenModel("b"))
	}
	push(t, q, "b", "", 0, 5)
	if got := drain(q, all); !slices.Equal(got, []int{1, 3, 5}) {
		t.Fatalf("all ready: %v, want [1 3 5]", got)
	}
}

func TestBandsFirst(t *testing.T) {
	q := New(Config{Bands: 2})
	push(t, q, "m", "x", 1, 1)
	push(t, q, "m", "x", 1, 2)
	push(t, q, "m", "y", 0, 3)
	push(t, q, "m", "x", 7, 4) // beyond the last band: the last band
	push(t, q, "m", "x", 0, 5)
	if q.LenBand(0) != 2 || q.LenBand(1) != 3 {
		t.Fatalf("bands %d %d, want 2 3", q.LenBand(0), q.LenBand(1))
	}
	got := drain(q, all)
	if !slices.Equal(got[:2], []int{3, 5}) && !slices.Equal(got[:2], []int{5, 3}) {
		t.Fatalf("order %v: band 0 must go first", got)
	}
	if !slices.Equal(got[2:], []int{1, 2, 4}) {
		t.Fatalf("order %v: band 1 in arrival order after band 0", got)
	}
}

func TestFewestTokensServedFirst(t *testing.T) {
	q := New(Config{})
	q.Serve("heavy", 10000)
	q.Serve("light", 100)
	for i := range 3 {
		push(t, q, "m", "heavy", 0, i)
	}
	// light starts waiting after heavy: lifted to heavy's counter (no banked credit)...
	push(t, q, "m", "light", 0, 10)
	if got, _ := q.Served("light"); got != 10000 {
		t.Fatalf("light's counter on arrival %v, want 10000 (the least waiting counter)", got)
	}
	// ... so heavy's earlier request goes first (a tie goes to the earlier request), then,
	// once heavy is charged for it, light.
	it := q.Next(all)
	if it.Value != 0 {
		t.Fatalf("first %v, want heavy's 0", it.Value)
	}
	q.Serve("heavy", 5000)
	if it := q.Next(all); it.Value != 10 {
		t.Fatalf("second %v, want light's 10 (heavy was served more)", it.Value)
	}
	q.Serve("light", 50)
	if got := drain(q, all); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("rest %v, want [1 2]", got)
	}
}

func TestIdleTenantBanksNoCredit(t *testing.T) {
	q := New(Config{})
	q.Serve("a", 500)
	q.Serve("b", 50000) // b served a lot while nothing waited
	push(t, q, "m", "a", 0, 1)
	if got, _ := q.Served("a"); got != 50000 {
		t.Fatalf("a arriving at an empty queue starts at %v, want the highest counter 50000", got)
	}
	push(t, q, "m", "b", 0, 2)
	if got, _ := q.Served("b"); got != 50000 {
		t.Fatalf("b %v, want 50000 unchanged", got)
	}
}

func TestBounds(t *testing.T) {
	q := New(Config{MaxQueued: 3, MaxQueuedPerTenant: 2})
	push(t, q, "m", "a", 0, 1)
	push(t, q, "m", "a", 0, 2)
	if v := q.Push(&Item{Model: "m", Tenant: "a"}); v != TenantFull {
		t.Fatalf("a's third: %v, want tenant_full", v)
	}
	push(t, q, "m", "b", 0, 3)
	if v := q.Push(&Item{Model: "m", Tenant: "c"}); v != Full {
		t.Fatalf("fourth: %v, want queue_full", v)
	}
	if v := Full.String(); v != "queue_full" {
		t.Fatalf("Full.String() = %q", v)
	}
}

func TestRemove(t *testing.T) {
	q := New(Config{})
	its := make([]*Item, 5)
	for i := range its {
		its[i] = push(t, q, "m", "t", 0, i)
	}
	for _, i := range []int{2, 0, 4} {
		if !q.Remove(its[i]) || its[i].Waiting() {
			t.Fatalf("Remove(%d) failed", i)
		}
	}
	if q.Remove(its[2]) {
		t.Fatal("second Remove of the same item reported true")
	}
	if got := drain(q, all); !slices.Equal(got, []int{1, 3}) {
		t.Fatalf("left %v, want [1 3]", got)
	}
	if q.Len() != 0 || q.LenTenant("t") != 0 || q.LenModel("m") != 0 {
		t.Fatalf("not empty: %d %d %d", q.Len(), q.LenTenant("t"), q.LenModel("m"))
	}
	// The item goes back in.
	push(t, q, "m", "t", 0, 9)
}

func TestTenantsBounded(t *testing.T) {
	q := New(Config{MaxTenants: 100})
	waiting := push(t, q, "m", "keeper", 0, 0)
	for i := range 10000 {
		q.Serve(fmt.Sprint("client-", i), 1)
	}
	n := 0
	q.Tenants(func(string, float64, float64, int) { n++ })
	if n > 100 {
		t.Fatalf("%d tenants remembered, want at most 100", n)
	}
	if q.LenTenant("keeper") != 1 || q.Next(all) != waiting {
		t.Fatal("a waiting tenant was forgotten")
	}
}

// TestAgainstReference runs random operations against a naive queue that scans every waiting
// request: the same requests come out in the same order.
func TestAgainstReference(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 1))
		q := New(Config{Bands: 3, MaxQueued: 40, MaxQueuedPerTenant: 15})
		ref := &reference{settled: map[string]float64{}, pending: map[string]float64{}}
		type flight struct {
			tenant  string
			charged float64
		}
		var flying []flight
		var live []*Item
		models, tenants := []string{"a", "b", "c"}, []string{"x", "y", "z", "w"}
		for step := range 2000 {
			switch op := rng.IntN(10); {
			case op < 5:
				it := &Item{Model: models[rng.IntN(3)], Tenant: tenants[rng.IntN(4)], Band: rng.IntN(3), Value: step}
				want := ref.push(it, 40, 15)
				if got := q.Push(it); got != want {
					t.Fatalf("seed %d step %d: Push %v, reference %v", seed, step, got, want)
				}
				if want == Queued {
					live = append(live, it)
				}
			case op < 6 && len(live) > 0:
				i := rng.IntN(len(live))
				it := live[i]
				live = slices.Delete(live, i, i+1)
				if q.Remove(it) != ref.remove(it) {
					t.Fatalf("seed %d step %d: Remove disagrees", seed, step)
				}
			case op < 7 && len(flying) > 0 && rng.IntN(2) == 0:
				// An answer settles a request in flight at what it used, below or above
				// its charge.
				i := rng.IntN(len(flying))
				f := flying[i]
				flying = slices.Delete(flying, i, i+1)
				used := float64(rng.IntN(2000))
				q.Settle(f.tenant, f.charged, used)
				ref.settle(f.tenant, f.charged, used)
			case op < 7:
				name := tenants[rng.IntN(4)]
				n := float64(rng.IntN(1000))
				q.Serve(name, n)
				ref.settle(name, 0, n)
			default:
				full := models[rng.IntN(3)]
				ready := func(m string) bool { return m != full }
				got, want := q.Next(ready), ref.next(ready)
				if got != want {
					t.Fatalf("seed %d step %d: Next %v, reference %v", seed, step, val(got), val(want))
				}
				if got != nil {
					live = slices.DeleteFunc(live, func(x *Item) bool { return x == got })
					c := float64(100 + rng.IntN(1000))
					q.Charge(got.Tenant, c)
					ref.pending[got.Tenant] += c
					flying = append(flying, flight{got.Tenant, c})
				}
			}
			for _, name := range tenants {
				settled, pending := q.Served(name)
				if settled != ref.settled[name] || math.Abs(pending-ref.pending[name]) > 1e-6 {
					t.Fatalf("seed %d step %d: %s served %v + %v pending, reference %v + %v",
						seed, step, name, settled, pending, ref.settled[name], ref.pending[name])
				}
			}
		}
	}
}

func val(it *Item) any {
	if it == nil {
		return nil
	}
	return it.Value
}

// reference is the queue's rules written as plainly as possible.
type reference struct {
	items            []*Item // arrival order
	settled, pending map[string]float64
	high             float64
}

func (r *reference) push(it *Item, maxQ, maxT int) Verdict {
	if len(r.items) >= maxQ {
		return Full
	}
	n := 0
	for _, x := range r.items {
		if x.Tenant == it.Tenant {
			n++
		}
	}
	if n >= maxT {
		return TenantFull
	}
	if n == 0 {
		floor, any := r.high, false
		for _, x := range r.items {
			if s := r.settled[x.Tenant]; !any || s < floor {
				floor, any = s, true
			}
		}
		r.settled[it.Tenant] = max(r.settled[it.Tenant], floor)
	}
	r.items = append(r.items, it)
	return Queued
}

func (r *reference) remove(it *Item) bool {
	i := slices.Index(r.items, it)
	if i < 0 {
		return false
	}
	r.items = slices.Delete(r.items, i, i+1)
	return true
}

func (r *reference) settle(name string, charged, used float64) {
	r.pending[name] = max(0, r.pending[name]-charged)
	if r.pending[name] < 1e-6 {
		r.pending[name] = 0
	}
	r.settled[name] += used
	r.high = max(r.high, r.settled[name])
}

func (r *reference) served(name string) float64 { return r.settled[name] + r.pending[name] }

func (r *reference) next(ready func(string) bool) *Item {
	for b := range 3 {
		var best *Item
		for _, x := range r.items { // arrival order: the first of the least served wins ties
			if min(x.Band, 2) != b || !ready(x.Model) {
				continue
			}
			if best == nil || r.served(x.Tenant) < r.served(best.Tenant) {
				best = x
			}
		}
		if best != nil {
			r.remove(best)
			return best
		}
	}
	return nil
}

func BenchmarkPushNext(b *testing.B) {
	q := New(Config{Bands: 2})
	its := make([]Item, 64)
	for i := range its {
		its[i] = Item{Model: "m", Tenant: fmt.Sprint("t", i%8), Band: i % 2}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		it := &its[i%len(its)]
		if it.Waiting() {
			q.Remove(it)
		}
		q.Push(it)
		if q.Len() > 32 {
			got := q.Next(all)
			q.Serve(got.Tenant, 100)
		}
	}
}

func TestEach(t *testing.T) {
	q := New(Config{Bands: 2})
	push(t, q, "m", "a", 1, 1)
	push(t, q, "m", "b", 0, 2)
	push(t, q, "n", "a", 1, 3)
	push(t, q, "m", "a", 1, 4)
	var got []int
	q.Each(func(it *Item) { got = append(got, it.Value.(int)) })
	slices.Sort(got[1:]) // band 0 first; within a band, no order is promised
	if !slices.Equal(got, []int{2, 1, 3, 4}) {
		t.Fatalf("Each gave %v, want band 0's 2 first, then 1, 3, 4", got)
	}
	q.Next(all)
	n := 0
	q.Each(func(*Item) { n++ })
	if n != q.Len() {
		t.Fatalf("Each gave %d after a Next, Len %d", n, q.Len())
	}
}
