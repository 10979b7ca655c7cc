package cluster

import (
	"math"
	"reflect"
	"testing"
	"time"
)

// TestLearnedRoundTrip: learned figures travel in their own record; out-of-bounds values drop
// their record only; truncation is an error, never a panic; a catch-up reply may not carry
// them.
func TestLearnedRoundTrip(t *testing.T) {
	n, r := newTestNode(t, testConfig())
	peer, _ := newTestNode(t, testConfig())
	at := time.Now().Add(-300 * time.Millisecond)
	good := EngineLearned{Upstream: "10.0.0.1:8000", At: at, PrefillTokensPerSecond: 19876.5, DecodeTokensPerSecond: 480, RestartedAt: at.Add(-2 * time.Second)}
	var got record
	if err := decodeRecords(appendLearned(nil, good), wireVersion, 1<<10, func(rec *record) { got = *rec }); err != nil {
		t.Fatal(err)
	}
	if got.typ != recLearned || !got.learned.At.Equal(at) || !got.learned.RestartedAt.Equal(good.RestartedAt) {
		t.Fatalf("decoded %+v", got)
	}
	got.learned.At, got.learned.RestartedAt = good.At, good.RestartedAt // monotonic readings dropped on the wire
	if !reflect.DeepEqual(got.learned, good) {
		t.Fatalf("round trip: got %+v, want %+v", got.learned, good)
	}

	bad := []EngineLearned{
		{Upstream: "", At: at},
		{Upstream: "u"},
		{Upstream: "u", At: at, PrefillTokensPerSecond: -1},
		{Upstream: "u", At: at, PrefillTokensPerSecond: 0.5},
		{Upstream: "u", At: at, DecodeTokensPerSecond: 2e7},
		{Upstream: "u", At: at, PrefillTokensPerSecond: math.NaN()},
		{Upstream: "u", At: at, PrefillTokensPerSecond: math.Inf(1)},
		{Upstream: "u", At: at, RestartedAt: at.Add(time.Minute)},
		{Upstream: "u", At: time.Now().Add(-time.Hour)},  // older than the replay window
		{Upstream: "u", At: time.Now().Add(time.Minute)}, // from the future
	}
	noRestart := EngineLearned{Upstream: "10.0.0.2:8000", At: at, PrefillTokensPerSecond: 5000}
	plain := appendLearned(nil, good)
	for _, b := range bad {
		plain = appendLearned(plain, b)
	}
	plain = appendLearned(plain, noRestart)
	plain = appendBinding(plain, "m", "k", "u", time.Now().UnixNano())
	n.receive(kindData, sealAs(peer, kindData, plain))
	want := []string{
		"learned 10.0.0.1:8000 prefill 19876.5 decode 480 restarted true",
		"learned 10.0.0.2:8000 prefill 5000 decode 0 restarted false",
		"binding m k u",
	}
	if g := r.got(); !reflect.DeepEqual(g, want) {
		t.Fatalf("got %q\nwant %q", g, want)
	}
	st := n.Stats()
	if st.LearnedReceived != 2 || st.LearnedRejected != uint64(len(bad)) || st.RejectedMalformed != 0 {
		t.Errorf("learned received %d rejected %d malformed %d, want 2, %d, 0", st.LearnedReceived, st.LearnedRejected, st.RejectedMalformed, len(bad))
	}

	enc := appendLearned(nil, good)
	for i := 1; i < len(enc); i++ {
		if err := decodeRecords(enc[:i], wireVersion, 1<<10, func(*record) {}); err == nil {
			t.Errorf("truncated at %d of %d: decoded", i, len(enc))
		}
	}
	before := n.Stats().RejectedMalformed
	n.receive(kindSyncData, sealTo(peer, n.id, kindSyncData, appendLearned(nil, good)))
	if n.Stats().RejectedMalformed != before+1 {
		t.Error("learned figures in a catch-up reply were not rejected")
	}

}

func TestPublishLearned(t *testing.T) {
	n, _ := newTestNode(t, testConfig())
	n.PublishLearned(EngineLearned{Upstream: "u", At: time.Now(), PrefillTokensPerSecond: -5})
	if st := n.Stats(); st.LearnedRejected != 1 || len(n.queue) != 0 {
		t.Errorf("bad figures were queued (rejected %d, queued %d)", st.LearnedRejected, len(n.queue))
	}
	n.PublishLearned(EngineLearned{Upstream: "u", At: time.Now(), PrefillTokensPerSecond: 5000})
	if len(n.queue) != 1 {
		t.Fatal("good figures were not queued")
	}
	if it := <-n.queue; it.kind != recLearned {
		t.Errorf("queued kind %d", it.kind)
	}
}
