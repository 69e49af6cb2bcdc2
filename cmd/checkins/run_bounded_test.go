package main

import (
	"bytes"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// runBounded runs the binary with env for at most d; if it is still running then it gets
// SIGTERM. It returns whether it exited on its own, its exit code and stderr.
func runBounded(t *testing.T, d time.Duration, env map[string]string, args ...string) (exitedAlone bool, code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(checkinsBinary(t), args...)
	cmd.Env = cliEnv(env)
	var so, se boundedBuf
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
		exitedAlone = true
	case <-time.After(d):
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err = <-done:
		case <-time.After(40 * time.Second):
			_ = cmd.Process.Kill()
			err = <-done
		}
	}
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return exitedAlone, code, so.String(), se.String()
}

type boundedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *boundedBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *boundedBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
