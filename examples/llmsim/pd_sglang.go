package llmsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Protocols of prefill/decode disaggregation (Config.Protocol).
const (
	ProtocolVLLM   = ""       // vLLM's KV connector: kv_transfer_params (pd.go)
	ProtocolSGLang = "sglang" // SGLang's bootstrap: bootstrap_host, bootstrap_port, bootstrap_room
)

// DefaultBootstrapPort is SGLang's --disaggregation-bootstrap-port default.
const DefaultBootstrapPort = 8998

// DefaultBootstrapTimeout bounds how long a decode worker waits for the prefill of its room, and
// a prefill worker for a decode worker to take the room's KV (real time, not scaled by Speed).
const DefaultBootstrapTimeout = 10 * time.Second

// SGLang's bootstrap flow, simulated: the router sends one request, carrying a prefill worker's
// bootstrap address and a fresh room, to that prefill worker and to a decode worker at once. The
// prefill worker announces the room under its bootstrap address (host:port + room), computes
// the prompt, and waits for a decode worker to take the KV; the decode worker waits for the
// announced room's prefill, pays the transfer instead of a prefill, and generates. Rooms are
// single-use: a room announced or taken twice, a room no prefill worker of the fleet announces
// in time, a request without bootstrap fields, are refused, as SGLang's engines refuse them.

// room is one bootstrap room of the fleet's registry (Transfers).
type room struct {
	announced bool          // a prefill worker has the request
	claimed   bool          // a decode worker has the request
	prefilled chan struct{} // closed when the prefill worker's compute is done
	taken     chan struct{} // closed when the decode worker received the KV
	gone      chan struct{} // closed when either side gave up (timeout, client gone)
}

// maxUsedRooms bounds the rooms remembered as used, to refuse their reuse.
const maxUsedRooms = 1 << 16

var (
	errRoomReused  = errors.New("bootstrap room already used (rooms are single-use)")
	errRoomTimeout = errors.New("bootstrap room: no prefill worker of this fleet served it in time (unknown room or prefill lost)")
	errRoomNoTaker = errors.New("bootstrap room: no decode worker took the KV in time")
	errRoomGone    = errors.New("bootstrap room: the other side gave up")
)

// roomEntry returns key's entry, made if new; nil when the room was used already. t.mu held.
func (t *Transfers) roomEntry(key string) *room {
	if _, used := t.usedRooms[key]; used {
		return nil
	}
	e := t.rooms[key]
	if e == nil {
		e = &room{prefilled: make(chan struct{}), taken: make(chan struct{}), gone: make(chan struct{})}
		t.rooms[key] = e
	}
	return e
}

// retire forgets key's entry and remembers the room as used. t.mu held.
func (t *Transfers) retire(key string) {
	delete(t.rooms, key)
	if len(t.usedOrder) >= maxUsedRooms {
		delete(t.usedRooms, t.usedOrder[0])
		t.usedOrder = t.usedOrder[1:]
	}
	t.usedRooms[key] = struct{}{}
	t.usedOrder = append(t.usedOrder, key)
}

// abandon ends a room one side gives up on: the other side, waiting, fails.
func (t *Transfers) abandon(key string, e *room) {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-e.gone:
	default:
		close(e.gone)
	}
	if t.rooms[key] == e {
		t.retire(key)
	}
}

// announce registers a prefill worker's room.
func (t *Transfers) announce(key string) (*room, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.roomEntry(key)
	if e == nil || e.announced {
		return nil, errRoomReused
	}
	e.announced = true
	return e, nil
}

// claim registers a decode worker's room and waits, at most timeout, for its prefill.
func (t *Transfers) claim(ctx context.Context, key string, timeout time.Duration) (*room, error) {
	t.mu.Lock()
	e := t.roomEntry(key)
	if e == nil || e.claimed {
		t.mu.Unlock()
		return nil, errRoomReused
	}
	e.claimed = true
	t.mu.Unlock()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-e.prefilled:
		return e, nil
	case <-e.gone:
		return nil, errRoomGone
	case <-timer.C:
		t.abandon(key, e)
		return nil, errRoomTimeout
	case <-ctx.Done():
		t.abandon(key, e)
		return nil, ctx.Err()
	}
}

