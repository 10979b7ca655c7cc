package kvroute

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// Responses follow-ups (OpenAI's Responses API): an engine that stored a response answers a
// follow-up naming it in previous_response_id, and only that engine has it. llm_feedback reads
// each answer's id and binds it to the engine that gave it; a follow-up goes there whatever
// balance says (Select, before the session step). The bindings live in a store like the
// sessions' (max_sessions bindings, session_ttl without use, least recently used out first),
// keyed by a keyed digest of the id, and are shared with cluster peers like session bindings.

// responseKeyPrefix marks a response binding on the cluster's wire: session keys are 32 hex
// digits (cluster.Node.SessionKey), a response key is this prefix and 32 hex digits.
const responseKeyPrefix = "r"

// responseKey is the key a response id is bound under: with a cluster, the digest every
// replica computes alike; without, a digest keyed by this process's random key. Ids never
// stay in memory as they came.
func (s *state) responseKey(id string) string {
	if n := s.node(); n != nil {
		return responseKeyPrefix + n.SessionKey("response\x00"+id)
	}
	h := sha256.New()
	h.Write(s.respSeed[:])
	h.Write([]byte(id))
	var sum [32]byte
	return responseKeyPrefix + hex.EncodeToString(h.Sum(sum[:0])[:16])
}

func newResponseSeed() (seed [32]byte) {
	_, _ = rand.Read(seed[:])
	return seed
}

// isResponseKey tells a response binding from a session binding among the peers' bindings.
func isResponseKey(key string) bool {
	return len(key) == len(responseKeyPrefix)+32 && key[:len(responseKeyPrefix)] == responseKeyPrefix
}

// bindResponse binds Responses id to the upstream that answered it, here and on the peers.
func (s *state) bindResponse(id, upstream string) {
	key := s.responseKey(id)
	at := s.responses.bind("", key, upstream, time.Now())
	if n := s.node(); n != nil {
		n.PublishBinding("", key, upstream, at)
	}
}

// followUp returns the candidate that stored the response a Responses follow-up names, or -1
// (no previous_response_id, an id no answer bound, an engine that is not a candidate now: the
// request routes as any other).
func (p *KVCacheAware) followUp(req *llmRequest, cands []candidate) int {
	if req.PreviousResponseID == "" {
		return -1
	}
	addr, ok := p.state.responses.get("", p.state.responseKey(req.PreviousResponseID), time.Now())
	if !ok {
		return -1
	}
	return indexOf(cands, addr)
}
