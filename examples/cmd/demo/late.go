package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/caddy-kvroute/examples/replay"
)

// -late-replica runs kv_cache_aware with the cluster and its last replica started mid-run. The
// front lists that replica from the start and, until it listens, retries the requests whose
// dial to it fails on the next replica (site.Retry). From the replica's process start the demo
// reads its GET /kvroute/ and its peers' until its trees hold what theirs do, then compares the
// hit ratio of the requests it routed from then on with the others' over the same window.

// caughtUpFrac is how much of its peers' trees the late replica must hold to count as caught
// up: the peers keep learning while the three are read one after the other, so exact equality
// would depend on the timing of the reads.
const caughtUpFrac = 0.95

// treeSample is one reading of the late replica's trees and its peers', in chars (the sum of
// every upstream's tree_chars over the models).
type treeSample struct {
	At    time.Duration // since the replay started
	Late  int64
	Peers []int64
}

// ratio is the late replica's chars over the mean of its peers' (0 while they hold nothing).
func (s treeSample) ratio() float64 {
	var sum int64
	for _, p := range s.Peers {
		sum += p
	}
	if sum == 0 {
		return 0
	}
	return float64(s.Late) / (float64(sum) / float64(len(s.Peers)))
}

// caughtUp returns the first sample whose late replica holds at least frac of its peers' mean.
func caughtUp(samples []treeSample, frac float64) (treeSample, bool) {
	for _, s := range samples {
		if s.ratio() >= frac {
			return s, true
		}
	}
	return treeSample{}, false
}

// hitStat is the hit ratio of a set of requests.
type hitStat struct {
	Requests, Failed     int
	Cached, PromptTokens int
}

func (h hitStat) ratio() float64 {
	if h.PromptTokens == 0 {
		return 0
	}
	return float64(h.Cached) / float64(h.PromptTokens)
}

// replicaHits splits the requests sent from `from` on (since the replay started) into those
// the replica named routed and those the others did; failed requests, which name no replica,
// are counted apart in the first.
func replicaHits(recs []replay.Record, replica string, from time.Duration) (late, others hitStat, failed int) {
	f := float64(from) / float64(time.Millisecond)
	for _, r := range recs {
		if r.StartMs < f {
			continue
		}
		if r.Error != "" {
			failed++
			continue
		}
		h := &others
		if r.Replica == replica {
			h = &late
		}
		h.Requests++
		h.Cached += r.CachedTokens
		h.PromptTokens += r.PromptTokens
	}
	return late, others, failed
}

// lateJoin is what the late replica did, in times since the replay started.
type lateJoin struct {
	Addr      string        // host:port the front dials
	Started   time.Duration // its process started
	Listening time.Duration // it answered on its port
	FirstSync time.Duration // its first catch-up records arrived (0: none seen)
	Synced    uint64        // catch-up records received by the time it caught up
	CaughtUp  treeSample    // the first reading where its trees held caughtUpFrac of its peers'
	Caught    bool
	Last      treeSample // the last reading
}

// startLate starts the group's last replica `at` after start (the replay's start) and reads its
// status and its peers' until it has caught up, ctx ends or a minute has passed.
func (g *group) startLate(ctx context.Context, b *bench, start time.Time, at time.Duration) <-chan lateResult {
	done := make(chan lateResult, 1)
	go func() {
		defer close(done)
		var j lateJoin
		j.Addr = "127.0.0.1:" + strconv.Itoa(g.latePorts[1])
		select {
		case <-ctx.Done():
			done <- lateResult{err: ctx.Err()}
			return
		case <-time.After(time.Until(start.Add(at))):
		}
		peers := append([]int(nil), g.admins...)
		lateAdmin := g.latePorts[0]
		j.Started = time.Since(start)
		polled := make(chan []treeSample, 1)
		pctx, stopPoll := context.WithCancel(ctx)
		defer stopPoll()
		go func() { polled <- pollTrees(pctx, start, lateAdmin, peers, &j) }()
		c, admin, err := b.startCaddyPorts(ctx, g.policy, g.latePorts)
		if err != nil {
			stopPoll()
			<-polled
			done <- lateResult{err: fmt.Errorf("starting the late replica: %w", err)}
			return
		}
		j.Listening = time.Since(start)
		g.replicas = append(g.replicas, c)
		g.admins = append(g.admins, admin)
		samples := <-polled
		j.CaughtUp, j.Caught = caughtUp(samples, caughtUpFrac)
		if len(samples) > 0 {
			j.Last = samples[len(samples)-1]
		}
		done <- lateResult{join: j}
	}()
	return done
}

type lateResult struct {
	join lateJoin
	err  error
}

