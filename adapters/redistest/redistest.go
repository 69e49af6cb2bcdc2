// Package redistest gives tests a real Redis server: REDIS_URL when it is set, otherwise a private
// redis-server on a free port that the test owns (so kill and restart tests hurt nothing else).
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Env is what a test needs to talk to Redis without stepping on other tests.
type Env struct {
	URL    string
	Prefix string // key prefix unique to this test; use it as the application's key namespace
}

var seq atomic.Int64

// Open returns the shared REDIS_URL (with a per-test key prefix) or a private server.
func Open(t testing.TB) Env {
	t.Helper()
	prefix := fmt.Sprintf("t%d-%d", os.Getpid(), seq.Add(1))
	if u := os.Getenv("REDIS_URL"); u != "" {
		return Env{URL: u, Prefix: prefix}
	}
	if !Available() {
		t.Fatalf("redistest: redis-server not found in PATH; install Redis 7 (apt-get install redis-server) or set REDIS_URL")
	}
	s := Start(t, Options{})
	return Env{URL: s.URL(), Prefix: prefix}
}

// Client returns a go-redis client for url, closed when the test ends.
func Client(t testing.TB, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("redistest: parse %q: %v", url, err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Options configure a private server.
type Options struct {
	AppendOnly bool     // AOF on, appendfsync as given (default "always")
	FSync      string   // appendfsync policy
	Args       []string // more redis-server arguments ("--maxmemory", "10mb")
	Env        []string // more environment ("LC_ALL=en_US.UTF-8")
	// TLS, when set, makes the server speak TLS only (URL is rediss://), requiring a client
	// certificate signed by the files' CA.
	TLS *TLSFiles
}

// Server is a private redis-server process.
type Server struct {
	t    testing.TB
	port int
	dir  string
	opts Options
	cmd  *exec.Cmd
	// restarts counts Restart calls: a restarted server must come back on the same port.
	restarts int
}

// Available reports whether a redis-server binary can be started.
func Available() bool {
	_, err := exec.LookPath("redis-server")
	return err == nil
}

// Start launches a private redis-server; it is killed when the test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	if !Available() {
		// Start is a server of the test's own (to kill, restart or configure it): REDIS_URL
		// does not stand in for it, as it does for Open.
		t.Fatalf("redistest: redis-server not found in PATH; this test starts a server of its own (REDIS_URL serves only the tests that share one): install Redis 7 (apt-get install redis-server)")
	}
	s := &Server{t: t, port: freePort(t), dir: t.TempDir(), opts: opts}
	s.start()
	t.Cleanup(s.Kill)
	return s
}

// URL is the redis:// address of the server (rediss:// with TLS).
func (s *Server) URL() string {
	if s.opts.TLS != nil {
		return fmt.Sprintf("rediss://127.0.0.1:%d/0", s.port)
	}
	return fmt.Sprintf("redis://127.0.0.1:%d/0", s.port)
}

// Addr is host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *Server) start() {
	s.t.Helper()
	args := []string{"--port", strconv.Itoa(s.port)}
	if s.opts.TLS != nil {
		args = s.opts.TLS.serverArgs(s.port)
	}
	args = append(args, "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--daemonize", "no", "--logfile", filepath.Join(s.dir, "redis.log"))
	if s.opts.AppendOnly {
		fsync := s.opts.FSync
		if fsync == "" {
			fsync = "always"
		}
		args = append(args, "--appendonly", "yes", "--appendfsync", fsync)
	} else {
		args = append(args, "--appendonly", "no")
	}
	if s.restarts == 0 {
		_ = os.Remove(filepath.Join(s.dir, "redis.log")) // judge this attempt by its own log
	}
	args = append(args, s.opts.Args...)
	cmd := exec.Command("redis-server", args...) // #nosec G204 -- a test helper: arguments from the test's own options
	if len(s.opts.Env) > 0 {
		cmd.Env = append(os.Environ(), s.opts.Env...)
	}
	// Started from the spawner's thread with Pdeathsig, as the cluster's nodes are: a test
	// binary that ends in a panic or a timeout (no cleanup runs) takes its servers with it. Two
	// servers left by a timed-out run kept about 10% of a core busy here for an hour.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var err error
	started := make(chan struct{})
	spawner() <- func() { defer close(started); err = cmd.Start() }
	<-started
	if err != nil {
		s.t.Fatalf("redistest: start redis-server: %v", err)
	}
	s.cmd = cmd
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, TLSConfig: s.opts.TLS.clientConfig()})
		err := c.Ping(context.Background()).Err()
		_ = c.Close()
		if err == nil {
			return
		}
		log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
		select {
		case <-exited:
			// Another test may have taken the free port between our probe and redis-server's
			// bind; a first start may move to a new port, a restart must keep its own.
			if s.restarts == 0 && strings.Contains(string(log), "Address already in use") {
				s.port = freePort(s.t)
				s.start()
				return
			}
			s.t.Fatalf("redistest: redis-server on %d exited at start:\n%s", s.port, log)
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: redis-server on %d did not answer: %v\n%s", s.port, err, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Kill stops the server at once (SIGKILL), like a crash.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	s.waitGone()
	s.cmd = nil
}

// Stop shuts the server down cleanly (SIGTERM), which flushes AOF.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	s.waitGone()
	s.cmd = nil
}

// Restart starts the server again on the same port and data directory.
func (s *Server) Restart() {
	s.t.Helper()
	s.restarts++
	s.start()
}

func (s *Server) waitGone() {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		conn, err := net.DialTimeout("tcp", s.Addr(), 50*time.Millisecond)
		if err != nil {
			return
		}
		_ = conn.Close()
		time.Sleep(10 * time.Millisecond)
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: free port: %v", err)
	}
	defer l.Close()
	addr := l.Addr().String()
	p, _ := strconv.Atoi(addr[strings.LastIndex(addr, ":")+1:])
	return p
}

// Signal sends sig to the server process (SIGSTOP/SIGCONT simulate a hung Redis).
func (s *Server) Signal(sig syscall.Signal) error {
	if s.cmd == nil || s.cmd.Process == nil {
		return fmt.Errorf("redistest: server on %d is not running", s.port)
	}
	return s.cmd.Process.Signal(sig)
}

// CommandCalls is how many times the server ran cmd (lower case, e.g. "set"), from INFO
// commandstats: a test can see a client polling without hooking into it.
func CommandCalls(t testing.TB, c *redis.Client, cmd string) int {
	t.Helper()
	info, err := c.InfoMap(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("redistest: INFO commandstats: %v", err)
	}
	stats := info["Commandstats"]["cmdstat_"+cmd] // calls=N,usec=...
	for _, kv := range strings.Split(stats, ",") {
		if v, ok := strings.CutPrefix(kv, "calls="); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("redistest: cmdstat_%s: %q", cmd, stats)
			}
			return n
		}
	}
	return 0
}
