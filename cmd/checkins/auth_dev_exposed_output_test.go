package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// TestDevModeOffLoopbackPrintsNoTokenOffATerminal: f7c5305 keeps dev mode's ops token out
// of the structured log when a listener is off loopback, "printed as plain text on the
// terminal's banner" instead. But the service commands log to stderr and print the banner to
// stderr too (svc.banner = stderr in serviceCommand): the one stream `docker logs`, a systemd
// journal or a log pipeline captures. Run as the Dockerfile runs it (api, :8080-like listeners,
// no AUTH_*), the process's output still carries a 24h token of scope checkins:ops, which purges
// the poison queue.
func TestDevModeOffLoopbackPrintsNoTokenOffATerminal(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "HTTP_ADDR": "0.0.0.0:0", "OPS_ADDR": ":0",
		"STATE_DIR": t.TempDir(), "LOG_LEVEL": "info", "RATE_LIMIT_USER": "off", "RATE_LIMIT_IP": "off"}
	var stdout, stderr syncBuf // what `docker logs` shows: both streams of the process
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serviceCommand("api", Mode{API: true})(ctx, nil, func(k string) string { return env[k] }, &stdout, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
		}
	})
	var opsAddr string
	require.Eventually(t, func() bool {
		sc := bufio.NewScanner(strings.NewReader(stderr.String()))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "http listening" {
				opsAddr, _ = m["ops_addr"].(string)
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "the service starts; stderr:\n%s", &stderr)
	out := stdout.String() + stderr.String()
	require.Contains(t, out, "other machines may reach", "the WARN is there")

	tok := regexp.MustCompile(`ops token \(scope checkins:ops\): (\S+)`).FindStringSubmatch(out)
	if !assert.Nil(t, tok, "the process's output (docker logs) carries a bearer token of scope checkins:ops") {
		_, port, err := net.SplitHostPort(opsAddr)
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodDelete, "http://127.0.0.1:"+port+"/ops/poison", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok[1])
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		t.Logf("DELETE /ops/poison with the token read from the process's output: %d", resp.StatusCode)
	}
}
