package llmsim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
)

// Worker is a Server listening on a TCP address.
type Worker struct {
	*Server
	Addr string // host:port, as a reverse proxy dials it
	URL  string // http://host:port

	srv *http.Server
}

// StartWorker serves a new worker for cfg on addr ("127.0.0.1:0" picks a free port).
func StartWorker(addr string, cfg Config) (*Worker, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("worker %s: %w", cfg.Name, err)
	}
	w := &Worker{Server: New(cfg), Addr: ln.Addr().String()}
	w.advertise = w.Addr
	w.URL = "http://" + w.Addr
	w.srv = &http.Server{Handler: w.Server, ReadHeaderTimeout: 10 * time.Second}
	go w.srv.Serve(ln)
	return w, nil
}

// Close stops the worker, cutting the requests in flight.
func (w *Worker) Close() error { return w.srv.Close() }

// Shutdown stops the worker gracefully, waiting for the requests in flight until ctx ends.
func (w *Worker) Shutdown(ctx context.Context) error { return w.srv.Shutdown(ctx) }

// Fleet is a set of workers run in one process, for tests and the demo.
type Fleet struct {
	Workers []*Worker
}

// StartFleet starts n workers on 127.0.0.1, on ports basePort, basePort+1, ... (free ports
// when basePort is 0). Worker i is named cfg.Name-i ("worker-i" when cfg.Name is empty) and
// otherwise configured by cfg.
func StartFleet(n int, cfg Config, basePort int) (*Fleet, error) {
	if n < 1 {
		return nil, fmt.Errorf("fleet: need at least one worker, got %d", n)
	}
	prefix := cfg.Name
	if prefix == "" {
		prefix = "worker"
	}
	f := &Fleet{}
	for i := range n {
		c := cfg
		c.Name = prefix + "-" + strconv.Itoa(i)
		port := 0
		if basePort > 0 {
			port = basePort + i
		}
		w, err := StartWorker(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), c)
		if err != nil {
			f.Close()
			return nil, err
		}
		f.Workers = append(f.Workers, w)
	}
	return f, nil
}

// Addrs returns the workers' host:port addresses, in order.
func (f *Fleet) Addrs() []string {
	out := make([]string, len(f.Workers))
	for i, w := range f.Workers {
		out[i] = w.Addr
	}
	return out
}

// CapacityBlocks returns the prefix cache capacity of the whole fleet in blocks (0 when any
// worker's cache is unlimited).
func (f *Fleet) CapacityBlocks() int {
	total := 0
	for _, w := range f.Workers {
		c := w.Config().CapacityBlocks
		if c <= 0 {
			return 0
		}
		total += c
	}
	return total
}

// Reset resets every worker (see Server.Reset).
func (f *Fleet) Reset() {
	for _, w := range f.Workers {
		w.Reset()
	}
}

// Close stops every worker.
func (f *Fleet) Close() error {
	var errs []error
	for _, w := range f.Workers {
		errs = append(errs, w.Close())
	}
	return errors.Join(errs...)
}

// Shutdown stops every worker gracefully, waiting for requests in flight until ctx ends.
func (f *Fleet) Shutdown(ctx context.Context) error {
	var errs []error
	for _, w := range f.Workers {
		errs = append(errs, w.Shutdown(ctx))
	}
	return errors.Join(errs...)
}
