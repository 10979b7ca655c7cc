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

	"github.com/kvroute/caddy-kvroute/examples/workload"
)

// Benchmarks build trees from prompts that share one of a few long system prompts: half of
// each prompt is one of eight system prompts, the other half text of its own. Built trees are
// cached for the process, so -count repeats do not rebuild them.

var benchWords = strings.Fields(`the a of and to in is that for it as with was on be by at this
from or an are which have not has but had were their they one all can there been if more when
will would who so no model token cache prefix request server batch memory layer attention
router upstream latency energy prompt context window decode prefill kernel tensor weight
system user assistant answer question document section table figure result method data
value function return error state time first last next number order level group point`)

// benchText returns n bytes of English-like ASCII, the same for the same seed.
func benchText(seed uint64, n int) string {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var sb strings.Builder
	sb.Grow(n + 16)
	for sb.Len() < n {
		sb.WriteString(benchWords[rng.IntN(len(benchWords))])
		if rng.IntN(12) == 0 {
			sb.WriteString(". ")
		} else {
			sb.WriteByte(' ')
		}
	}
	return sb.String()[:n]
}

var benchTenants = func() []string {
	t := make([]string, 8)
	for i := range t {
		t[i] = fmt.Sprintf("10.0.0.%d:8000", i+1)
	}
	return t
}()

func benchSystems(promptLen int) []string {
	s := make([]string, 8)
	for i := range s {
		s[i] = fmt.Sprintf("<|system|> You are assistant %d. ", i) + benchText(uint64(i), promptLen/2)
	}
	return s
}

// benchPrompt returns prompt i of a corpus: a system prompt and its own text, promptLen bytes.
func benchPrompt(systems []string, promptLen, i int) string {
	sys := systems[i%len(systems)]
	return sys + benchText(uint64(1_000_000+i), promptLen-len(sys))
}

type corpus struct {
	f       *Forest
	tr      *Tree
	prompts int      // inserted, in order 0..prompts-1
	hits    []string // inserted prompts, the most recent ones
	misses  []string // a system prompt and new text
}

var (
	corpusMu sync.Mutex
	corpora  = map[string]*corpus{}
)

// buildCorpus inserts prompts of promptLen bytes until the tree stores about chars chars.
func buildCorpus(promptLen int, chars int64) *corpus {
	systems := benchSystems(promptLen)
	f := NewForest(Limits{})
	c := &corpus{f: f, tr: f.Tree("model")}
	c.fill(systems, promptLen, chars)
	for i := range 256 {
		c.misses = append(c.misses, benchPrompt(systems, promptLen, 1<<30+i))
	}
	return c
}

// fill inserts prompts 0, 1, ... again, and more until the tree stores chars chars; the
// last 256 are the hits.
func (c *corpus) fill(systems []string, promptLen int, chars int64) {
	var hits []string
	for i := 0; i < c.prompts || c.f.Chars() < chars; i++ {
		p := benchPrompt(systems, promptLen, i)
		c.tr.Insert(p, benchTenants[i%len(benchTenants)])
		hits = append(hits, p)
		if len(hits) > 512 {
			hits = hits[256:]
		}
		c.prompts = max(c.prompts, i+1)
	}
	c.hits = hits[max(0, len(hits)-256):]
}

func getCorpus(b *testing.B, promptLen int, chars int64) *corpus {
	key := fmt.Sprint(promptLen, "/", chars)
	corpusMu.Lock()
	defer corpusMu.Unlock()
	c := corpora[key]
	if c == nil {
		b.StopTimer()
		c = buildCorpus(promptLen, chars)
		corpora[key] = c
		b.StartTimer()
	}
	return c
}

var benchSizes = []struct {
	name      string
	promptLen int
	chars     int64
}{
	{"prompt=4KiB/tree=1M", 4 << 10, 1 << 20},
	{"prompt=4KiB/tree=64M", 4 << 10, 64 << 20},
	{"prompt=64KiB/tree=1M", 64 << 10, 1 << 20},
	{"prompt=64KiB/tree=64M", 64 << 10, 64 << 20},
}

