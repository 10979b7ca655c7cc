package kvroute

// Floods: a million session ids and a hundred thousand random prompts at full speed against
// Select (in process, as policy_test.go does), megabyte keys, and a 100 MiB body through the
// in-process Caddy. Under -race the flood counts are divided by 10 (raceEnabled, set by the
// race_on_test.go / race_off_test.go build tags): the detector slows each decision about tenfold.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Flood sizes: distinct session ids, and distinct random prompts among those requests.
var floodSessions, floodPrompts = func() (int, int) {
	if raceEnabled {
		return 100_000, 10_000
	}
	return 1_000_000, 100_000
}()

// heapLive returns the bytes of live heap after a full collection.
func heapLive() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// randomText returns n bytes of random lowercase words.
func randomText(rng *rand.Rand, n int) []byte {
	const letters = "abcdefghijklmnopqrstuvwxyz     "
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rng.IntN(len(letters))]
	}
	return b
}

// At full speed, distinct session ids (one per request) and distinct random prompts (one
// request in ten) keep the session store at max_sessions and the trees within 1.1 ×
// max_tree_size at every moment, nothing crashes, a flood decision's median is within 5 × a
// normal decision's (a known conversation, a cached prefix, its session) on an idle router,
// and a normal decision made meanwhile has a p90 within 10 × its p90 on an idle router.
func TestFloodSessionsAndPrompts(t *testing.T) {
	const maxSessions, maxTree = 10_000, 4 << 20
	p := newPolicy(t, &KVCacheAware{MaxSessions: maxSessions, MaxTreeSize: maxTree})
	pool := newPool("u1:1", "u2:1", "u3:1", "u4:1", "u5:1", "u6:1", "u7:1", "u8:1")
	rng := rand.New(rand.NewPCG(7, 11))
	source := randomText(rng, 1<<20)

	// Normal traffic: 64 conversations sharing a system prompt, each with its session.
	sys := "You are a careful assistant. " + strings.Repeat("Answer in full sentences and cite sources. ", 40)
	normal := make([][]byte, 64)
	for i := range normal {
		normal[i] = []byte(chatBody("m", sys, fmt.Sprintf("conversation %d: %s", i, source[i*100:i*100+400])))
	}
	decide := func(i int) time.Duration {
		r, cancel := benchRequest(normal[i%len(normal)], fmt.Sprint("normal-", i%len(normal)))
		start := time.Now()
		up := p.Select(pool, r, nil)
		d := time.Since(start)
		cancel()
		if up == nil {
			t.Error("no upstream for a normal request")
		}
		return d
	}
	const idleSamples = 5000
	for i := 0; i < 1000; i++ { // warm up: prefixes and sessions learned, pools filled
		decide(i)
	}
	heap0 := heapLive()
	idle := make([]time.Duration, idleSamples)
	for i := range idle {
		idle[i] = decide(i)
	}

	// The flood.
	tiny := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	every := floodSessions / floodPrompts
	var next, prompts atomic.Int64
	var maxLive, maxChars atomic.Int64
	observe := func() {
		if n := int64(p.state.sessions.len()); n > maxLive.Load() {
			maxLive.Store(n)
		}
		if c := p.state.forest.Chars(); c > maxChars.Load() {
			maxChars.Store(c)
		}
	}
	workers := max(1, runtime.GOMAXPROCS(0)-1) // one P left for the normal decisions
	flood := make([][]time.Duration, workers)  // each worker's decision times
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			times := make([]time.Duration, 0, floodSessions/workers+1)
			defer func() { flood[w] = times }()
			for {
				i := int(next.Add(1)) - 1
				if i >= floodSessions {
					return
				}
				body := tiny
				if i%every == 0 {
					n := 500 + rng.IntN(2500)
					off := rng.IntN(len(source) - n)
					body = []byte(chatBody("m", string(source[off:off+n])))
					prompts.Add(1)
				}
				r, cancel := benchRequest(body, fmt.Sprint("flood-", i))
				begin := time.Now()
				up := p.Select(pool, r, nil)
				times = append(times, time.Since(begin))
				if up == nil {
					t.Error("no upstream for a flood request")
				}
				cancel()
				if i%512 == 0 {
					observe()
				}
			}
		}(w)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var during []time.Duration
	for i := 0; ; i++ {
		select {
		case <-done:
		default:
			during = append(during, decide(i))
			continue
		}
		break
	}
	elapsed := time.Since(start)
	floodTimes := slices.Concat(flood...)
	observe()
	heap1 := heapLive()

	idle99, during99 := percentile(idle, 0.99), percentile(during, 0.99)
	ratio := float64(during99) / float64(idle99)
	t.Logf("flood: %d requests (%d distinct sessions, %d random prompts) in %v = %.0f decisions/s on %d workers",
		floodSessions, floodSessions, prompts.Load(), elapsed.Round(time.Millisecond), float64(floodSessions)/elapsed.Seconds(), workers)
	t.Logf("bounds: sessions max %d (max_sessions %d), tree chars max %d (max_tree_size %d, ×%.3f); live heap %d MiB → %d MiB",
		maxLive.Load(), maxSessions, maxChars.Load(), maxTree, float64(maxChars.Load())/maxTree, heap0>>20, heap1>>20)
	t.Logf("normal decision p50/p99: idle %v/%v (%d samples), during the flood %v/%v (%d samples): p99 ratio %.2f",
		percentile(idle, 0.5), idle99, len(idle), percentile(during, 0.5), during99, len(during), ratio)

	if maxLive.Load() > maxSessions {
		t.Errorf("%d sessions bound during the flood, max_sessions %d", maxLive.Load(), maxSessions)
	}
	if maxChars.Load() > maxTree+maxTree/10 {
		t.Errorf("%d chars in the trees during the flood, max_tree_size %d (+10%%)", maxChars.Load(), maxTree)
	}
	if int(prompts.Load()) < floodPrompts {
		t.Errorf("only %d random prompts sent", prompts.Load())
	}
	if heap1 > heap0+256<<20 {
		t.Errorf("live heap grew from %d MiB to %d MiB: state not bounded", heap0>>20, heap1>>20)
	}
	// The p99 is logged, the p90 asserted: on a shared machine (CI's two cores, or other tests
	// running beside this one) one descheduled goroutine moves a p99 of 5,000 idle samples by
	// 20×, in the baseline as much as here, while the p90 tells whether the flood itself delays
	// normal decisions.
	idle90, during90 := percentile(idle, 0.9), percentile(during, 0.9)
	if len(during) < 100 {
		t.Errorf("only %d normal decisions during the flood", len(during))
	} else if r := float64(during90) / float64(idle90); r > 10 {
		t.Errorf("p90 of a normal decision: %v idle, %v during the flood (×%.1f > 10)", idle90, during90, r)
	}
	// Full speed: a flood decision costs what a normal one does, however full the stores are.
	// Medians of timed calls are compared, not the flood's elapsed time: the machine's load
	// stretches the elapsed time (the flood once took 96 s under -race at load average 18, on
	// a 60 s bound) and the tails, while a call of a fraction of a millisecond is rarely
	// descheduled, so its median is its cost at any load (0.5 × the idle median, measured).
	flood50, idle50 := percentile(floodTimes, 0.5), percentile(idle, 0.5)
	t.Logf("flood decision p50/p90 %v/%v", flood50, percentile(floodTimes, 0.9))
	if r := float64(flood50) / float64(idle50); r > 5 {
		t.Errorf("median flood decision %v, median normal decision on the idle router %v (×%.1f > 5)", flood50, idle50, r)
	}
	// The normal conversations, in use throughout, were not flooded out of the LRU.
	for i := range normal {
		if _, ok := p.state.sessions.get("m", fmt.Sprint("normal-", i), time.Now()); !ok {
			t.Errorf("session normal-%d was evicted by the flood", i)
		}
	}
}

