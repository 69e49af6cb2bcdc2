package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// TestCLIRefusedStartWritesNothing: AUTH_MODE=off with a listener that is not on
// loopback is a configuration error, but checkListeners runs in httpConfig, at the end of
// NewService, after the projector has created the stream and its consumer group and joined its
// projection versions to its live group (SetTargets). The refused `project --projections users`
// thus leaves users.v1 registered as fed by live group "live:users", with no process behind it;
// the operator who fixes the address and starts `serve` (all projections, live group "live") is
// refused with ErrLiveGroupConflict ("run every projector with the same PROJECTIONS"), though no
// projector with another list ever ran.
func TestCLIRefusedStartWritesNothing(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()

	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "AUTH_MODE": "off",
		"HTTP_ADDR": ":0", "OPS_ADDR": "127.0.0.1:0", "PROJECTIONS": "users"}
	code, _, stderr := runCLI(t, env, "project")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "AUTH_MODE=off is allowed only when every listener is on loopback")

	keys, err := client.Keys(ctx, rdb.Prefix+":*").Result()
	require.NoError(t, err)
	registry, _ := client.HGetAll(ctx, rdb.Prefix+":projections").Result()
	assert.Empty(t, keys, "a start refused for its configuration wrote to Redis; registry: %v", registry)

	// The consequence: serve with the address fixed.
	logs := startBinary(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "AUTH_MODE": "off",
		"HTTP_ADDR": "127.0.0.1:0", "OPS_ADDR": "127.0.0.1:0", "LOG_LEVEL": "info"}, "serve")
	var up bool
	require.Eventually(t, func() bool {
		_, up = logs.find("http listening")
		return up || strings.Contains(logs.String(), "checkins serve:")
	}, 30*time.Second, 20*time.Millisecond, "stderr:\n%s", logs)
	if !up {
		_, last, _ := strings.Cut(logs.String(), "checkins serve:")
		assert.Fail(t, "serve with a valid configuration refused to start after the refused project", "checkins serve:%s", last)
	}
}

// TestCLIRefusedForItsDevKeyWritesNothing: a dev key file others may read is refused, and that
// came after the projector had joined its live group too.
func TestCLIRefusedForItsDevKeyWritesNothing(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	state := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(state, devKeyFile), []byte(strings.Repeat("k", 64)), 0o600))
	require.NoError(t, os.Chmod(filepath.Join(state, devKeyFile), 0o644))
	code, _, stderr := runCLI(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "STATE_DIR": state,
		"HTTP_ADDR": "127.0.0.1:0", "OPS_ADDR": "127.0.0.1:0", "PROJECTIONS": "users"}, "project")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, devKeyFile)
	keys, err := client.Keys(context.Background(), rdb.Prefix+":*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys, "a start refused for its dev key wrote to Redis")
}

// TestCLIRefusedForAPortInUseWritesNothing: the listeners were bound in Run, after NewService
// had recorded the projections' layouts and joined the live group, so a projector that could not
// bind its port (another process on it) had written to Redis first: a new build's projection
// versions stayed joined to the live group with no process behind them, and every projector of
// the older build left the group's entries alone (ErrForeignMember) until one of the new build
// ran. Both listeners are now bound before anything is written.
func TestCLIRefusedForAPortInUseWritesNothing(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = taken.Close() })
	for _, tc := range []struct{ name, http, ops, says string }{
		{"public", taken.Addr().String(), "127.0.0.1:0", "HTTP_ADDR " + taken.Addr().String()},
		{"ops", "127.0.0.1:0", taken.Addr().String(), "OPS_ADDR " + taken.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Open(t)
			client := redistest.Client(t, rdb.URL)
			code, _, stderr := runCLI(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix,
				"HTTP_ADDR": tc.http, "OPS_ADDR": tc.ops, "PROJECTIONS": "users"}, "project")
			require.Equal(t, 1, code, stderr)
			require.Contains(t, stderr, tc.says)
			require.Contains(t, stderr, "address already in use")
			keys, err := client.Keys(context.Background(), rdb.Prefix+":*").Result()
			require.NoError(t, err)
			assert.Empty(t, keys, "a start refused for a port in use wrote to Redis")
		})
	}
}
