package clustertest

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// natsServer is a NATS server on 127.0.0.1 that a test can stop and start again on the same
// port.
type natsServer struct {
	t    testing.TB
	opts server.Options
	srv  *server.Server
}

func startNATS(t testing.TB, mod func(*server.Options)) *natsServer {
	t.Helper()
	s := &natsServer{t: t, opts: server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true}}
	if mod != nil {
		mod(&s.opts)
	}
	s.start()
	// Keep the port for restarts.
	s.opts.Port = s.srv.Addr().(*net.TCPAddr).Port
	t.Cleanup(s.stop)
	return s
}

func (s *natsServer) start() {
	s.t.Helper()
	opts := s.opts
	srv, err := server.NewServer(&opts)
	if err != nil {
		s.t.Fatalf("nats server: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(5 * time.Second) {
		s.t.Fatal("nats server not ready in 5s")
	}
	s.srv = srv
}

func (s *natsServer) stop() {
	if s.srv != nil {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
		s.srv = nil
	}
}

func (s *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.opts.Port) }