// Megabyte keys: a 1 MiB session id in the header, a 1 MiB prompt_cache_key and a 1 MiB model
// name in the body cost the router a digest each, not a megabyte: after 64 such requests the
// live heap has not grown by more than 2 MiB, and every stored key is at most 71 bytes.
func TestFloodHugeKeys(t *testing.T) {
	p := newPolicy(t, nil)
	pool := newPool("a:1", "b:1", "c:1")
	huge := strings.Repeat("k", 1<<20)
	heap0 := heapLive()
	for i := 0; i < 64; i++ {
		key := fmt.Sprint(i, huge)
		var body []byte
		var hdr string
		switch i % 3 {
		case 0:
			hdr, body = key, []byte(chatBody("m", "hello"))
		case 1:
			body = []byte(fmt.Sprintf(`{"model":"m","prompt_cache_key":%q,"prompt":"hi"}`, key))
		case 2:
			body = []byte(fmt.Sprintf(`{"model":%q,"prompt":"hi"}`, key))
		}
		r, cancel := benchRequest(body, hdr)
		if p.Select(pool, r, nil) == nil {
			t.Fatal("no upstream")
		}
		cancel()
	}
	heap1 := heapLive()
	t.Logf("64 requests with 1 MiB keys: live heap %d KiB → %d KiB, %d sessions, %d trees", heap0>>10, heap1>>10, p.state.sessions.len(), p.state.forest.Len())
	if heap1 > heap0+2<<20 {
		t.Errorf("live heap grew by %d KiB after 64 requests with 1 MiB keys", (heap1-heap0)>>10)
	}
	for i := range p.state.sessions.shards {
		sh := &p.state.sessions.shards[i]
		sh.mu.Lock()
		for k := range sh.m {
			if len(k.sid) > 71 || len(k.model) > 71 {
				t.Errorf("a session key of %d+%d bytes is stored", len(k.model), len(k.sid))
			}
		}
		sh.mu.Unlock()
	}
	for _, name := range p.state.forest.Names() {
		if len(name) > 71 {
			t.Errorf("a tree named by a %d-byte model is stored", len(name))
		}
	}
}

