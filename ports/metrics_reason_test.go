package ports_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/ports"
)

// TestTransientReasonLabelIsBounded: a batch that fails whole with an error that is no known
// Redis failure is retried as a passing one; its text (which names keys, entries, members) went
// into checkins_projection_transient_failures_total's reason label, a new series each time. The
// label is "other"; the log and /readyz keep the text.
func TestTransientReasonLabelIsBounded(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	client := redistest.Client(t, env.URL)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	reg := prometheus.NewRegistry()
	m, err := ports.NewMetrics(reg)
	require.NoError(t, err)
	p := newFaulty("p", nil)
	r, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
		Projections: []projection.Projection{p}, Targets: []ops.ProjectionTarget{{Projection: p, Version: 1}},
		Backend: adapters.NewProjectorBackend(client, keys), Applier: testApplier(t, client, keys),
		NewSubscriber: adapters.Subscribers{NewClient: func() (redis.UniversalClient, error) {
			return redistest.Client(t, env.URL), nil
		}, Consumer: "c1", BatchSize: 50, MaxInFlight: 100, BlockTime: 50 * time.Millisecond, NackDelay: 50 * time.Millisecond, Logger: watermill.NopLogger{}}.New,
		Retry:        ports.RetryPolicy{InitialInterval: time.Millisecond, Multiplier: 1, MaxInterval: time.Millisecond, MaxAttempts: 1},
		CloseTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Observer: m,
	})
	require.NoError(t, err)
	go func() { _ = r.Run(ctx) }()
	require.Eventually(t, r.Running, 10*time.Second, 10*time.Millisecond)
	// The projections' registry is a string now: every batch fails whole (reading the live
	// group's membership), with an error that is no known Redis failure.
	require.NoError(t, client.Set(ctx, keys.Projections(), "not a hash", 0).Err())
	h := &harness{t: t, keys: keys, client: client}
	h.add("e0", 1)
	srv := httptest.NewServer(ports.MetricsHandler(reg))
	defer srv.Close()
	var body string
	require.Eventually(t, func() bool {
		resp, err := http.Get(srv.URL)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		body = string(b)
		return strings.Contains(body, "checkins_projection_transient_failures_total{")
	}, 10*time.Second, 50*time.Millisecond)
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "checkins_projection_transient_failures_total{") {
			assert.True(t, strings.HasPrefix(l, `checkins_projection_transient_failures_total{group="live",reason="other"} `), "a bounded reason: %s", l)
		}
	}
}
