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
// seconds. A reply names, for its records, the message each was first published in, so that a
// record heard both live and in a reply (after a NATS restart, say) is applied once. A binding
// carries when it was made, by its sender's clock, and the Handler keeps the latest of a
// session's bindings (BindingNewer) whatever order live messages and replies bring them in.
//
// # Threat model
//
// Anyone who can publish or subscribe on the NATS server (NATS's own auth, creds and TLS decide
// who can) but does not hold the secret can neither read prompts or session ids, nor make a
// replica apply anything of its own: a message's clear header has a tag of its own, checked
// before the payload, so a forged message (even one claiming a live peer's id and a current
// time) costs one GCM tag over 35 bytes and no allocation, and is counted. Replays are refused
// by sequence number, by time (replay_window; replicas' clocks must agree within it), and, for
// a node that joined after a message was sealed (joinSkew allowed), by its join time: a joiner
// learns history only from catch-up replies bound to its id. What a replay can still do is
// deliver once, within replay_window, a message a node never heard while connected (sealed
// in the second before it joined, or while it was disconnected). Such a party still sees
// message sizes and timing, hence the rate of decisions and each decision's compressed size
// (compression never spans two decisions, so a size depends on one client's prompt alone), can
// drop messages if it controls the server, and can fill NATS's pending limits (dropped_slow).
// Version 1 and 2 messages (no header tag) are opened within a byte budget shared by all
// senders (legacyRate). A replica that holds the secret is trusted with routing (it can steer
// decisions, as its own requests could) but not with memory: every field, record, peer table,
// fragment and catch-up log is bounded, and one peer's messages are rate limited (peer_rate).
package cluster