// Over HTTP a 1 MiB session header meets Caddy's header limit before the plugin (16 KiB by
// default: 431). With the limit raised (servers { max_header_size 2MiB }) it reaches the
// policy, the request is served whole, and the router keeps a digest of it, not a megabyte.
func TestFloodHugeHeaderOverHTTP(t *testing.T) {
	leakCheck(t)
	ps := newProbes(t, 2)
	c := newClient(t, 20*time.Second)
	cfg := relConfig(ps.addrs(), "", "", "")
	raised := strings.Replace(cfg, "grace_period 1s", "grace_period 1s\n\tservers {\n\t\tmax_header_size 2MiB\n\t}", 1)
	for _, tc := range []struct {
		cfg  string
		want int
	}{{cfg, http.StatusRequestHeaderFieldsTooLarge}, {raised, http.StatusOK}} {
		startCaddy(t, tc.cfg)
		heap0 := heapLive()
		for i := 0; i < 8; i++ {
			body := bigChat(i, 1000)
			rep, code, err := post(t, c, "/v1/chat/completions", bytes.NewReader(body), "X-Session-ID", fmt.Sprint(i, strings.Repeat("s", 1<<20)))
			if err != nil || code != tc.want {
				t.Fatalf("1 MiB session header: status %d, %v; want %d", code, err, tc.want)
			}
			if code == http.StatusOK {
				checkIntact(t, rep, body)
			}
		}
		heap1 := heapLive()
		st := getStatus(t)
		t.Logf("8 requests with a 1 MiB session header: status %d, %d sessions bound, live heap %d KiB → %d KiB", tc.want, st.Sessions, heap0>>10, heap1>>10)
		if tc.want == http.StatusOK && st.Sessions != 8 || tc.want != http.StatusOK && st.Sessions != 0 {
			t.Errorf("%d sessions bound", st.Sessions)
		}
		if heap1 > heap0+2<<20 {
			t.Errorf("live heap grew by %d KiB", (heap1-heap0)>>10)
		}
		postIntact(t, c, "/v1/chat/completions", bigChat(99, 1000)) // still serving
	}
	waitIdle(t)
}