// handOver waits, at most timeout, for a decode worker to take a prefilled room's KV.
func (t *Transfers) handOver(ctx context.Context, key string, e *room, timeout time.Duration) error {
	close(e.prefilled)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-e.taken:
		return nil
	case <-e.gone:
		return errRoomGone
	case <-timer.C:
		t.abandon(key, e)
		return errRoomNoTaker
	case <-ctx.Done():
		t.abandon(key, e)
		return ctx.Err()
	}
}

// took marks a claimed room's KV received: its prefill worker answers, the room is used.
func (t *Transfers) took(key string, e *room) {
	t.mu.Lock()
	defer t.mu.Unlock()
	close(e.taken)
	if t.rooms[key] == e {
		t.retire(key)
	}
}

// pendingRooms is the rooms announced or claimed and not yet done. t.mu held.
func (t *Transfers) pendingRooms() int { return len(t.rooms) }

// bootstrap is a request's SGLang bootstrap fields.
type bootstrap struct {
	host string
	port int
	room uint64
}

func (b *bootstrap) key() string {
	return net.JoinHostPort(strings.Trim(b.host, "[]"), strconv.Itoa(b.port)) + "/" + strconv.FormatUint(b.room, 10)
}

// parseBootstrap reads the bootstrap fields of a request: nil when it has none; an error when
// they are incomplete, malformed, or lists (a batch: not simulated).
func parseBootstrap(host, port, roomNum json.RawMessage) (*bootstrap, error) {
	if isAbsent(host) && isAbsent(port) && isAbsent(roomNum) {
		return nil, nil
	}
	if (len(host) > 0 && host[0] == '[') || (len(roomNum) > 0 && roomNum[0] == '[') {
		return nil, errors.New("bootstrap fields as lists (a batch) are not simulated")
	}
	var b bootstrap
	if json.Unmarshal(host, &b.host) != nil || b.host == "" {
		return nil, errors.New("bootstrap_host must be a host")
	}
	if json.Unmarshal(port, &b.port) != nil || b.port < 1 || b.port > 65535 {
		return nil, errors.New("bootstrap_port must be a port")
	}
	r, err := strconv.ParseUint(string(roomNum), 10, 63)
	if err != nil {
		return nil, errors.New("bootstrap_room must be an integer in [0, 2^63-1]")
	}
	b.room = r
	return &b, nil
}

func isAbsent(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// bootstrapAddr is the host:port a prefill worker's room is announced under.
func (s *Server) bootstrapAddr() string {
	if s.cfg.BootstrapAddr != "" {
		return s.cfg.BootstrapAddr
	}
	host := "127.0.0.1"
	if h, _, err := net.SplitHostPort(s.advertise); err == nil {
		host = h
	}
	return net.JoinHostPort(host, strconv.Itoa(DefaultBootstrapPort))
}

// checkSGLang admits a request under protocol sglang: prefill and decode workers take only
// requests with bootstrap data, and a prefill worker only the rooms addressed to it.
func (s *Server) checkSGLang(j job) error {
	if j.bootErr != nil {
		return j.bootErr
	}
	if j.boot == nil {
		return fmt.Errorf("an SGLang %s server needs bootstrap_host, bootstrap_port and bootstrap_room", s.cfg.Role)
	}
	if s.cfg.Role == RolePrefill {
		want := s.bootstrapAddr()
		if got := net.JoinHostPort(strings.Trim(j.boot.host, "[]"), strconv.Itoa(j.boot.port)); got != want {
			return fmt.Errorf("bootstrap address %s is not this prefill worker's (%s)", got, want)
		}
	}
	return nil
}