func BenchmarkMatch(b *testing.B) {
	for _, sz := range benchSizes {
		for _, kind := range []string{"hit", "miss"} {
			b.Run(sz.name+"/"+kind, func(b *testing.B) {
				c := getCorpus(b, sz.promptLen, sz.chars)
				qs := c.hits
				if kind == "miss" {
					qs = c.misses
				}
				var m Match
				c.tr.Match(qs[0], &m)
				b.ReportAllocs()
				b.SetBytes(int64(sz.promptLen))
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					c.tr.Match(qs[i%len(qs)], &m)
				}
				b.StopTimer()
				if kind == "hit" && m.Tenants[0].Runes != m.Runes {
					b.Fatalf("hit matched %d of %d", m.Tenants[0].Runes, m.Runes)
				}
			})
		}
	}
}

func BenchmarkMatchParallel(b *testing.B) {
	c := getCorpus(b, 4<<10, 64<<20)
	b.ReportAllocs()
	b.ResetTimer()
	var seq atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		var m Match
		i := int(seq.Add(1) * 97)
		for pb.Next() {
			c.tr.Match(c.hits[i%len(c.hits)], &m)
			i++
		}
	})
}

// BenchmarkRouteParallel is the policy's pattern: match, then record the choice.
func BenchmarkRouteParallel(b *testing.B) {
	c := getCorpus(b, 4<<10, 64<<20)
	b.ReportAllocs()
	b.ResetTimer()
	var seq atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		var m Match
		i := int(seq.Add(1) * 97)
		for pb.Next() {
			q := c.hits[i%len(c.hits)]
			c.tr.Match(q, &m)
			c.tr.Insert(q, m.Tenants[0].Tenant)
			i++
		}
	})
}

func BenchmarkInsert(b *testing.B) {
	for _, promptLen := range []int{4 << 10, 64 << 10} {
		const pool = 1024
		systems := benchSystems(promptLen)
		prompts := make([]string, pool)
		for i := range prompts {
			prompts[i] = benchPrompt(systems, promptLen, i)
		}
		var f *Forest
		var tr *Tree
		reset := func() {
			f = NewForest(Limits{})
			tr = f.Tree("model")
			for i, s := range systems {
				tr.Insert(s, benchTenants[i%len(benchTenants)])
			}
		}
		// A new prompt whose system prompt is cached: walk it, split, store the rest.
		b.Run(fmt.Sprintf("prompt=%dKiB/new", promptLen>>10), func(b *testing.B) {
			reset()
			b.ReportAllocs()
			b.SetBytes(int64(promptLen))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if i%pool == 0 && i > 0 {
					b.StopTimer()
					reset()
					b.StartTimer()
				}
				tr.Insert(prompts[i%pool], benchTenants[i%len(benchTenants)])
			}
		})
		// A prompt stored before: stamp the path.
		b.Run(fmt.Sprintf("prompt=%dKiB/again", promptLen>>10), func(b *testing.B) {
			reset()
			for i, p := range prompts {
				tr.Insert(p, benchTenants[i%len(benchTenants)])
			}
			b.ReportAllocs()
			b.SetBytes(int64(promptLen))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tr.Insert(prompts[i%pool], benchTenants[i%len(benchTenants)])
			}
		})
	}
}

var (
	traceOnce sync.Once
	trace     []workload.Request
	traceErr  error
)

func loadTrace(b *testing.B) []workload.Request {
	traceOnce.Do(func() {
		trace, traceErr = workload.Mooncake()
		if traceErr == nil {
			for _, r := range trace {
				r.Prompt() // fill workload's block cache before measuring the heap
			}
		}
	})
	if traceErr != nil {
		b.Fatal(traceErr)
	}
	return trace
}

// BenchmarkMooncake builds the tree of the whole Mooncake trace (each request's prompt sent
// to one of eight upstreams in turn) and reports the heap it takes per stored char.
func BenchmarkMooncake(b *testing.B) {
	reqs := loadTrace(b)
	b.ReportAllocs()
	var perChar, chars, nodes float64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		b.StartTimer()
		f := NewForest(Limits{})
		tr := f.Tree("")
		for j, r := range reqs {
			tr.Insert(r.Prompt(), benchTenants[j%len(benchTenants)])
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		perChar = float64(after.HeapAlloc-before.HeapAlloc) / float64(f.Chars())
		chars = float64(f.Chars())
		nodes = float64(countNodes(tr))
		runtime.KeepAlive(f)
		b.StartTimer()
	}
	b.ReportMetric(perChar, "B/char")
	b.ReportMetric(chars/1e6, "Mchars")
	b.ReportMetric(nodes, "nodes")
}

