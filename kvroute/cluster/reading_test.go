package cluster

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

func TestOwner(t *testing.T) {
	ids := []uint64{0x11, 0x2233, 0x445566, 0x778899aa}
	count := map[uint64]int{}
	const keys = 4000
	for i := range keys {
		key := fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256)
		o := owner(key, ids)
		// The same for every order of the ids: every node computes it alike.
		if o2 := owner(key, []uint64{ids[3], ids[1], ids[0], ids[2]}); o2 != o {
			t.Fatalf("%s: owner %x in one order, %x in another", key, o, o2)
		}
		// Rendezvous: removing a node that does not own the key keeps its owner; removing the
		// owner moves the key to one of the others.
		var rest []uint64
		for _, id := range ids {
			if id != o {
				rest = append(rest, id)
			}
		}
		if o3 := owner(key, rest); o3 == o || o3 == 0 {
			t.Fatalf("%s: owner %x gone, new owner %x", key, o, o3)
		}
		if other := rest[0]; owner(key, without(ids, other)) != o {
			t.Fatalf("%s: owner changed when a non-owner left", key)
		}
		count[o]++
	}
	for _, id := range ids {
		if n := count[id]; n < keys/4*8/10 || n > keys/4*12/10 {
			t.Errorf("node %x owns %d of %d keys, want about a quarter", id, n, keys)
		}
	}
	if owner("k", nil) != 0 || owner("k", []uint64{7}) != 7 {
		t.Error("owner of no ids or of one")
	}
}

func without(ids []uint64, x uint64) []uint64 {
	var out []uint64
	for _, id := range ids {
		if id != x {
			out = append(out, id)
		}
	}
	return out
}

func TestOwnsLivePeers(t *testing.T) {
	cfg := testConfig()
	n, _ := newTestNode(t, cfg)
	peer, _ := newTestNode(t, cfg)
	// Alone, a node owns every engine.
	for i := range 20 {
		if !n.Owns(fmt.Sprint("e", i)) {
			t.Fatal("a node alone must own every engine")
		}
	}
	n.receive(kindData, sealAs(peer, kindData, appendLoad(nil, nil)))
	mine, theirs := 0, 0
	for i := range 200 {
		key := fmt.Sprint("e", i)
		want := owner(key, []uint64{n.id, peer.id}) == n.id
		if n.Owns(key) != want {
			t.Fatalf("%s: Owns %v, want %v", key, !want, want)
		}
		if want {
			mine++
		} else {
			theirs++
		}
	}
	if mine == 0 || theirs == 0 {
		t.Fatalf("two nodes: %d and %d engines", mine, theirs)
	}
	// The peer goes silent beyond load_ttl: this node owns everything again.
	n.rmu.Lock()
	n.peers[peer.id].lastHeard = time.Now().Add(-n.cfg.LoadTTL - time.Second)
	n.rmu.Unlock()
	for i := range 200 {
		if !n.Owns(fmt.Sprint("e", i)) {
			t.Fatal("a silent peer must not own engines")
		}
	}
}

