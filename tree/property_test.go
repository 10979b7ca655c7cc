package tree

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unicode/utf8"
)

// alphabet mixes ASCII, multi-byte runes, and bytes that form truncated and invalid encodings
// alone but 你 (e4 bd a0) together.
var alphabet = []string{"a", "b", "c", "é", "你", "👋", "\x00", "\n", "\xff", "\xe4", "\xbd", "\xa0", "\uFFFD"}

type propRun struct {
	t       *testing.T
	rng     *rand.Rand
	f       *Forest
	ref     *refModel
	texts   []string
	bounded bool
}

func (r *propRun) text() string {
	var s string
	if len(r.texts) > 0 && r.rng.IntN(3) > 0 {
		// Share a prefix with an earlier text, to make splits.
		p := r.texts[r.rng.IntN(len(r.texts))]
		s = p[:r.rng.IntN(len(p)+1)]
	}
	for n := r.rng.IntN(8); n > 0; n-- {
		s += alphabet[r.rng.IntN(len(alphabet))]
	}
	return s
}

func (r *propRun) step(i int) {
	t := r.t
	treeName := []string{"m1", "m2"}[r.rng.IntN(2)]
	tr := r.f.Tree(treeName)
	tenant := fmt.Sprint("10.0.0.", r.rng.IntN(4), ":8000")
	switch op := r.rng.IntN(20); {
	case op < 9:
		s := r.text()
		r.texts = append(r.texts, s)
		tr.Insert(s, tenant)
		r.ref.insert(treeName, s, tenant)
	case op < 14:
		s := r.text()
		m := match(tr, s)
		want := r.ref.match(treeName, s)
		if r.bounded {
			soundMatch(t, i, s, m, want)
		} else if !sameMatch(m, want) {
			t.Fatalf("step %d: Match(%q) = %s, want %s", i, s, showMatch(m), showMatch(&want))
		}
	case op < 17:
		s := r.text()
		got, want := tr.MatchTenant(s, tenant), r.ref.matchTenant(treeName, s, tenant)
		if got != want && !(r.bounded && got < want) {
			t.Fatalf("step %d: MatchTenant(%q, %s) = %d, want %d", i, s, tenant, got, want)
		}
	case op < 18:
		tr.RemoveTenant(tenant)
		r.ref.removeTenant(treeName, tenant)
	case op < 19:
		r.f.RemoveTenant(tenant)
		for name := range r.ref.trees {
			r.ref.removeTenant(name, tenant)
		}
	default:
		st := r.f.Evict()
		if !r.bounded && (st.Chars != 0 || st.Nodes != 0) {
			t.Fatalf("step %d: unbounded forest evicted %+v", i, st)
		}
	}
	check(t, r.f)
	if r.bounded {
		l := r.f.limits.Load()
		if c := r.f.Chars(); c > hardCap(l.MaxChars) {
			t.Fatalf("step %d: %d chars, hard cap %d", i, c, hardCap(l.MaxChars))
		}
		return
	}
	// Stored chars are the distinct prefixes of what is stored.
	for _, name := range []string{"m1", "m2"} {
		tr := r.f.Get(name)
		if tr == nil {
			continue
		}
		if got, want := tr.Chars(), r.ref.chars(name, ""); got != want {
			t.Fatalf("step %d: tree %s chars %d, want %d", i, name, got, want)
		}
		for k := range 4 {
			tn := fmt.Sprint("10.0.0.", k, ":8000")
			if got, want := tr.TenantChars(tn), r.ref.chars(name, tn); got != want {
				t.Fatalf("step %d: tree %s tenant %s chars %d, want %d", i, name, tn, got, want)
			}
		}
	}
}

// soundMatch checks a match against a tree that may have evicted: it may know less than the
// reference, never more.
func soundMatch(t *testing.T, step int, s string, got *Match, want Match) {
	t.Helper()
	if got.Runes != want.Runes {
		t.Fatalf("step %d: Match(%q).Runes = %d, want %d", step, s, got.Runes, want.Runes)
	}
	ref := map[string]int{}
	for _, tm := range want.Tenants {
		ref[tm.Tenant] = tm.Runes
	}
	for i, tm := range got.Tenants {
		if tm.Runes <= 0 || tm.Runes > ref[tm.Tenant] {
			t.Fatalf("step %d: Match(%q) claims %s holds %d, reference %d", step, s, tm.Tenant, tm.Runes, ref[tm.Tenant])
		}
		if i > 0 && tm.Runes > got.Tenants[i-1].Runes {
			t.Fatalf("step %d: Match(%q) not ordered: %s", step, s, showMatch(got))
		}
	}
}

