// Package ollamafleet runs Ollama instances side by side on loopback, each with its own home,
// models directory and port, and registers the tiny model (examples/ollama) with each: the
// fleet behind kvroute in the end-to-end test and in `./xcaddy.sh demo -fleet ollama`.
//
// The binary and the model come from KVROUTE_OLLAMA_BIN and KVROUTE_OLLAMA_MODEL (default:
// tiny.gguf beside the binary), which .ci/run sets after building them from examples/ollama.
package ollamafleet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Template renders a conversation for the tiny model: each message as <|role|> and its
// content on a line, then <|assistant|>. /api/generate's system and prompt come to it as a
// system and a user message, so both APIs render a conversation alike.
const Template = `{{- range .Messages }}<|{{ .Role }}|>{{ .Content }}
{{ end }}<|assistant|>`

// DefaultNumPredict bounds an answer whose request names no budget: a model of random weights
// practically never writes its end token.
const DefaultNumPredict = 16

// Binary returns the Ollama binary and the tiny model's GGUF from the environment; ok is false
// when KVROUTE_OLLAMA_BIN is unset.
func Binary() (bin, model string, ok bool) {
	bin = os.Getenv("KVROUTE_OLLAMA_BIN")
	if bin == "" {
		return "", "", false
	}
	model = os.Getenv("KVROUTE_OLLAMA_MODEL")
	if model == "" {
		model = filepath.Join(filepath.Dir(bin), "tiny.gguf")
	}
	return bin, model, true
}

// Config is how the instances run.
type Config struct {
	Bin   string // the ollama binary
	Model string // the tiny model's GGUF file
	Name  string // the name the model is registered under (default "tiny")
	// Parallel is OLLAMA_NUM_PARALLEL, the requests an instance runs at once (default 1).
	Parallel int
	// Context is the model's num_ctx per request (default 8192).
	Context int
	// Threads is the model's num_thread, the CPU threads an instance computes with (0: Ollama's
	// default, one per core): instances side by side share the cores.
	Threads int
	// SingleUserCache leaves OLLAMA_MULTIUSER_CACHE unset: one unrelated prompt then evicts a
	// slot's cached prefix. By default it is set, and a slot keeps its prefix across prompts.
	SingleUserCache bool
	// StartTimeout bounds an instance's start, its model's registration and load (default 2m).
	StartTimeout time.Duration
	// Dir holds the instances' homes and logs (default: a new temporary directory, removed by
	// Close).
	Dir string
}

// Fleet is a set of running instances.
type Fleet struct {
	cfg    Config
	ownDir bool
	Addrs  []string // host:port of each instance, in order
	mu     sync.Mutex
	procs  []*exec.Cmd
}

