package main

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// TestSIGTERMDuringStartExitsZero: the orchestrator stops a projector that is still
// starting while Redis is down (a rolling restart during a Redis outage). The README promises
// exit 0 for SIGTERM/SIGINT, and `api` keeps that promise; `serve` and `project` exit 1 with
// "context canceled": NewService treats the cancelled start context as a setup failure
// (initialTargets and SetTargets pass only transient errors and DeadlineExceeded).
func TestSIGTERMDuringStartExitsZero(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"api", "serve", "project"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, redistest.Options{})
			url := srv.URL()
			srv.Kill() // Redis is down while the service starts
			env := map[string]string{"REDIS_URL": url, "KEY_PREFIX": "r6start", "HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": "info"}
			withTestAuth(env)
			cmd := exec.Command(checkinsBinary(t), mode)
			cmd.Env = cliEnv(env)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			require.NoError(t, cmd.Start())
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			time.Sleep(500 * time.Millisecond) // still in NewService: its Redis checks take seconds
			require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("no exit within 30s of SIGTERM; stderr:\n%s", stderr.String())
			}
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, 0, code, "SIGTERM during the start of %s exits 0 (README: Shutdown); stderr:\n%s", mode, stderr.String())
		})
	}
}
