package ports_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/ports"
)

// TestClientGoneIsNotAServerError: a client that gives up while the request waits on Redis (here
// a stopped redis-server) is not a 503: the request is logged and counted as 499, and no
// "request failed" warning is written. A request that times out on the server's side with the
// client still there is a 503, as before.
func TestClientGoneIsNotAServerError(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, err := adapters.NewRedisClient(adapters.ClientOptions{URL: srv.URL(), ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	keys := adapters.KeySpace{Prefix: "gone"}
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reg := prometheus.NewRegistry()
	metrics, err := ports.NewMetrics(reg)
	require.NoError(t, err)
	application := app.Application{Queries: app.Queries{Users: app.UserQueries{Reader: adapters.NewProjectionReader(client, keys, "users")}}}
	server := ports.NewHTTPServer(application, nil, ports.HTTPConfig{RequestTimeout: 2 * time.Second}, log)
	server.Echo().Use(metrics.Middleware())
	server.Echo().GET("/metrics", echo.WrapHandler(ports.MetricsHandler(reg)))
	hs := httptest.NewServer(server.Handler())
	t.Cleanup(hs.Close)

	require.NoError(t, srv.Signal(syscall.SIGSTOP))
	t.Cleanup(func() { _ = srv.Signal(syscall.SIGCONT) })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+"/users/1", nil)
	require.NoError(t, err)
	_, err = contractClient.Do(req)
	cancel()
	require.True(t, errors.Is(err, context.DeadlineExceeded), "the client gave up: %v", err)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), `"path":"/users/:id","status":499`) },
		5*time.Second, 10*time.Millisecond, "the request is logged as 499: %s", logs)

	// The client stays: the server's own deadline (REQUEST_TIMEOUT) answers 503.
	resp, err := contractClient.Get(hs.URL + "/users/1")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.NoError(t, srv.Signal(syscall.SIGCONT))

	assert.Equal(t, 1, logs.count(`"msg":"request failed"`), "only the 503 is a failure: %s", logs)
	resp, err = contractClient.Get(hs.URL + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(body), `checkins_http_requests_total{method="GET",route="/users/:id",status="499"} 1`)
	assert.Contains(t, string(body), `checkins_http_requests_total{method="GET",route="/users/:id",status="503"} 1`)
}
