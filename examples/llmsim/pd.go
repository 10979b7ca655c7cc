package llmsim

import (
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
)

// Roles of a worker in prefill/decode disaggregation (vLLM's KV connector flow).
const (
	RoleAggregated = ""        // serves every request whole; ignores transfer parameters
	RolePrefill    = "prefill" // a request with kv_transfer_params.do_remote_decode is prefilled and handed over
	RoleDecode     = "decode"  // a request with kv_transfer_params.do_remote_prefill must name a transfer a prefill served
)

// DefaultTransferPerToken is the time a decode worker spends receiving one prompt token's KV
// from a prefill worker (RDMA-class links move KV about ten times faster than a GPU prefills it).
const DefaultTransferPerToken = 5e3 // nanoseconds

// Transfers is the registry of KV transfers a fleet's prefill workers served and its decode
// workers have not yet taken: each is single-use, as vLLM's NixlConnector blocks are. Share one
// between the prefill and decode workers of a fleet (Config.Transfers).
//
// Under protocol sglang it is the fleet's bootstrap registry: rooms announced by prefill workers
// and claimed by decode workers (pd_sglang.go); Served counts rooms whose KV was handed over,
// Taken the decode workers that received it, Refused the requests refused for their room.
type Transfers struct {
	mu        sync.Mutex
	pending   map[string]transfer
	rooms     map[string]*room
	usedRooms map[string]struct{}
	usedOrder []string
	seq       atomic.Uint64

	Served   atomic.Uint64 // transfers handed out by prefill workers
	Taken    atomic.Uint64 // transfers a decode worker took
	Refused  atomic.Uint64 // decode requests naming no pending transfer
	Prefills atomic.Uint64 // prefill legs served
}

type transfer struct {
	engine string
	tokens int
}

// NewTransfers returns an empty registry.
func NewTransfers() *Transfers {
	return &Transfers{pending: make(map[string]transfer), rooms: make(map[string]*room), usedRooms: make(map[string]struct{})}
}

// Pending returns the transfers served and not yet taken, and the bootstrap rooms not yet done.
func (t *Transfers) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending) + t.pendingRooms()
}

func (t *Transfers) put(engine string, tokens int) string {
	id := engine + "/" + strconv.FormatUint(t.seq.Add(1), 10)
	t.mu.Lock()
	t.pending[id] = transfer{engine: engine, tokens: tokens}
	t.mu.Unlock()
	t.Served.Add(1)
	return id
}

func (t *Transfers) take(id, engine string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	tr, ok := t.pending[id]
	if !ok || tr.engine != engine {
		return false
	}
	delete(t.pending, id)
	return true
}

// kvParams is vLLM's kv_transfer_params, as the NixlConnector reads and writes them.
type kvParams struct {
	DoRemoteDecode  bool     `json:"do_remote_decode"`
	DoRemotePrefill bool     `json:"do_remote_prefill"`
	RemoteEngineID  *string  `json:"remote_engine_id"`
	RemoteBlockIDs  []string `json:"remote_block_ids"`
	RemoteHost      *string  `json:"remote_host"`
	RemotePort      *int     `json:"remote_port"`
	TPSize          int      `json:"tp_size,omitempty"`
}

var errUnknownTransfer = errors.New("kv_transfer_params name no KV transfer a prefill worker of this fleet served (unknown, reused or forged)")

// prefillAnswer is the kv_transfer_params a prefill worker answers: a fresh single-use transfer.
func (s *Server) prefillAnswer(tokens int) json.RawMessage {
	id := s.cfg.Transfers.put(s.cfg.Name, tokens)
	host, port := "127.0.0.1", 0
	if h, p, err := net.SplitHostPort(s.advertise); err == nil {
		host = h
		port, _ = strconv.Atoi(p)
	}
	name := s.cfg.Name
	b, _ := json.Marshal(kvParams{DoRemotePrefill: true, RemoteEngineID: &name, RemoteBlockIDs: []string{id}, RemoteHost: &host, RemotePort: &port, TPSize: 1})
	return b
}

// takeTransfer checks a decode request's transfer parameters against the fleet's registry.
func (s *Server) takeTransfer(kv *kvParams) error {
	if s.cfg.Transfers == nil || len(kv.RemoteBlockIDs) != 1 || kv.RemoteEngineID == nil {
		return errUnknownTransfer
	}
	if !s.cfg.Transfers.take(kv.RemoteBlockIDs[0], *kv.RemoteEngineID) {
		s.cfg.Transfers.Refused.Add(1)
		return errUnknownTransfer
	}
	s.cfg.Transfers.Taken.Add(1)
	return nil
}