func countNodes(tr *Tree) int {
	n := 0
	stack := []*node{&tr.root}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, e := range x.kids() {
			stack = append(stack, e.n)
		}
		n++
	}
	return n - 1
}

// BenchmarkEvictionMatch measures match throughput on a 64M-char tree while idle and while
// an eviction pass takes it down to 60%, with GOMAXPROCS goroutines matching recent prompts
// (which the pass keeps). ns/op is the pass's duration under that load; ratio is
// evict-match/s over idle-match/s, idle being measured just before and just after the pass;
// alone-ms is the same pass on an otherwise idle process, without yielding (as when an
// insert waits for it).
func BenchmarkEvictionMatch(b *testing.B) {
	e := getEvictCorpus(b)
	var idleRate, evictRate, freed, alone float64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e.refill()
		idle := matchRate(e.c, func() { time.Sleep(250 * time.Millisecond) })
		e.c.f.storeLimits(Limits{MaxChars: evictTo})
		var st EvictStats
		b.StartTimer()
		busy := matchRate(e.c, func() { st = e.c.f.Evict() })
		b.StopTimer()
		idle = (idle + matchRate(e.c, func() { time.Sleep(250 * time.Millisecond) })) / 2
		idleRate, evictRate = idle, busy
		freed = float64(st.Chars)
		if e.c.f.Chars() > evictTo {
			b.Fatalf("pass left %d chars", e.c.f.Chars())
		}
		e.refill()
		e.c.f.storeLimits(Limits{MaxChars: evictTo})
		start := time.Now()
		e.c.f.evictFor(1)
		alone = float64(time.Since(start).Microseconds()) / 1000
		b.StartTimer()
	}
	b.ReportMetric(idleRate, "idle-match/s")
	b.ReportMetric(evictRate, "evict-match/s")
	b.ReportMetric(evictRate/idleRate, "ratio")
	b.ReportMetric(freed/1e6, "Mchars-freed")
	b.ReportMetric(alone, "alone-ms")
}

const (
	evictFrom = 64 << 20
	evictTo   = evictFrom * 2 / 3 // a pass goes down to 90% of this: 60% of evictFrom
)

type evictCorpus struct {
	c       *corpus
	systems []string
}

var evictOnce struct {
	sync.Mutex
	e *evictCorpus
}

func getEvictCorpus(b *testing.B) *evictCorpus {
	evictOnce.Lock()
	defer evictOnce.Unlock()
	if evictOnce.e == nil {
		b.StopTimer()
		f := NewForest(Limits{})
		e := &evictCorpus{c: &corpus{f: f, tr: f.Tree("model")}, systems: benchSystems(4 << 10)}
		e.refill()
		evictOnce.e = e
		b.StartTimer()
	}
	return evictOnce.e
}

// refill inserts the corpus again, oldest first, until the tree is back to 64M chars.
func (e *evictCorpus) refill() {
	e.c.f.SetLimits(Limits{})
	e.c.tr = e.c.f.Tree("model")
	e.c.fill(e.systems, 4<<10, evictFrom)
	runtime.GC()
}

// matchRate runs GOMAXPROCS goroutines matching the corpus' recent prompts while work runs,
// and returns their matches per second.
func matchRate(c *corpus, work func()) float64 {
	var stop atomic.Bool
	var total atomic.Int64
	var wg sync.WaitGroup
	for g := range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var m Match
			n := 0
			for i := g * 31; !stop.Load(); i++ {
				c.tr.Match(c.hits[i%len(c.hits)], &m)
				n++
			}
			total.Add(int64(n))
		}()
	}
	start := time.Now()
	work()
	d := time.Since(start)
	stop.Store(true)
	wg.Wait()
	return float64(total.Load()) / d.Seconds()
}
