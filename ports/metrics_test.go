package ports_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/app/query"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// gatedProjection counts check-ins, but every handler waits until the gate opens: a consumer
// that is alive and connected yet makes no progress.
type gatedProjection struct{ gate chan struct{} }

func (gatedProjection) Name() string { return "gated" }

func (p gatedProjection) OnCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, s projection.Store) error {
	<-p.gate
	return s.Apply(ctx, projection.NewUpdate("all").HIncrBy("stats", "count", 1))
}

type monitorReadiness struct{ m *query.ProgressMonitor }

func (r monitorReadiness) Ready(ctx context.Context) error { return r.m.Stalled(ctx) }

// metricValue finds the sample of exactly series (name{labels}) in a text exposition.
func metricValue(body, series string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// With 4 stream partitions the figures of each group are its partitions' summed up, which the
// P = 4 run checks against XINFO GROUPS of every partition.
func TestMetricsAndReadinessFollowProgress(t *testing.T) {
	t.Parallel()
	for _, p := range []int{1, 4} {
		t.Run(fmt.Sprintf("P=%d", p), func(t *testing.T) {
			t.Parallel()
			testMetricsAndReadinessFollowProgress(t, p)
		})
	}
}

func testMetricsAndReadinessFollowProgress(t *testing.T, partitions int) {
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys, err := adapters.KeySpace{Prefix: env.Prefix}.WithPartitions(partitions)
	require.NoError(t, err)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()

	reg := prometheus.NewRegistry()
	metrics, err := ports.NewMetrics(reg)
	require.NoError(t, err)
	gated := gatedProjection{gate: make(chan struct{})}
	projs := []projection.Projection{projection.UserStats{}, gated}
	versions := opsApp(t, client, keys, projs, app.OpsConfig{Logger: log}).Queries.ProjectionVersions
	backend := adapters.NewOpsBackend(client, keys)
	monitor := query.NewProgressMonitor(backend, 300*time.Millisecond, versions.ActiveGroups([]string{"users", "gated"}))
	reg.MustRegister(ports.NewStreamCollector(monitor, backend, 5*time.Second))

	// Projections of one live group share its progress: a stuck one holds the others back until
	// HANDLER_TIMEOUT parks its events. Isolating a projection is running it in a process (and a
	// live group) of its own, as here: users and gated each have theirs.
	var routers []*ports.ProjectionRouter
	for _, p := range projs {
		router, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
			Targets: []ops.ProjectionTarget{{Projection: p, Version: 1}}, LiveGroup: ports.LiveGroupName([]string{p.Name()}, false),
			Backend: adapters.NewProjectorBackend(client, keys), Applier: testApplier(t, client, keys), Observer: metrics, Logger: log, CloseTimeout: 10 * time.Second,
			Retry: ports.RetryPolicy{InitialInterval: 5 * time.Millisecond, Multiplier: 1, MaxInterval: 5 * time.Millisecond, MaxAttempts: 2},
			NewSubscriber: adapters.Subscribers{NewClient: func() (redis.UniversalClient, error) { return redistest.Client(t, env.URL), nil },
				Consumer: "c1", Parts: keys.Partitions(), BatchSize: 10, MaxInFlight: 20, BlockTime: 50 * time.Millisecond,
				DrainTimeout: 5 * time.Second, Logger: watermill.NopLogger{}}.New,
		})
		require.NoError(t, err)
		routers = append(routers, router)
		redistest.Background(t, "router of "+p.Name(), 20*time.Second, router.Run)
	}
	var gateOnce bool
	openGate := func() {
		if !gateOnce {
			gateOnce = true
			close(gated.gate)
		}
	}
	t.Cleanup(openGate) // runs before the router's cleanup: in-flight handlers finish
	for _, r := range routers {
		require.Eventually(t, r.Running, 10*time.Second, 10*time.Millisecond)
	}

	server := ports.NewHTTPServer(app.Application{}, monitorReadiness{monitor}, ports.HTTPConfig{}, log)
	server.Echo().Use(metrics.Middleware())
	server.Echo().GET("/metrics", echo.WrapHandler(ports.MetricsHandler(reg)))
	hs := httptest.NewServer(server.Handler())
	t.Cleanup(hs.Close)
	get := func(path string) (int, string) {
		resp, err := contractClient.Get(hs.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}

	const events, nUsers = 60, 8
	parts := keys.Partitions()
	for i := range events {
		user := int64(1 + i%nUsers) // over every partition
		e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "m" + strconv.Itoa(i), UserID: user, LocationID: 2, StarRating: 3, Timestamp: 1000 + int64(i)}, RecordedAt: 2000}
		fields := map[string]any{}
		for k, v := range e.Fields() {
			fields[k] = v
		}
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.StreamOf(user), Values: fields}).Err())
	}
	// And one entry that is not an event: both projections park it.
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(0), Values: map[string]any{"type": "nonsense"}}).Err())

	users := adapters.NewProjectionReader(client, keys, "users")
	require.Eventually(t, func() bool {
		var n int64
		for u := int64(1); u <= nUsers; u++ {
			v, err := projection.UserStats{}.Get(ctx, users, u)
			if err != nil {
				return false
			}
			n += v.NumCheckins
		}
		return n == events
	}, 15*time.Second, 20*time.Millisecond)

	status, _ := get("/healthz")
	require.Equal(t, http.StatusOK, status)
	status, _ = get("/no/such/route/42")
	require.Equal(t, http.StatusNotFound, status)

	// The gated projection delivered what its in-flight window allows, then made no progress:
	// after STALL_AFTER (300ms here) /readyz says so and names it.
	var reason string
	require.Eventually(t, func() bool {
		status, body := get("/readyz")
		if status != http.StatusServiceUnavailable {
			return false
		}
		var r struct{ Status, Reason string }
		require.NoError(t, json.Unmarshal([]byte(body), &r))
		reason = r.Reason
		return true
	}, 15*time.Second, 50*time.Millisecond)
	assert.Contains(t, reason, "live:gated")
	assert.Contains(t, reason, "stalled")
	assert.NotContains(t, reason, "live:users", "the projection that keeps up is not blamed")

	// `checkins projections list` (ProjectionVersions.List with STALL_AFTER) flags it too.
	listOps := opsApp(t, client, keys, projs, app.OpsConfig{StallAfter: 300 * time.Millisecond, Logger: log}).Queries.ProjectionVersions
	rep, err := listOps.List(ctx)
	require.NoError(t, err)
	stalled := map[string]bool{}
	for _, v := range rep.Versions {
		stalled[v.Group] = v.Stalled
		if v.Stalled {
			assert.Contains(t, v.State, "STALLED")
		}
	}
	assert.Equal(t, map[string]bool{"live:users": false, "live:gated": true}, stalled)

	status, body := get("/metrics")
	require.Equal(t, http.StatusOK, status)
	for series, check := range map[string]func(float64) bool{
		`checkins_projection_events_total{outcome="applied",projection="users"}`:                            func(v float64) bool { return v == events },
		`checkins_projection_events_total{outcome="poisoned",projection=""}`:                                func(v float64) bool { return v == 1 }, // not an event: parked once, by live:users (live:gated is stuck behind its gate)
		`checkins_projection_batch_duration_seconds_count{projection="users"}`:                              func(v float64) bool { return v >= 1 },
		`checkins_http_requests_total{method="GET",route="/healthz",status="200"}`:                          func(v float64) bool { return v == 1 },
		`checkins_http_requests_total{method="GET",route="/readyz",status="503"}`:                           func(v float64) bool { return v >= 1 },
		`checkins_http_request_duration_seconds_count{method="GET",route="/healthz",status="200"}`:          func(v float64) bool { return v == 1 },
		`checkins_projection_lag{group="live:users",projection="users",version="1"}`:                        func(v float64) bool { return v == 0 },
		`checkins_projection_pending{group="live:users",projection="users",version="1"}`:                    func(v float64) bool { return v == 0 },
		`checkins_projection_lag{group="live:gated",projection="gated",version="1"}`:                        func(v float64) bool { return v > 0 },
		`checkins_projection_pending{group="live:gated",projection="gated",version="1"}`:                    func(v float64) bool { return v > 0 },
		`checkins_projection_oldest_pending_age_seconds{group="live:gated",projection="gated",version="1"}`: func(v float64) bool { return v > 0 },
		`checkins_projection_stalled{group="live:gated",projection="gated",version="1"}`:                    func(v float64) bool { return v == 1 },
		`checkins_projection_stalled{group="live:users",projection="users",version="1"}`:                    func(v float64) bool { return v == 0 },
		`checkins_http_requests_total{method="GET",route="unmatched",status="404"}`:                         func(v float64) bool { return v == 1 },
		`checkins_poison_queue_depth`: func(v float64) bool { return v >= 1 },
		`checkins_redis_up`:           func(v float64) bool { return v == 1 },
	} {
		v, ok := metricValue(body, series)
		if assert.True(t, ok, "missing series %s", series) {
			assert.True(t, check(v), "%s = %v", series, v)
		}
	}

	// The gated group's lag and pending entries are its partitions' summed up.
	var lag, pending int64
	for _, stream := range parts.Streams() {
		gs, err := client.XInfoGroups(ctx, stream).Result()
		require.NoError(t, err)
		for _, g := range gs {
			if g.Name == "live:gated" {
				lag += g.Lag
				pending += g.Pending
			}
		}
	}
	for series, want := range map[string]int64{
		`checkins_projection_lag{group="live:gated",projection="gated",version="1"}`:     lag,
		`checkins_projection_pending{group="live:gated",projection="gated",version="1"}`: pending,
	} {
		v, ok := metricValue(body, series)
		if assert.True(t, ok, "missing series %s", series) {
			assert.Equal(t, float64(want), v, "%s: the sum over the %d partitions", series, partitions)
		}
	}
	if partitions > 1 {
		v, ok := metricValue(body, `checkins_stream_length`)
		if assert.True(t, ok) {
			assert.Equal(t, float64(events+1), v, "the stream's length is the partitions' total")
		}
	}

	// Progress resumes: the stall clears by itself.
	openGate()
	require.Eventually(t, func() bool { status, _ := get("/readyz"); return status == http.StatusOK }, 15*time.Second, 50*time.Millisecond)
}

