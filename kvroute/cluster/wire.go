package cluster

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"unicode/utf8"
)

// A message on the wire is a clear header, authenticated as GCM's additional data, followed by
// the sealed records:
//
//	magic 'k' | version | kind | sender id (8) | sequence (8) | unix nanos (8) | header tag (16) | ciphertext+tag
//
// The key is derived from the secret, the fleet name and the sender id, and the nonce is the
// sequence number, so a (key, nonce) pair never repeats without a sender reusing its random id.
//
// The header tag (version 3) is a GCM tag over the clear header and the recipient alone, under
// the same key with a nonce of its own (headerNonce), so that a receiver tells a forged message
// from a peer's at a cost that does not grow with the message: someone without the secret who
// claims a live peer's id and a current time is turned away before the payload is decrypted
// or a buffer for it allocated.
//
// Version 2 added a binding's time to its record and the origin record of catch-up replies;
// version 3 the header tag. A node sends version 3 and reads all three: a version 1 or 2
// message (a peer not upgraded yet) carries no header tag, so opening one costs the whole
// payload, and those are opened within a byte budget shared by all senders (legacyRate); a
// version 1 message is decoded with version 1's records (see decodeRecords). An older node
// drops a newer message as malformed, so during a rolling upgrade the old replicas route on
// what they know alone, as with NATS down.
const (
	wireMagic   = 'k'
	wireVersion = 3
	// wireVersionMin is the oldest version still read.
	wireVersionMin = 1
	// headerTagVersion is the first version with a header tag.
	headerTagVersion = 3
	headerLen        = 3 + 8 + 8 + 8
	tagLen           = 16
	// overhead is what a message adds to its records.
	overhead = headerLen + tagLen + tagLen
	// overheadLegacy is what a version 1 or 2 message adds (no header tag).
	overheadLegacy = headerLen + tagLen
	// maxMessage caps what is even looked at, whatever the server's max_payload.
	maxMessage = 64 << 20
)

// Message kinds; the receiver checks a kind against the subject it arrived on.
const (
	kindData     = 1 // broadcast on kvroute.<name>.data
	kindSyncReq  = 2 // broadcast on kvroute.<name>.sync
	kindSyncData = 3 // to one node on kvroute.<name>.to.<id>
)

// Record types inside a message.
const (
	recDecision = 1
	recBinding  = 2
	recForget   = 3
	recReset    = 4
	recLoad     = 5
	recSyncReq  = 6
	recFragment = 7
	// recOrigin (version 2, catch-up replies only) says that the records after it, up to the
	// next origin record or the end of the record list, were first published in the sender's
	// message of that sequence number, so that a receiver that had that message live applies
	// them once.
	recOrigin = 8
)

// Text encodings inside a decision record.
const (
	textRaw = 0
	// textS2 is S2 block compression (klauspost/compress/s2): about 8 times less CPU than
	// zstd's fastest level on a chat turn of 2.5 KB, for about a quarter more bytes. The
	// flusher compresses every decision, so its CPU is the cluster's cost per request.
	textS2 = 1
)

// Bounds on decoded fields: an authenticated peer is trusted with routing, not with memory.
const (
	maxField     = 4096 // model, upstream, session key
	maxUpstreams = 4096 // entries of one load record
	maxLoad      = 1 << 40
)

var (
	errTruncated = errors.New("truncated")
	errMalformed = errors.New("malformed")
)

// keys holds what every node derives from the secret.
type keys struct {
	seal    []byte // HMAC key from which each sender's AES key is derived
	session []byte // HMAC key of session ids
}

func deriveKeys(secret, name string) (keys, error) {
	seal, err := hkdf.Key(sha256.New, []byte(secret), []byte("kvroute/cluster/v1"), "seal "+name, 32)
	if err != nil {
		return keys{}, fmt.Errorf("deriving the seal key: %w", err)
	}
	sess, err := hkdf.Key(sha256.New, []byte(secret), []byte("kvroute/cluster/v1"), "session "+name, 32)
	if err != nil {
		return keys{}, fmt.Errorf("deriving the session key: %w", err)
	}
	return keys{seal: seal, session: sess}, nil
}

// aeadFor returns the AES-256-GCM of one sender.
func (k keys) aeadFor(sender uint64) (cipher.AEAD, error) {
	return aeadWith(hmac.New(sha256.New, k.seal), new([sha256.Size]byte), sender)
}

