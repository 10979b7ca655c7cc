package cluster

import (
	"testing"
	"time"
)

// FuzzReceive feeds arbitrary bytes to the receive path as if they came from NATS.
func FuzzReceive(f *testing.F) {
	n, _ := newTestNode(f, testConfig())
	peer, _ := newTestNode(f, testConfig())
	f.Add(sealAs(peer, kindData, appendReset(nil)))
	f.Add(sealAs(peer, kindData, appendLoad(nil, []peerCount{{"u", 1}})))
	f.Add([]byte{wireMagic, wireVersion, kindData})
	f.Fuzz(func(t *testing.T, msg []byte) {
		n.receive(kindData, msg)
	})
}

// FuzzRecords seals arbitrary plaintext with a peer's key, so that everything after
// authentication (record decoding, decompression, fragments, loads, sync requests) is fuzzed.
func FuzzRecords(f *testing.F) {
	cfg := testConfig()
	cfg.MaxText = 1 << 16
	cfg.PeerRate = 1 << 30 // the fuzzer is a flood; the rate limit is tested elsewhere
	n, r := newTestNode(f, cfg)
	peer, _ := newTestNode(f, cfg)
	dec, _, _ := peer.encodeDecision("m", "u", textOf(3000), nil, nil)
	f.Add(dec)
	f.Add(appendBinding(nil, "m", "k", "u", 1))
	f.Add(appendFragment(nil, fragment{id: 1, index: 0, total: 2, chunk: dec[:10]}))
	f.Add(appendSyncReq(nil, true, []seenSeq{{1, 2}}))
	f.Add(appendLoad(nil, []peerCount{{"u", 5}}))
	f.Add(appendBinding(appendOrigin(nil, 1), "m", "k", "u", 1))
	f.Add(append(appendOrigin(nil, 1<<40), dec...))
	f.Add(appendReading(nil, EngineReading{Upstream: "u", Engine: "vllm", At: time.Now(), Running: 3, Waiting: 2, KVCapacityTokens: 37440, Known: ReadingRunning | ReadingWaiting | ReadingKVCapacity}))
	f.Fuzz(func(t *testing.T, plain []byte) {
		for _, kind := range []byte{kindData, kindSyncReq, kindSyncData} {
			to := uint64(0)
			if kind == kindSyncData {
				to = n.id
			}
			n.receive(kind, sealTo(peer, to, kind, plain))
			// The same records from a peer that predates version 2.
			n.receive(kind, seal(nil, peer.aead, header{version: 1, kind: kind, sender: peer.id, seq: peer.seq.Add(1), nanos: time.Now().UnixNano(), to: to}, plain))
		}
		// Drain catch-up jobs a sync request queued: nothing serves them here.
		for len(n.syncJobs) > 0 {
			<-n.syncJobs
		}
		r.mu.Lock()
		r.calls = r.calls[:0]
		r.mu.Unlock()
		if len(n.textBuf) != 0 || cap(n.textBuf) > 1<<20 {
			t.Fatalf("text buffer grew to %d", cap(n.textBuf))
		}
	})
}
