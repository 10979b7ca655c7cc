package tree

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

// waitOrDump waits for wg, failing with every goroutine's stack if that takes too long.
func waitOrDump(t *testing.T, wg *sync.WaitGroup, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		buf := make([]byte, 1<<20)
		t.Fatalf("deadlock? goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	}
}

func TestConcurrent(t *testing.T) {
	const maxChars = 4000
	f := NewForest(Limits{MaxChars: maxChars, TenantMaxChars: map[string]int64{"u0": 600}})
	systems := make([]string, 6)
	for i := range systems {
		systems[i] = fmt.Sprintf("system %d: %s ", i, strings.Repeat("你好 rules ", 5+i))
	}
	ops := 1500
	if testing.Short() {
		ops = 300
	}
	var wg sync.WaitGroup
	var stop atomic.Bool
	var fail atomic.Value
	report := func(format string, args ...any) { fail.CompareAndSwap(nil, fmt.Sprintf(format, args...)) }

	worker := func(seed uint64) {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, 1))
		var m Match
		for range ops {
			tr := f.Tree(fmt.Sprint("model", rng.IntN(3)))
			text := systems[rng.IntN(len(systems))] + randomString(rng, rng.IntN(40))
			tenant := fmt.Sprint("u", rng.IntN(6))
			switch op := rng.IntN(10); {
			case op < 4:
				tr.Insert(text, tenant)
			case op < 8:
				tr.Match(text, &m)
				if m.Runes != utf8.RuneCountInString(text) {
					report("Runes %d, want %d", m.Runes, utf8.RuneCountInString(text))
				}
				for i, tm := range m.Tenants {
					if tm.Runes <= 0 || tm.Runes > m.Runes || i > 0 && tm.Runes > m.Tenants[i-1].Runes {
						report("bad match %s", showMatch(&m))
					}
				}
			case op < 9:
				if n, want := tr.MatchTenant(text, tenant), utf8.RuneCountInString(text); n < 0 || n > want {
					report("MatchTenant %d of a %d-rune text", n, want)
				}
			default:
				if rng.IntN(20) == 0 {
					f.RemoveTenant(tenant)
				} else if rng.IntN(20) == 0 {
					tr.RemoveTenant(tenant)
				}
			}
		}
	}
	for i := range 16 {
		wg.Add(1)
		go worker(uint64(i))
	}
	// Background: explicit passes, bound changes for one tenant, a watcher of the hard cap,
	// and the odd Reset.
	var bg sync.WaitGroup
	bg.Add(3)
	go func() {
		defer bg.Done()
		for !stop.Load() {
			f.Evict()
			time.Sleep(time.Millisecond)
		}
	}()
	go func() {
		defer bg.Done()
		for i := 0; !stop.Load(); i++ {
			f.SetLimits(Limits{MaxChars: maxChars, TenantMaxChars: map[string]int64{"u0": int64(200 + i%5*200)}})
			if i%50 == 49 {
				f.Reset()
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	go func() {
		defer bg.Done()
		for !stop.Load() {
			if c := f.Chars(); c > hardCap(maxChars) {
				report("%d chars over the hard cap", c)
			}
			runtime.Gosched()
		}
	}()
	waitOrDump(t, &wg, 2*time.Minute)
	stop.Store(true)
	waitOrDump(t, &bg, time.Minute)
	if msg := fail.Load(); msg != nil {
		t.Fatal(msg)
	}
	// Let a background pass that is still running finish before checking.
	f.evictMu.Lock()
	f.evictMu.Unlock()
	check(t, f)
	f.Evict()
	check(t, f)
	if c := f.Chars(); c > maxChars {
		t.Errorf("%d chars after Evict", c)
	}
	for _, name := range f.Names() {
		if f.Get(name).Chars() == 0 {
			t.Errorf("empty tree %q kept", name)
		}
	}
}

func TestConcurrentSamePrefix(t *testing.T) {
	// SGLang's high-contention case: all goroutines on one prefix, match right after insert.
	f := NewForest(Limits{})
	tr := f.Tree("")
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var m Match
			tenant := fmt.Sprint("tenant", g)
			for i := range 100 {
				text := fmt.Sprint("shared_prefix_", i)
				tr.Insert(text, tenant)
				tr.Match(text, &m)
				if m.Tenants[0].Runes != len(text) {
					t.Errorf("match %q = %s", text, showMatch(&m))
					return
				}
				if tr.MatchTenant(text, tenant) != len(text) {
					t.Errorf("%s lost %q", tenant, text)
					return
				}
			}
		}()
	}
	waitOrDump(t, &wg, time.Minute)
	check(t, f)
	for g := range 16 {
		if got := tr.TenantChars(fmt.Sprint("tenant", g)); got != tr.Chars() {
			t.Errorf("tenant%d holds %d of %d chars", g, got, tr.Chars())
		}
	}
}

func TestMatchDuringEviction(t *testing.T) {
	// Matches keep completing while a long pass runs.
	f := NewForest(Limits{})
	tr := f.Tree("")
	rng := rand.New(rand.NewPCG(5, 5))
	for i := range 20000 {
		tr.Insert(fmt.Sprintf("prompt %d %s", i, randomString(rng, 30)), fmt.Sprint("u", i%4))
	}
	var during atomic.Int64
	var running, stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var m Match
		for !stop.Load() {
			tr.Match("prompt 12345 x", &m)
			if running.Load() {
				during.Add(1)
			}
		}
	}()
	time.Sleep(10 * time.Millisecond)
	f.storeLimits(Limits{MaxChars: 1000})
	running.Store(true)
	st := f.Evict()
	running.Store(false)
	stop.Store(true)
	wg.Wait()
	check(t, f)
	if st.Nodes < 15000 || f.Chars() > 1000 {
		t.Fatalf("pass %+v left %d chars", st, f.Chars())
	}
	if during.Load() == 0 {
		t.Errorf("no match completed during a %v pass", st.Duration)
	}
	t.Logf("pass %+v; %d matches during it", st, during.Load())
}

func TestConcurrentInsertStampsInOrder(t *testing.T) {
	// Inserts of one tenant that share a prefix race for the tree's mutex. A stamp taken
	// before the mutex lets a later lock holder write an older stamp on the shared prefix
	// than the one an earlier holder left on its own deeper node, so a child would look more
	// recently used than its parent and eviction would take the parent's path first. verify
	// takes the id lock exclusively, so it sees the tree between inserts, as often as it can.
	f := NewForest(Limits{})
	tr := f.Tree("")
	var wg sync.WaitGroup
	var stop atomic.Bool
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				tr.Insert(fmt.Sprintf("shared system prompt %d/%d", g, i%7), "u")
			}
		}()
	}
	var err error
	for deadline := time.Now().Add(2 * time.Second); err == nil && time.Now().Before(deadline); {
		err = verify(f)
		runtime.Gosched()
	}
	stop.Store(true)
	waitOrDump(t, &wg, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	check(t, f)
}
