package cluster

import (
	"crypto/rand"
	"encoding/binary"
	"testing"
	"time"
)

// forged is a message of size bytes that claims sender with a current time and a fresh sequence
// number: what someone without the secret can publish, its header and body made up.
func forged(sender, seq uint64, kind byte, size int) []byte {
	msg := make([]byte, size)
	rand.Read(msg)
	msg[0], msg[1], msg[2] = wireMagic, wireVersion, kind
	binary.BigEndian.PutUint64(msg[3:], sender)
	binary.BigEndian.PutUint64(msg[11:], seq)
	binary.BigEndian.PutUint64(msg[19:], uint64(time.Now().UnixNano()))
	return msg
}

// BenchmarkReceiveForged is the receiver's cost of one forged message that claims a live peer's
// id with a current time: the flood someone on the NATS server without the secret can send.
func BenchmarkReceiveForged(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		b.Run(byteSize(size), func(b *testing.B) {
			n, _ := newTestNode(b, testConfig())
			peer, _ := newTestNode(b, testConfig())
			n.receive(kindData, sealAs(peer, kindData, appendLoad(nil, nil)))
			msg := forged(peer.id, 1<<40, kindData, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				// A new sequence number and a current time each time, as a flood would send.
				binary.BigEndian.PutUint64(msg[11:], uint64(1<<40+i))
				binary.BigEndian.PutUint64(msg[19:], uint64(time.Now().UnixNano()))
				n.receive(kindData, msg)
			}
			b.StopTimer()
			if s := n.Stats(); s.DecisionsReceived+s.BindingsReceived != 0 || s.Rejected()+s.DroppedFlood < uint64(b.N) {
				b.Fatalf("forged messages not all rejected: %+v", s)
			}
		})
	}
}

// BenchmarkReceiveForgedUnknown: the same with a new, unknown sender id each time (a key to
// derive for every message).
func BenchmarkReceiveForgedUnknown(b *testing.B) {
	n, _ := newTestNode(b, testConfig())
	msg := forged(1, 1, kindData, 4<<10)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		binary.BigEndian.PutUint64(msg[3:], uint64(i)*2+3)
		binary.BigEndian.PutUint64(msg[19:], uint64(time.Now().UnixNano()))
		n.receive(kindData, msg)
	}
}

func byteSize(n int) string {
	if n >= 1<<20 {
		return itoa(n>>20) + "MiB"
	}
	return itoa(n>>10) + "KiB"
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}
