package ports_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// TestRebuildDrivenByTheProjectorLoop runs the projector's registry watcher (RegistryWatch)
// next to a running router, with each subscriber implementation, and rebuilds a projection
// while events arrive: the watcher starts v2 next to v1, switches reads once v2 caught up, stops
// v1 and removes its keys and group, all without restarting the router.
func TestRebuildDrivenByTheProjectorLoop(t *testing.T) {
	t.Parallel()
	for _, sub := range []string{"batched", "watermill"} {
		t.Run(sub, func(t *testing.T) {
			t.Parallel()
			env := redistest.Open(t)
			client := redistest.Client(t, env.URL)
			keys := adapters.KeySpace{Prefix: env.Prefix}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			ctx := context.Background()
			projs := []projection.Projection{projection.UserStats{}}
			a := opsApp(t, client, keys, projs, app.OpsConfig{RetireGrace: 300 * time.Millisecond, Logger: log})

			router := usersV1Router(t, env.URL, client, keys, sub, log)
			redistest.Background(t, "router", 20*time.Second, router.Run)
			watch := ports.RegistryWatch{Router: router, Versions: a.Queries.ProjectionVersions, Rebuild: a.Commands.RebuildProjection,
				Projections: projs, Interval: 50 * time.Millisecond, Logger: log}
			redistest.Background(t, "registry watcher", 20*time.Second, watch.Run)
			require.Eventually(t, router.Running, 10*time.Second, 10*time.Millisecond)

			n := 0
			add := func(count int) {
				for range count {
					n++
					e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "rb" + strconv.Itoa(n), UserID: 7, LocationID: 1, StarRating: 2, Timestamp: int64(n)}}
					values := map[string]any{}
					for k, v := range e.Fields() {
						values[k] = v
					}
					require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: values}).Err())
				}
			}
			count := func() int64 {
				v, err := projection.UserStats{}.Get(ctx, adapters.NewProjectionReader(client, keys, "users"), 7)
				if errors.Is(err, domain.ErrNotFound) {
					return 0
				}
				require.NoError(t, err)
				return v.NumCheckins
			}
			add(100)
			require.Eventually(t, func() bool { return count() == 100 }, 10*time.Second, 20*time.Millisecond)

			// Over HTTP, as an operator would: 202, then progress in GET /ops/projections.
			// On the service's ops listener, with its middleware (the correlation ID the spec promises).
			srv := ports.NewHTTPServer(app.Application{}, nil, ports.HTTPConfig{}, slog.New(slog.DiscardHandler))
			require.NoError(t, ports.RegisterOpsRoutes(srv.OpsEcho(), a))
			hs := httptest.NewServer(srv.OpsHandler())
			t.Cleanup(hs.Close)
			resp, err := contractClient.Post(hs.URL+"/ops/projections/users/rebuild", "", nil)
			require.NoError(t, err)
			_ = resp.Body.Close()
			require.Equal(t, http.StatusAccepted, resp.StatusCode)
			add(100) // events keep arriving during the rebuild

			versions := adapters.NewProjectionVersions(client, keys)
			require.Eventually(t, func() bool {
				st, err := versions.State(ctx, "users")
				require.NoError(t, err)
				return st.Serving == 2 && st.Building == 0 && st.Retiring == 0
			}, 60*time.Second, 20*time.Millisecond, "the rebuild never finished") // 20 s fell short once on a machine loaded 10 times over
			// v2 backfilled through its own group while the live group fed v1 and v2; once the
			// backfill is over, the live group alone feeds v2.
			assert.Eventually(t, func() bool { return slices.Equal([]string{"live"}, router.Groups()) }, 10*time.Second, 20*time.Millisecond,
				"the backfill handler stopped: %v", router.Groups())
			assert.True(t, router.Running())
			add(50)
			require.Eventually(t, func() bool { return count() == 250 }, 10*time.Second, 20*time.Millisecond, "reads come from v2, which stays current")

			assert.Eventually(t, func() bool {
				groups, err := client.XInfoGroups(ctx, keys.Stream()).Result()
				require.NoError(t, err)
				return len(groups) == 1 && groups[0].Name == "live"
			}, 10*time.Second, 20*time.Millisecond, "the backfill group is removed after the grace period")
			ms, err := adapters.NewLiveGroups(client, keys).Read(ctx, "live")
			require.NoError(t, err)
			assert.Equal(t, []string{"users.v2"}, slices.Sorted(maps.Keys(ms.Members)), "v1 left the live group")
			left, err := client.Keys(ctx, keys.ProjectionPrefix("users", 1)+"*").Result()
			require.NoError(t, err)
			assert.Empty(t, left, "v1 keys removed")
			rebuilds, err := a.Queries.ProjectionVersions.Rebuilds(ctx)
			require.NoError(t, err)
			require.Len(t, rebuilds, 1)
			assert.Equal(t, ops.RebuildDone, rebuilds[0].State)
		})
	}
}