// TestMetricsMethodLabelIsBounded: a request with a made-up method (Go's server takes any
// token) is counted as OTHER, so anonymous requests cannot add series, and memory, one per
// request.
func TestMetricsMethodLabelIsBounded(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := ports.NewMetrics(reg)
	require.NoError(t, err)
	e := echo.New()
	e.Use(m.Middleware())
	e.GET("/x", func(c echo.Context) error { return c.NoContent(http.StatusNoContent) })
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	for i := range 50 {
		req, err := http.NewRequest(fmt.Sprintf("M%04d", i), srv.URL+"/nope", nil)
		require.NoError(t, err)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
	}
	resp, err := srv.Client().Get(srv.URL + "/x")
	require.NoError(t, err)
	_ = resp.Body.Close()

	rec := httptest.NewRecorder()
	ports.MetricsHandler(reg).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	v, ok := metricValue(body, `checkins_http_requests_total{method="OTHER",route="unmatched",status="404"}`)
	assert.True(t, ok && v == 50, "the 50 made-up methods are one series: %v %v", ok, v)
	v, ok = metricValue(body, `checkins_http_requests_total{method="GET",route="/x",status="204"}`)
	assert.True(t, ok && v == 1, "HTTP's own methods keep their name: %v %v", ok, v)
	assert.Zero(t, strings.Count(body, `method="M00`), "no series per made-up method")
	assert.Equal(t, 2, strings.Count(body, "checkins_http_requests_total{"), "two series in all")
}
