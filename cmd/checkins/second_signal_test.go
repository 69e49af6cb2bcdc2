package main

import (
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// TestSecondSignalEndsTheDrain: a request whose body never finishes holds the graceful stop for
// DRAIN_TIMEOUT (here a minute). A second SIGTERM during the drain was ignored (the handler of
// the first stayed installed until the process returned): an operator's second Ctrl-C did
// nothing. It ends the process at once now, as the signal's default does.
func TestSecondSignalEndsTheDrain(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	p := startSvc(t, "api", map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "DRAIN_TIMEOUT": "1m", "HTTP_READ_TIMEOUT": "1m"})
	conn, err := net.Dial("tcp", strings.TrimPrefix(p.base, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = fmt.Fprintf(conn, "POST /checkins HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"locationId\":", testToken(3))
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // the handler reads the body

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
		t.Fatalf("the drain did not wait for the request in flight: %v", p.err)
	case <-time.After(time.Second):
	}
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("a second SIGTERM did not end the drain")
	}
	var ee *exec.ExitError
	require.True(t, errors.As(p.err, &ee), "%v", p.err)
	ws, ok := ee.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	assert.True(t, ws.Signaled() && ws.Signal() == syscall.SIGTERM, "ended by the second SIGTERM: %v", p.err)
}
