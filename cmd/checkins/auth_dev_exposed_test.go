package main

// Dev mode is what the service runs when no AUTH_* setting is given, also on
// listeners every host on the network reaches (the Dockerfile sets HTTP_ADDR=:8080 and
// OPS_ADDR=:8081, and its documented `docker run -e REDIS_URL=... checkins:local api` sets no
// AUTH_*). It then writes a 24-hour bearer token of scope checkins:ops into the structured log
// at INFO, where whoever reads the logs (a log pipeline, `docker logs`, a CI artifact) picks it
// up and may purge or replay the poison queue and rebuild projections. AUTH_MODE=off is refused
// off loopback; dev mode was neither refused nor warned about. Now it warns, and the tokens go
// to the terminal's banner only. (Refusing it would refuse the quick start, `checkins serve` on
// HTTP_ADDR's default :8080.)

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestDevModeOffLoopbackWarnsAndLogsNoToken(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	// A production-like start: an external Redis, listeners on every interface (as the
	// Dockerfile's ENV), and no AUTH_* setting at all.
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "HTTP_ADDR": "0.0.0.0:0", "OPS_ADDR": ":0",
		"STATE_DIR": t.TempDir(), "LOG_LEVEL": "info", "RATE_LIMIT_USER": "off", "RATE_LIMIT_IP": "off"}
	cfg, _, err := parseConfig(flag.NewFlagSet("devmode", flag.ContinueOnError), nil, func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, AuthDev, cfg.AuthMode, "nothing configured: dev mode")

	var logs syncBuf
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := NewService(ctx, cfg, Mode{API: true, Projections: true}, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: cfg.LogLevel})))
	if err != nil {
		cancel()
		t.Logf("refused, as it should be: %v", err)
		return
	}
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
		}
	})
	var opsToken string
	var warned bool
	require.Eventually(t, func() bool {
		sc := bufio.NewScanner(strings.NewReader(logs.String()))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				continue
			}
			if tok, ok := m["ops_token"].(string); ok {
				opsToken = tok
			}
			if m["level"] == "WARN" && strings.Contains(strings.ToLower(sc.Text()), "dev mode") {
				warned = true
			}
			if m["msg"] == "http listening" {
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "the service starts; logs:\n%s", &logs)

	_, port, err := net.SplitHostPort(svc.OpsAddr().String())
	require.NoError(t, err)
	opsURL := "http://127.0.0.1:" + port
	require.True(t, net.ParseIP(hostOf(svc.OpsAddr().String())).IsUnspecified(), "the ops listener is on every interface: %s", svc.OpsAddr())

	assert.True(t, warned, "an implicit dev mode on listeners off loopback starts without a refusal or even a WARN")
	if !assert.False(t, opsToken != "", "the structured log carries a bearer token of scope checkins:ops (field ops_token)") {
		t.Logf("ops_token read from the log: %.24s...", opsToken)
	} else {
		return
	}
	// Impact: the token read from the log runs operations.
	req, err := http.NewRequest(http.MethodDelete, opsURL+"/ops/poison", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+opsToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	t.Logf("DELETE /ops/poison (purge all) with the token from the log: %d", resp.StatusCode)
}

func hostOf(addr string) string {
	h, _, _ := net.SplitHostPort(addr)
	return h
}