func TestProperty(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := &propRun{t: t, rng: rand.New(rand.NewPCG(seed, 99)), f: newTestForest(Limits{}), ref: newRef()}
			for i := range 400 {
				r.step(i)
			}
		})
	}
}

func TestPropertyBounded(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			l := Limits{MaxChars: 60, TenantMaxChars: map[string]int64{"10.0.0.1:8000": 15}}
			r := &propRun{t: t, rng: rand.New(rand.NewPCG(seed, 7)), f: newTestForest(l), ref: newRef(), bounded: true}
			for i := range 400 {
				r.step(i)
				if tc := r.f.TenantChars("10.0.0.1:8000"); tc > 15 {
					t.Fatalf("step %d: tenant over its bound: %d", i, tc)
				}
			}
		})
	}
}

// FuzzForest runs operation sequences decoded from arbitrary bytes, texts included, so they
// carry invalid UTF-8. Without bounds every result must equal the reference; with bounds it
// must stay sound and within the hard cap.
func FuzzForest(f *testing.F) {
	f.Add([]byte("\x00\x01\x05hello\x01\x05help!\x02\x05hello\x03\x00\x04"))
	f.Add([]byte("\x00\x00\x06\xe4\xbd\xa0abc\x00\x03\xe4\xbd\xa0\x11\x03\xe4\xbdz\x12\x02xy"))
	f.Add([]byte("\xc0\x00\x08aaaabbbb\x10\x08aaaacccc\x20\x08bbbbcccc\x04\x01\x04aaaa"))
	f.Add([]byte("\x90\x30\x20abcdefghijabcdefghijabcdefghij\x05\x31\x10\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8\xf7\xf6\xf5\xf4\xf3\xf2\xf1\xf0"))
	f.Add([]byte("\x00\x00\x03\xef\xbf\xbd\x00\x01\xff\x01\x01\xff\x01\x03\xef\xbf\xbd"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		bounded := data[0] >= 0x80
		l := Limits{}
		if bounded {
			l.MaxChars = int64(data[0]&0x3f) + 1
			if data[0]&0x40 != 0 {
				l.TenantMaxChars = map[string]int64{"t1": int64(data[0]&0x0f) + 1}
			}
		}
		fo := newTestForest(l)
		ref := newRef()
		data = data[1:]
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		for step := 0; len(data) > 0 && step < 200; step++ {
			op := next()
			treeName := fmt.Sprint("m", op>>4&1)
			tenant := fmt.Sprint("t", op>>5&3)
			// Texts stay short so that the quadratic reference keeps up.
			n := min(int(next())%48, len(data))
			text := string(data[:n])
			data = data[n:]
			tr := fo.Tree(treeName)
			switch op & 7 {
			case 0, 1:
				tr.Insert(text, tenant)
				ref.insert(treeName, text, tenant)
			case 2:
				got, want := match(tr, text), ref.match(treeName, text)
				if bounded {
					soundMatch(t, step, text, got, want)
				} else if !sameMatch(got, want) {
					t.Fatalf("Match(%q) = %s, want %s", text, showMatch(got), showMatch(&want))
				}
			case 3:
				got, want := tr.MatchTenant(text, tenant), ref.matchTenant(treeName, text, tenant)
				if got != want && !(bounded && got < want) {
					t.Fatalf("MatchTenant(%q, %s) = %d, want %d", text, tenant, got, want)
				}
			case 4:
				fo.Evict()
				if c := fo.Chars(); bounded && c > l.MaxChars {
					t.Fatalf("%d chars after Evict, bound %d", c, l.MaxChars)
				}
			case 5:
				tr.RemoveTenant(tenant)
				ref.removeTenant(treeName, tenant)
			case 6:
				fo.RemoveTenant(tenant)
				for name := range ref.trees {
					ref.removeTenant(name, tenant)
				}
			case 7:
				if m := match(tr, text); m.Runes != utf8.RuneCountInString(text) {
					t.Fatalf("Runes(%q) = %d", text, m.Runes)
				}
			}
			if err := verify(fo); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			if bounded && fo.Chars() > hardCap(l.MaxChars) {
				t.Fatalf("%d chars over the hard cap %d", fo.Chars(), hardCap(l.MaxChars))
			}
			if !bounded {
				for _, name := range []string{"m0", "m1"} {
					if tr := fo.Get(name); tr != nil && tr.Chars() != ref.chars(name, "") {
						t.Fatalf("tree %s chars %d, want %d", name, tr.Chars(), ref.chars(name, ""))
					}
				}
			}
		}
	})
}