// TestRegistryWatchStandsStillWhilePaused: while the process is paused (a partition migration's
// quiesce), the registry watcher changes nothing: a rebuild started meanwhile is not joined (nor
// stepped, nor its finished backfills removed), since the migration translates the memberships,
// groups and keys as the projectors left them once they stood still. It goes on once the pause
// ends.
func TestRegistryWatchStandsStillWhilePaused(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	projs := []projection.Projection{projection.UserStats{}}
	a := opsApp(t, client, keys, projs, app.OpsConfig{RetireGrace: 300 * time.Millisecond, Logger: log})
	router := usersV1Router(t, env.URL, client, keys, "batched", log)
	redistest.Background(t, "router", 20*time.Second, router.Run)
	var paused atomic.Bool
	paused.Store(true)
	watch := ports.RegistryWatch{Router: router, Versions: a.Queries.ProjectionVersions, Rebuild: a.Commands.RebuildProjection,
		Projections: projs, Interval: 20 * time.Millisecond, Logger: log, Paused: paused.Load}
	redistest.Background(t, "registry watcher", 20*time.Second, watch.Run)
	require.Eventually(t, router.Running, 10*time.Second, 10*time.Millisecond)

	_, err := a.Commands.RebuildProjection.Start(ctx, "users")
	require.NoError(t, err)
	live := adapters.NewLiveGroups(client, keys)
	members := func() []string {
		ms, err := live.Read(ctx, "live")
		require.NoError(t, err)
		return slices.Sorted(maps.Keys(ms.Members))
	}
	time.Sleep(300 * time.Millisecond) // 15 polls
	assert.Equal(t, []string{"users.v1"}, members(), "nothing joined while paused")

	paused.Store(false)
	require.Eventually(t, func() bool { return slices.Contains(members(), "users.v2") }, 10*time.Second, 20*time.Millisecond,
		"the rebuild's version joins once the pause ends")
}

// usersV1Router is a router that feeds users.v1 through subscriber kind sub (not started).
func usersV1Router(t *testing.T, url string, client redis.UniversalClient, keys adapters.KeySpace, sub string, log *slog.Logger) *ports.ProjectionRouter {
	t.Helper()
	router, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
		Targets: []ops.ProjectionTarget{{Projection: projection.UserStats{}, Version: 1}},
		Backend: adapters.NewProjectorBackend(client, keys), Applier: testApplier(t, client, keys),
		Logger: log, CloseTimeout: 10 * time.Second, Retry: ports.DefaultRetryPolicy(),
		NewSubscriber: adapters.Subscribers{Kind: sub, NewClient: func() (redis.UniversalClient, error) { return redistest.Client(t, url), nil },
			Consumer: "c1", BlockTime: 50 * time.Millisecond, DrainTimeout: 5 * time.Second, Logger: watermill.NopLogger{}}.New,
	})
	require.NoError(t, err)
	return router
}