// pollTrees reads the late replica's GET /kvroute/ and its peers' every 50 ms until the late
// one has caught up, ctx ends or a minute has passed; it notes in j when the first catch-up
// records arrived and how many had by the end.
func pollTrees(ctx context.Context, start time.Time, late int, peers []int, j *lateJoin) []treeSample {
	client := &http.Client{Timeout: time.Second}
	var samples []treeSample
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return samples
		case <-time.After(50 * time.Millisecond):
		}
		st, err := readTrees(client, late)
		if err != nil {
			continue // not up yet
		}
		at := time.Since(start)
		if st.synced > 0 && j.FirstSync == 0 {
			j.FirstSync = at
		}
		j.Synced = st.synced
		s := treeSample{At: at, Late: st.chars}
		for _, p := range peers {
			ps, err := readTrees(client, p)
			if err != nil {
				continue
			}
			s.Peers = append(s.Peers, ps.chars)
		}
		samples = append(samples, s)
		if s.ratio() >= caughtUpFrac {
			return samples
		}
	}
	return samples
}

// trees is what pollTrees reads of one replica.
type trees struct {
	chars  int64  // every upstream's tree_chars, summed
	synced uint64 // catch-up records received
}

func readTrees(client *http.Client, admin int) (trees, error) {
	resp, err := client.Get(fmt.Sprintf("http://localhost:%d/kvroute/", admin))
	if err != nil {
		return trees{}, err
	}
	defer resp.Body.Close()
	var st struct {
		Upstreams map[string]struct {
			TreeChars int64 `json:"tree_chars"`
		} `json:"upstreams"`
		Cluster *struct {
			SyncReceivedRecords uint64 `json:"sync_received_records"`
		} `json:"cluster"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return trees{}, err
	}
	var t trees
	for _, u := range st.Upstreams {
		t.chars += u.TreeChars
	}
	if st.Cluster != nil {
		t.synced = st.Cluster.SyncReceivedRecords
	}
	return t, nil
}

// report prints the late replica's catch-up and its hit ratio against the others' from the
// moment it caught up (or, if it served nothing before, from its first request).
func (j lateJoin) report(recs []replay.Record) string {
	first, early := time.Duration(-1), 0
	for _, r := range recs {
		if r.Replica == j.Addr {
			t := time.Duration(r.StartMs * float64(time.Millisecond))
			if first < 0 || t < first {
				first = t
			}
			if j.Caught && t < j.CaughtUp.At {
				early++
			}
		}
	}
	out := fmt.Sprintf("late replica %s: started at %v, listening %v later", j.Addr, j.Started.Round(time.Millisecond), (j.Listening - j.Started).Round(time.Millisecond))
	if j.FirstSync > 0 {
		out += fmt.Sprintf(", first catch-up records %v after its start (%d by the end)", (j.FirstSync - j.Started).Round(time.Millisecond), j.Synced)
	}
	if !j.Caught {
		return out + fmt.Sprintf("; never held %.0f%% of its peers' trees (last %.2f)", caughtUpFrac*100, j.Last.ratio())
	}
	out += fmt.Sprintf(", caught up (trees %.2f of its peers', %d vs %v chars) %v after its start",
		j.CaughtUp.ratio(), j.CaughtUp.Late, j.CaughtUp.Peers, (j.CaughtUp.At - j.Started).Round(time.Millisecond))
	if first < 0 {
		return out + "; it routed no request"
	}
	from := max(first, j.CaughtUp.At)
	late, others, failed := replicaHits(recs, j.Addr, from)
	rel := 0.0
	if others.ratio() > 0 {
		rel = late.ratio() / others.ratio()
	}
	out += fmt.Sprintf(";\n  first request through it at %v (%d before the reading that found it caught up); from %v on: its hit ratio %.3f over %d requests, the others' %.3f over %d (%.2f×), %d failed",
		first.Round(time.Millisecond), early, from.Round(time.Millisecond), late.ratio(), late.Requests, others.ratio(), others.Requests, rel, failed)
	// The same split for every replica, the late one's included: how far one replica's
	// share of the requests strays from the rest by chance alone.
	out += "\n  each replica against the others over that window:"
	for _, a := range replicasOf(recs) {
		one, rest, _ := replicaHits(recs, a, from)
		if rest.ratio() > 0 {
			out += fmt.Sprintf(" %s %.2f×", a, one.ratio()/rest.ratio())
		}
	}
	return out
}

// replicasOf returns the replicas the records name, in the order first seen.
func replicasOf(recs []replay.Record) []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range recs {
		if r.Replica != "" && !seen[r.Replica] {
			seen[r.Replica] = true
			out = append(out, r.Replica)
		}
	}
	return out
}