// hugeBody is a chat request whose user message is n bytes of text, generated as it is read,
// hashed on the way out.
type hugeBody struct {
	parts [][]byte
	left  int64 // filler bytes still to send
	fill  []byte
	sum   hash.Hash
	total int64
}

func newHugeBody(n int64) *hugeBody {
	head := []byte(`{"model":"m","messages":[{"role":"user","content":"`)
	tail := []byte(`"}],"max_tokens":1}`)
	return &hugeBody{
		parts: [][]byte{head, nil, tail},
		left:  n,
		fill:  bytes.Repeat([]byte("all work and no play makes a dull router "), 800),
		sum:   sha256.New(),
		total: int64(len(head)+len(tail)) + n,
	}
}

func (b *hugeBody) Read(p []byte) (int, error) {
	for len(b.parts) > 0 {
		if b.parts[0] == nil { // the filler
			if b.left == 0 {
				b.parts = b.parts[1:]
				continue
			}
			n := copy(p[:min(int64(len(p)), b.left)], b.fill)
			b.left -= int64(n)
			b.sum.Write(p[:n])
			return n, nil
		}
		n := copy(p, b.parts[0])
		b.sum.Write(p[:n])
		if b.parts[0] = b.parts[0][n:]; len(b.parts[0]) == 0 {
			b.parts = b.parts[1:]
		}
		return n, nil
	}
	return 0, io.EOF
}

// A 100 MiB body through the in-process Caddy (matcher with max_body 1 MiB; the policy alone
// with its 4 MiB default) reaches the upstream whole, and the live heap while it streams grows
// by a few times max_body (the bytes read for routing, the routing text, its copy in the
// tree), never by the body's size.
func TestFlood100MiBBody(t *testing.T) {
	leakCheck(t)
	ps := newProbes(t, 1)
	startCaddy(t, relConfig(ps.addrs(), "max_body 1MiB", "", ""))
	c := newClient(t, 5*time.Minute)
	const size = 100 << 20
	for _, tc := range []struct {
		path    string
		maxBody int64
		chunked bool
	}{
		{"/v1/chat/completions", 1 << 20, false},
		{"/v1/chat/completions", 1 << 20, true},
		{"/plain/v1/chat/completions", DefaultMaxBody, false},
	} {
		postIntact(t, c, tc.path, bigChat(1, 1000)) // warm up
		heap0 := heapLive()
		var peak atomic.Uint64
		var samples atomic.Int64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				if h := heapLive(); h > peak.Load() {
					peak.Store(h)
				}
				samples.Add(1)
			}
		}()
		body := newHugeBody(size)
		req, _ := http.NewRequest(http.MethodPost, baseURL+tc.path, body)
		if !tc.chunked {
			req.ContentLength = body.total
		}
		start := time.Now()
		resp, err := c.Do(req)
		close(stop)
		<-sampled
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := hex.EncodeToString(body.sum.Sum(nil))
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), want) || !strings.Contains(string(raw), fmt.Sprintf(`"len":%d`, body.total)) {
			t.Fatalf("%s: status %d, reply %.300s; want sha256 %s len %d", tc.path, resp.StatusCode, raw, want, body.total)
		}
		growth := int64(peak.Load()) - int64(heap0)
		t.Logf("%s (chunked %v): %d MiB in %v; live heap %d MiB, peak growth %.1f MiB (%.1f × max_body %d MiB) over %d samples",
			tc.path, tc.chunked, body.total>>20, time.Since(start).Round(time.Millisecond), heap0>>20, float64(growth)/(1<<20), float64(growth)/float64(tc.maxBody), tc.maxBody>>20, samples.Load())
		if samples.Load() < 3 {
			t.Errorf("only %d heap samples while streaming", samples.Load())
		}
		if growth > 6*tc.maxBody {
			t.Errorf("live heap grew by %d MiB while streaming a 100 MiB body (max_body %d MiB)", growth>>20, tc.maxBody>>20)
		}
	}
	waitIdle(t)
}