func TestReadingRoundTrip(t *testing.T) {
	n, r := newTestNode(t, testConfig())
	peer, _ := newTestNode(t, testConfig())
	at := time.Now().Add(-300 * time.Millisecond)
	good := EngineReading{Upstream: "10.0.0.1:8000", Engine: "vllm", At: at, Running: 3, Waiting: 2, KVCapacityTokens: 37440, Known: ReadingRunning | ReadingWaiting | ReadingKVCapacity}
	var got record
	if err := decodeRecords(appendReading(nil, good), wireVersion, 1<<10, func(rec *record) { got = *rec }); err != nil {
		t.Fatal(err)
	}
	if got.typ != recReading || !got.reading.At.Equal(at) {
		t.Fatalf("decoded %+v", got)
	}
	got.reading.At = at // monotonic reading dropped on the wire
	if !reflect.DeepEqual(got.reading, good) {
		t.Fatalf("round trip: got %+v, want %+v", got.reading, good)
	}

	bad := []EngineReading{
		{Upstream: "", At: at},
		{Upstream: "u", At: time.Time{}, Known: ReadingRunning, Running: 1},
		{Upstream: "u", At: at, Known: ReadingRunning, Running: -1},
		{Upstream: "u", At: at, Known: ReadingWaiting, Waiting: maxLoad + 1},
		{Upstream: "u", At: at, Known: ReadingKVCapacity, KVCapacityTokens: 0},
		{Upstream: "u", At: at, Known: ReadingKVCapacity, KVCapacityTokens: MaxReadingCapacity + 1},
		{Upstream: "u", At: at, Known: 1 << 5},
		{Upstream: "u", Engine: "\xff", At: at},
		{Upstream: "u", At: time.Now().Add(-time.Hour), Known: ReadingRunning, Running: 1},  // older than the replay window
		{Upstream: "u", At: time.Now().Add(time.Minute), Known: ReadingRunning, Running: 1}, // from the future
	}
	failed := EngineReading{Upstream: "10.0.0.2:8000", At: at, Failed: true}
	// One message: good, the bad ones, a failed read, then a binding: bad values drop their
	// record only, never the rest of the message.
	plain := appendReading(nil, good)
	for _, b := range bad {
		plain = appendReading(plain, b)
	}
	plain = appendReading(plain, failed)
	plain = appendBinding(plain, "m", "k", "u", time.Now().UnixNano())
	n.receive(kindData, sealAs(peer, kindData, plain))
	want := []string{
		"reading 10.0.0.1:8000 vllm run 3 wait 2 kv 37440 known 7 failed false",
		"reading 10.0.0.2:8000  run 0 wait 0 kv 0 known 0 failed true",
		"binding m k u",
	}
	if g := r.got(); !reflect.DeepEqual(g, want) {
		t.Fatalf("got %q\nwant %q", g, want)
	}
	st := n.Stats()
	if st.ReadingsReceived != 2 || st.ReadingsRejected != uint64(len(bad)) || st.RejectedMalformed != 0 {
		t.Errorf("readings received %d rejected %d malformed %d, want 2, %d, 0", st.ReadingsReceived, st.ReadingsRejected, st.RejectedMalformed, len(bad))
	}

	// An engine name over the bound is a malformed record, like any oversized field.
	long := appendReading(nil, EngineReading{Upstream: "u", Engine: string(make([]byte, maxEngineName+1)), At: at})
	if err := decodeRecords(long, wireVersion, 1<<10, func(*record) {}); err == nil {
		t.Error("an engine name of 33 bytes decoded")
	}
	// Truncated anywhere: an error, never a panic.
	enc := appendReading(nil, good)
	for i := 1; i < len(enc); i++ {
		if err := decodeRecords(enc[:i], wireVersion, 1<<10, func(*record) {}); err == nil {
			t.Errorf("truncated at %d of %d: decoded", i, len(enc))
		}
	}
	// A catch-up reply may not carry readings.
	before := n.Stats().RejectedMalformed
	n.receive(kindSyncData, sealTo(peer, n.id, kindSyncData, appendReading(nil, good)))
	if n.Stats().RejectedMalformed != before+1 {
		t.Error("a reading in a catch-up reply was not rejected")
	}
}

func TestPublishReadingRejectsBadValues(t *testing.T) {
	n, _ := newTestNode(t, testConfig())
	n.PublishReading(EngineReading{Upstream: "u", At: time.Now(), Known: ReadingRunning, Running: -5})
	if st := n.Stats(); st.ReadingsRejected != 1 || len(n.queue) != 0 {
		t.Errorf("a bad reading was queued (rejected %d, queued %d)", st.ReadingsRejected, len(n.queue))
	}
	n.PublishReading(EngineReading{Upstream: "u", At: time.Now(), Known: ReadingRunning, Running: 5})
	if len(n.queue) != 1 {
		t.Errorf("a good reading was not queued")
	}
}