// aeadWith is aeadFor with the HMAC of the seal key (reset here) and a buffer for the key, so
// that the receiver, which derives a key for every sender id it has not authenticated yet,
// reuses them. The key is a function of the secret, the fleet name and the sender id alone, so
// one derived for a sender serves all its messages (the peer table keeps it).
func aeadWith(m hash.Hash, key *[sha256.Size]byte, sender uint64) (cipher.AEAD, error) {
	m.Reset()
	var id [8]byte
	binary.BigEndian.PutUint64(id[:], sender)
	m.Write(id[:])
	block, err := aes.NewCipher(m.Sum(key[:0]))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// header is a message's clear part, plus its recipient.
type header struct {
	// version is what the message was sealed as; seal writes wireVersion when it is 0.
	version byte
	kind    byte
	sender  uint64
	seq     uint64
	nanos   int64
	// to is the recipient of a catch-up reply (0 otherwise). It is not sent: the subject
	// names it and both sides authenticate it, so that a reply captured on the wire cannot be
	// replayed to another node.
	to uint64
}

// additionalData is what GCM authenticates besides the ciphertext: the clear header and the
// recipient.
func additionalData(clear []byte, to uint64) []byte {
	ad := make([]byte, 0, headerLen+8)
	ad = append(ad, clear[:headerLen]...)
	return binary.BigEndian.AppendUint64(ad, to)
}

func nonceOf(seq uint64) []byte {
	var n [12]byte
	binary.BigEndian.PutUint64(n[4:], seq)
	return n[:]
}

// headerNonce is the nonce of a header tag: the payload's nonce with its first byte set, so
// that under one sender's key no header nonce is ever a payload nonce.
func headerNonce(n *[12]byte, seq uint64) []byte {
	*n = [12]byte{0: 1}
	binary.BigEndian.PutUint64(n[4:], seq)
	return n[:]
}

// seal appends the message of h and plain to dst.
func seal(dst []byte, aead cipher.AEAD, h header, plain []byte) []byte {
	start := len(dst)
	v := h.version
	if v == 0 {
		v = wireVersion
	}
	dst = append(dst, wireMagic, v, h.kind)
	dst = binary.BigEndian.AppendUint64(dst, h.sender)
	dst = binary.BigEndian.AppendUint64(dst, h.seq)
	dst = binary.BigEndian.AppendUint64(dst, uint64(h.nanos))
	ad := additionalData(dst[start:], h.to)
	if v >= headerTagVersion {
		var hn [12]byte
		dst = aead.Seal(dst, headerNonce(&hn, h.seq), nil, ad)
	}
	return aead.Seal(dst, nonceOf(h.seq), plain, ad)
}

// scratch is what checking a header needs, kept by the receiver so that turning a forged
// message away allocates nothing.
type scratch struct {
	nonce [12]byte
	ad    [headerLen + 8]byte
	mac   hash.Hash // HMAC of the seal key, for aeadWith; nil until first needed
	key   [sha256.Size]byte
}

// headerOK reports whether msg's header tag is the sender's: whether msg (version 3 or later,
// its header h parsed) was sealed by the holder of the key of aead, for h.to. It costs one GCM
// tag over 35 bytes, whatever the message's size.
func headerOK(s *scratch, aead cipher.AEAD, h header, msg []byte) bool {
	copy(s.ad[:headerLen], msg)
	binary.BigEndian.PutUint64(s.ad[headerLen:], h.to)
	_, err := aead.Open(nil, headerNonce(&s.nonce, h.seq), msg[headerLen:headerLen+tagLen], s.ad[:])
	return err == nil
}

// payloadOffset is where the ciphertext of a message of version v starts.
func payloadOffset(v byte) int {
	if v >= headerTagVersion {
		return headerLen + tagLen
	}
	return headerLen
}

// parseHeader reads a message's clear header without trusting any of it.
func parseHeader(msg []byte) (header, error) {
	if len(msg) < overheadLegacy {
		return header{}, errTruncated
	}
	if len(msg) > maxMessage {
		return header{}, fmt.Errorf("%d bytes: %w", len(msg), errMalformed)
	}
	if msg[0] != wireMagic || msg[1] < wireVersionMin || msg[1] > wireVersion {
		return header{}, fmt.Errorf("magic or version: %w", errMalformed)
	}
	if msg[1] >= headerTagVersion && len(msg) < overhead {
		return header{}, errTruncated
	}
	return header{
		version: msg[1],
		kind:    msg[2],
		sender:  binary.BigEndian.Uint64(msg[3:]),
		seq:     binary.BigEndian.Uint64(msg[11:]),
		nanos:   int64(binary.BigEndian.Uint64(msg[19:])),
	}, nil
}

// open authenticates and decrypts msg, whose header is h, into dst. It does not check a header
// tag (headerOK does, first).
func open(dst []byte, aead cipher.AEAD, h header, msg []byte) ([]byte, error) {
	return aead.Open(dst, nonceOf(h.seq), msg[payloadOffset(h.version):], additionalData(msg, h.to))
}

// Record encoding. Strings are a uvarint length and bytes; integers are varints.

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// reader decodes records and never reads past its buffer nor allocates more than it holds.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.fail(errTruncated)
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(errTruncated)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail(errTruncated)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) u64() uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 8 {
		r.fail(errTruncated)
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

// bytes returns the next n bytes, aliasing the buffer.
func (r *reader) bytes(max int) []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(max) {
		r.fail(fmt.Errorf("field of %d bytes, at most %d: %w", n, max, errMalformed))
		return nil
	}
	if n > uint64(len(r.b)) {
		r.fail(errTruncated)
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// str returns a field as a string; names must be valid UTF-8 (they end up in logs and JSON).
func (r *reader) str() string {
	b := r.bytes(maxField)
	if r.err != nil {
		return ""
	}
	if !utf8.Valid(b) {
		r.fail(fmt.Errorf("field is not UTF-8: %w", errMalformed))
		return ""
	}
	return string(b)
}

// record is one decoded record. Text holds a decision's text as it was sent (compressed or
// not); the receiver decodes it with its bounded decoder.
type record struct {
	typ        byte
	model      string
	upstream   string
	sessionKey string
	// at is when a binding was made, by the sender's clock, in unix nanoseconds (0 in a
	// version 1 record: unknown).
	at int64
	// origin is an origin record's sequence number.
	origin  uint64
	textEnc byte
	textLen int // decoded length
	text    []byte
	loads   []peerCount
	seen    []seenSeq
	first   bool
	lost    bool // sync request: the requester dropped what it published before connecting
	frag    fragment
	reading EngineReading // recReading (reading.go)
	learned EngineLearned // recLearned (learned.go)
}

type peerCount struct {
	upstream string
	n        int64
}

type seenSeq struct {
	peer uint64
	seq  uint64
}

type fragment struct {
	id, index, total uint64
	chunk            []byte
}

func appendDecision(b []byte, model, upstream string, enc byte, textLen int, text []byte) []byte {
	b = append(b, recDecision)
	b = appendString(b, model)
	b = appendString(b, upstream)
	b = append(b, enc)
	b = binary.AppendUvarint(b, uint64(textLen))
	b = binary.AppendUvarint(b, uint64(len(text)))
	return append(b, text...)
}

// appendBinding appends a version 2 binding record: at is when the binding was made (unix
// nanoseconds, sender's clock).
func appendBinding(b []byte, model, sessionKey, upstream string, at int64) []byte {
	b = append(b, recBinding)
	b = appendString(b, model)
	b = appendString(b, sessionKey)
	b = appendString(b, upstream)
	return binary.AppendVarint(b, at)
}

// appendOrigin appends an origin record (catch-up replies only).
func appendOrigin(b []byte, seq uint64) []byte {
	return binary.AppendUvarint(append(b, recOrigin), seq)
}

func appendForget(b []byte, sessionKey string) []byte {
	return appendString(append(b, recForget), sessionKey)
}

func appendReset(b []byte) []byte { return append(b, recReset) }

func appendLoad(b []byte, loads []peerCount) []byte {
	b = append(b, recLoad)
	b = binary.AppendUvarint(b, uint64(len(loads)))
	for _, l := range loads {
		b = appendString(b, l.upstream)
		b = binary.AppendVarint(b, l.n)
	}
	return b
}

// appendSyncReq: first says the requester has just started, so peers know they will hear all
// it publishes from now on.
func appendSyncReq(b []byte, first bool, seen []seenSeq) []byte {
	return appendSyncRequest(b, first, false, seen)
}

// appendSyncRequest is appendSyncReq with lost: the requester has just started and dropped what
// it published before its first connection was up, so peers should ask it for its log (a
// receiver that predates the flag ignores it).
func appendSyncRequest(b []byte, first, lost bool, seen []seenSeq) []byte {
	flags := byte(0)
	if first {
		flags = 1
	}
	if lost {
		flags |= 2
	}
	b = append(b, recSyncReq, flags)
	b = binary.AppendUvarint(b, uint64(len(seen)))
	for _, s := range seen {
		b = binary.BigEndian.AppendUint64(b, s.peer)
		b = binary.BigEndian.AppendUint64(b, s.seq)
	}
	return b
}

func appendFragment(b []byte, f fragment) []byte {
	b = append(b, recFragment)
	b = binary.AppendUvarint(b, f.id)
	b = binary.AppendUvarint(b, f.index)
	b = binary.AppendUvarint(b, f.total)
	b = binary.AppendUvarint(b, uint64(len(f.chunk)))
	return append(b, f.chunk...)
}

// decodeRecords calls fn for every record of plain, in order, and stops at the first malformed
// one (the records before it were authenticated, so applying them is safe). maxText bounds a
// decision's decoded text; version is the message's (a version 1 binding has no time, a
// version 1 message no origin record).
func decodeRecords(plain []byte, version byte, maxText int, fn func(*record)) error {
	r := reader{b: plain}
	var rec record
	for len(r.b) > 0 {
		rec = record{typ: r.byte()}
		switch rec.typ {
		case recDecision:
			rec.model = r.str()
			rec.upstream = r.str()
			rec.textEnc = r.byte()
			n := r.uvarint()
			if r.err == nil && n > uint64(maxText) {
				r.fail(fmt.Errorf("text of %d bytes, at most %d: %w", n, maxText, errMalformed))
			}
			rec.textLen = int(n)
			rec.text = r.bytes(maxText + maxText/8 + 64)
			if r.err == nil && rec.textEnc != textRaw && rec.textEnc != textS2 {
				r.fail(fmt.Errorf("text encoding %d: %w", rec.textEnc, errMalformed))
			}
			if r.err == nil && rec.textEnc == textRaw && len(rec.text) != rec.textLen {
				r.fail(fmt.Errorf("raw text length: %w", errMalformed))
			}
		case recBinding:
			rec.model = r.str()
			rec.sessionKey = r.str()
			rec.upstream = r.str()
			if version >= 2 {
				rec.at = r.varint()
				if r.err == nil && rec.at <= 0 {
					r.fail(fmt.Errorf("binding time %d: %w", rec.at, errMalformed))
				}
			}
		case recOrigin:
			if version < 2 {
				r.fail(fmt.Errorf("origin record in a version %d message: %w", version, errMalformed))
			}
			rec.origin = r.uvarint()
			if r.err == nil && rec.origin == 0 {
				r.fail(fmt.Errorf("origin 0: %w", errMalformed))
			}
		case recForget:
			rec.sessionKey = r.str()
		case recReset:
		case recLoad, recPrefill, recTokens:
			n := r.uvarint()
			if r.err == nil && n > maxUpstreams {
				r.fail(fmt.Errorf("%d upstreams in a load record: %w", n, errMalformed))
			}
			for i := uint64(0); i < n && r.err == nil; i++ {
				u := r.str()
				c := r.varint()
				if r.err == nil && (c < 0 || c > maxLoad) {
					r.fail(fmt.Errorf("load %d: %w", c, errMalformed))
				}
				rec.loads = append(rec.loads, peerCount{u, c})
			}
		case recSyncReq:
			flags := r.byte()
			rec.first, rec.lost = flags&1 != 0, flags&2 != 0
			n := r.uvarint()
			// Each entry takes 16 bytes, so a count larger than what is left is a lie.
			if r.err == nil && n > uint64(len(r.b)/16) {
				r.fail(errTruncated)
			}
			for i := uint64(0); i < n && r.err == nil; i++ {
				rec.seen = append(rec.seen, seenSeq{r.u64(), r.u64()})
			}
		case recFragment:
			rec.frag.id = r.uvarint()
			rec.frag.index = r.uvarint()
			rec.frag.total = r.uvarint()
			rec.frag.chunk = r.bytes(maxMessage)
			if r.err == nil && (rec.frag.total < 2 || rec.frag.index >= rec.frag.total) {
				r.fail(fmt.Errorf("fragment %d of %d: %w", rec.frag.index, rec.frag.total, errMalformed))
			}
		case recReading:
			decodeReading(&r, &rec)
		case recLearned:
			decodeLearned(&r, &rec)
		default:
			r.fail(fmt.Errorf("record type %d: %w", rec.typ, errMalformed))
		}
		if r.err != nil {
			return r.err
		}
		fn(&rec)
	}
	return nil
}
