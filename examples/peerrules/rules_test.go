package peerrules

import (
	"slices"
	"testing"
)

// Pick follows SGLang's select_worker: the least loaded (first on ties) when cold or
// imbalanced, the matched tenant above the threshold, the first available when the matched
// tenant is unavailable (and forgotten).
func TestCacheAwarePick(t *testing.T) {
	p := NewCacheAware()
	p.AbsThreshold, p.RelThreshold = 2, 1.5
	ids := []string{"a", "b", "c"}
	up := []bool{true, true, true}
	prompt := "You are a pirate. Answer in pirate speak. "
	if i, _ := p.Pick("m", prompt+"Q1", ids, up, []int{0, 0, 0}); i != 0 {
		t.Fatalf("cold: %d, want 0 (first on ties)", i)
	}
	if i, _ := p.Pick("m", prompt+"Q2", ids, up, []int{1, 0, 0}); i != 0 {
		t.Errorf("warm: %d, want 0 (matched)", i)
	}
	if i, _ := p.Pick("m", "something else entirely", ids, up, []int{2, 0, 1}); i != 1 {
		t.Errorf("cold, loaded: %d, want 1 (least loaded)", i)
	}
	// Loads 4, 0, 1: 4-0 > 2 and 4 > 0: imbalanced, the least loaded even for a warm prompt.
	if i, _ := p.Pick("m", prompt+"Q3", ids, up, []int{4, 0, 1}); i != 1 {
		t.Errorf("imbalanced: %d, want 1", i)
	}
	if p.Tree("m", ids).Sizes()["b"] == 0 {
		t.Error("the imbalanced choice's text was not recorded")
	}
	// The matched tenant is down: forgotten, the first available taken.
	p2 := NewCacheAware()
	p2.Pick("m", prompt, ids, up, []int{0, 0, 0})
	i, forgot := p2.Pick("m", prompt, ids, []bool{false, false, true}, []int{0, 0, 0})
	if i != 2 || forgot != "a" {
		t.Errorf("matched tenant down: %d, forgot %q; want 2 and a", i, forgot)
	}
	if i, _ := p2.Pick("m", prompt, ids, []bool{false, false, false}, []int{0, 0, 0}); i != -1 {
		t.Errorf("none available: %d", i)
	}
}

func TestRendezvousBoundedLoad(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	order := Rendezvous(ids, FNV1a("some prefix"), FNV1a)
	if got := slices.Sorted(slices.Values(order)); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Fatalf("order %v is not a permutation", order)
	}
	if again := Rendezvous(ids, FNV1a("some prefix"), FNV1a); !slices.Equal(order, again) {
		t.Error("the order is not stable")
	}
	// Without d, the others keep their relative order.
	var without []string
	for _, i := range order {
		if ids[i] != "d" {
			without = append(without, ids[i])
		}
	}
	sub := Rendezvous(ids[:3], FNV1a("some prefix"), FNV1a)
	for k, i := range sub {
		if ids[i] != without[k] {
			t.Fatalf("removing d reordered the rest: %v, want %v", sub, without)
		}
	}
	for _, tc := range []struct {
		loads []int
		want  int
	}{
		{[]int{0, 0, 0, 0}, 0}, {[]int{1, 0, 0, 0}, 0}, {[]int{2, 0, 0, 0}, 1},
		{[]int{2, 1, 0, 0}, 0}, {[]int{9, 9, 0, 0}, 2},
	} {
		if got := BoundedLoad(tc.loads, DefaultLoadFactor); got != tc.want {
			t.Errorf("BoundedLoad(%v) = %d, want %d", tc.loads, got, tc.want)
		}
	}
}
