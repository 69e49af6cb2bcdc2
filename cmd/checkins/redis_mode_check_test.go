package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// TestStandaloneModeOnAClusterNodeIsRefused: REDIS_MODE=standalone with a REDIS_URL naming a
// Redis Cluster node (a REDIS_MODE left over from before a move to a cluster). `api` started,
// and /readyz answered 200 while every POST /checkins answered 503 (MOVED, CROSSSLOT): a load
// balancer kept sending traffic to a process that could record nothing. Auto mode asks the
// server; a mode given was never checked. The start is refused now, naming REDIS_MODE; and when
// the node does not answer at start, /readyz asks it until it does.
func TestStandaloneModeOnAClusterNodeIsRefused(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{})
	url := "redis://" + cl.Addrs()[0] + "/0"
	env := withTestAuth(map[string]string{"HTTP_ADDR": "127.0.0.1:0", "REDIS_URL": url, "REDIS_MODE": "standalone"})
	code, _, stderr := runCLI(t, env, "api") // refused at start: it ends by itself
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "REDIS_MODE is standalone")
	assert.Contains(t, stderr, "is a Redis Cluster node")

	// Not answering at start: it starts, and /readyz says what is wrong once the node answers.
	cl.KillNode(0)
	p := startSvc(t, "api", map[string]string{"REDIS_URL": url, "REDIS_MODE": "standalone"})
	cl.RestartNode(t, 0)
	require.Eventually(t, func() bool {
		code, body := faultGet(t, p.base+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "REDIS_MODE is standalone")
	}, 30*time.Second, 100*time.Millisecond, "/readyz names the mismatch: %s", p.logs)
}

// TestClusterModeOnOneServerIsRefused: REDIS_MODE=cluster against a single Redis was refused with
// Redis's own words ("ERR This instance has cluster support disabled"), after a warning that
// Redis "is not reachable yet", naming neither REDIS_MODE nor REDIS_URL.
func TestClusterModeOnOneServerIsRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	env := withTestAuth(map[string]string{"HTTP_ADDR": "127.0.0.1:0", "REDIS_URL": srv.URL(), "REDIS_MODE": "cluster", "KEY_PREFIX": "cm"})
	code, _, stderr := runCLI(t, env, "serve")
	assert.Equal(t, 1, code, stderr)
	assert.NotContains(t, stderr, "not reachable", "Redis answered; it is not unreachable")
	assert.Contains(t, stderr, "invalid REDIS_URL/REDIS_MODE: the redis mode does not match the server: REDIS_MODE is cluster")
}
