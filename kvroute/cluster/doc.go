// Package cluster lets several kvroute replicas share what they learn over NATS.
//
// A Node publishes what its replica decides (each decision's model, upstream and routing text,
// session bindings by a keyed digest of the session id, admin forget and reset) and its
// in-flight count per upstream, and hands what its peers publish to a Handler, which applies it
// exactly as a local decision. The package knows nothing of trees, sessions or the policy: the
// caller wires a Handler and a LoadSource to its own state.
//
// Nothing here ever blocks the caller: Publish* only enqueue into a bounded queue (a full queue
// drops and counts), a background goroutine batches, compresses, seals and publishes, and the
// connection is made and remade in the background, so that NATS being absent at start or lost
// later only means the replica routes on what it knows alone until NATS is back.
//
// On the wire, every message is sealed with AES-256-GCM under a key derived from the shared
// secret, the fleet name and the sender's random id, carries the sender's sequence number and
// time, and is rejected when it fails to open, is replayed or is too old. Each decision's text is
// compressed on its own, never together with another client's text, so that sizes on the wire
// leak nothing about other prompts. A replica that starts or reconnects asks its peers to replay
// their recent decisions (a bounded log each keeps of its own), so that it catches up within
// seconds.
package cluster