// Start starts n instances, registers the model with each and loads it (a first request).
func Start(ctx context.Context, cfg Config, n int) (*Fleet, error) {
	if cfg.Name == "" {
		cfg.Name = "tiny"
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 1
	}
	if cfg.Context <= 0 {
		cfg.Context = 8192
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 2 * time.Minute
	}
	f := &Fleet{cfg: cfg}
	if f.cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "kvroute-ollama-")
		if err != nil {
			return nil, err
		}
		f.cfg.Dir, f.ownDir = dir, true
	}
	ports, err := freePorts(n)
	if err != nil {
		f.Close()
		return nil, err
	}
	f.procs = make([]*exec.Cmd, n)
	for _, p := range ports {
		f.Addrs = append(f.Addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f.startOne(ctx, i, true) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Model is the name the model is registered under.
func (f *Fleet) Model() string { return f.cfg.Name }

// Log is instance i's log file.
func (f *Fleet) Log(i int) string { return filepath.Join(f.cfg.Dir, fmt.Sprintf("w%d.log", i)) }

func (f *Fleet) home(i int) string { return filepath.Join(f.cfg.Dir, fmt.Sprintf("w%d", i)) }

// startOne starts instance i; register also registers the model (a restart finds it on disk).
func (f *Fleet) startOne(ctx context.Context, i int, register bool) error {
	home := f.home(i)
	if err := os.MkdirAll(filepath.Join(home, "models"), 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(f.Log(i), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(f.cfg.Bin, "serve")
	cmd.Env = append(os.Environ(),
		"HOME="+home,
		"OLLAMA_MODELS="+filepath.Join(home, "models"),
		"OLLAMA_HOST="+f.Addrs[i],
		"OLLAMA_KEEP_ALIVE=-1",
		"OLLAMA_NUM_PARALLEL="+strconv.Itoa(f.cfg.Parallel),
		"OLLAMA_MAX_LOADED_MODELS=1",
		"OLLAMA_NOPRUNE=1",
	)
	if !f.cfg.SingleUserCache {
		cmd.Env = append(cmd.Env, "OLLAMA_MULTIUSER_CACHE=1")
	}
	// Its own process group: the runner it starts goes down with it (Kill, Close).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdout, cmd.Stderr = logf, logf
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return fmt.Errorf("starting %s: %w", f.cfg.Bin, err)
	}
	f.mu.Lock()
	f.procs[i] = cmd
	f.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, f.cfg.StartTimeout)
	defer cancel()
	base := "http://" + f.Addrs[i]
	if err := waitUp(ctx, base); err != nil {
		return fmt.Errorf("ollama w%d on %s: %w (log: %s)", i, f.Addrs[i], err, f.Log(i))
	}
	if register {
		if err := Register(ctx, base, f.cfg.Name, f.cfg.Model, f.cfg.Context, f.cfg.Threads); err != nil {
			return fmt.Errorf("ollama w%d: registering %s: %w (log: %s)", i, f.cfg.Model, err, f.Log(i))
		}
	}
	if err := Load(ctx, base, f.cfg.Name); err != nil {
		return fmt.Errorf("ollama w%d: loading %s: %w (log: %s)", i, f.cfg.Name, err, f.Log(i))
	}
	return nil
}

// waitUp waits until the server answers GET /.
func waitUp(ctx context.Context, base string) error {
	client := &http.Client{Timeout: time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/", nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not up: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Register uploads the GGUF file as a blob (POST /api/blobs/sha256:...) and creates the model
// from it (POST /api/create) with Template and the parameters num_ctx, num_predict and, when
// threads > 0, num_thread: what `ollama create NAME -f Modelfile` does, for a Modelfile of
//
//	FROM ./tiny.gguf
//	TEMPLATE """..."""
//	PARAMETER num_ctx 8192
//	PARAMETER num_predict 16
func Register(ctx context.Context, base, name, ggufPath string, numCtx, threads int) error {
	raw, err := os.ReadFile(ggufPath)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(raw)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if err := post(ctx, base+"/api/blobs/"+digest, "application/octet-stream", raw); err != nil {
		return fmt.Errorf("blob: %w", err)
	}
	params := map[string]any{"num_ctx": numCtx, "num_predict": DefaultNumPredict}
	if threads > 0 {
		params["num_thread"] = threads
	}
	body, _ := json.Marshal(map[string]any{
		"model":      name,
		"files":      map[string]string{filepath.Base(ggufPath): digest},
		"template":   Template,
		"parameters": params,
		"stream":     false,
	})
	if err := post(ctx, base+"/api/create", "application/json", body); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	return nil
}

// Load loads the model into memory with an empty /api/generate request (Ollama's own way).
func Load(ctx context.Context, base, name string) error {
	body, _ := json.Marshal(map[string]any{"model": name, "stream": false})
	return post(ctx, base+"/api/generate", "application/json", body)
}

func post(ctx context.Context, url, ct string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", ct)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, bytes.TrimSpace(out))
	}
	return nil
}

// Kill kills instance i and its runner, as a crash would: its requests fail, its port closes.
func (f *Fleet) Kill(i int) {
	f.mu.Lock()
	cmd := f.procs[i]
	f.procs[i] = nil
	f.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
}

// Restart kills instance i and starts it again on its port, with an empty cache; the model it
// registered is still on disk.
func (f *Fleet) Restart(ctx context.Context, i int) error {
	f.Kill(i)
	return f.startOne(ctx, i, false)
}

// Close stops every instance (SIGTERM to its group, SIGKILL after 5 s) and removes the
// directory it made.
func (f *Fleet) Close() error {
	f.mu.Lock()
	procs := append([]*exec.Cmd(nil), f.procs...)
	for i := range f.procs {
		f.procs[i] = nil
	}
	f.mu.Unlock()
	var wg sync.WaitGroup
	for _, cmd := range procs {
		if cmd == nil || cmd.Process == nil {
			continue
		}
		wg.Go(func() {
			pgid := -cmd.Process.Pid
			_ = syscall.Kill(pgid, syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				_ = syscall.Kill(pgid, syscall.SIGKILL)
				<-done
			}
			// The runner may outlive a server that stopped on SIGTERM.
			_ = syscall.Kill(pgid, syscall.SIGKILL)
		})
	}
	wg.Wait()
	if f.ownDir {
		return os.RemoveAll(f.cfg.Dir)
	}
	return nil
}

// freePorts returns n distinct free TCP ports on loopback.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// readTail returns the last n bytes of a file.
func readTail(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > n {
		if _, err := f.Seek(fi.Size()-n, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(f)
}
