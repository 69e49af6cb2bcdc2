package ports_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// TestFinishedBackfillGroupIsNotRecreatedAtTheStart: a projector (P2) that has not read the
// registry again within the grace period after v2's backfill finished still runs v2's own-group
// handler; another projector (P1) removes the own group (and its dedupe markers). P2's
// checkpoint loop recreated it at "0", and its handler delivered the whole history again to v2,
// which serves reads: every check-in counted twice, again at each removal. A finished backfill's
// group now starts at the stream's end, and its handler applies nothing more.
func TestFinishedBackfillGroupIsNotRecreatedAtTheStart(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	projs := []projection.Projection{projection.UserStats{}}
	a := opsApp(t, client, keys, projs, app.OpsConfig{RetireGrace: 300 * time.Millisecond, Logger: log})

	newRouter := func(consumer string, lg *slog.Logger) *ports.ProjectionRouter {
		r, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
			Targets: []ops.ProjectionTarget{{Projection: projection.UserStats{}, Version: 1}},
			Backend: adapters.NewProjectorBackend(client, keys), Applier: testApplier(t, client, keys),
			Logger: lg, CloseTimeout: 10 * time.Second, Retry: ports.DefaultRetryPolicy(),
			NewSubscriber: adapters.Subscribers{Kind: "batched", NewClient: func() (redis.UniversalClient, error) { return redistest.Client(t, env.URL), nil },
				Consumer: consumer, BlockTime: 50 * time.Millisecond, DrainTimeout: 5 * time.Second, Logger: watermill.NopLogger{}}.New,
		})
		require.NoError(t, err)
		return r
	}
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

	p1 := newRouter("c1", log)
	p2 := newRouter("c2", log)
	redistest.Background(t, "router p1", 20*time.Second, p1.Run)
	redistest.Background(t, "router p2", 20*time.Second, p2.Run)
	require.Eventually(t, func() bool { return p1.Running() && p2.Running() }, 10*time.Second, 10*time.Millisecond)
	add(2000)
	require.Eventually(t, func() bool { return count() == 2000 }, 10*time.Second, 20*time.Millisecond)

	_, err := a.Commands.RebuildProjection.Start(ctx, "users")
	require.NoError(t, err)
	// P2 reads the registry once (it feeds v1 and v2, running v2's backfill handler) and then
	// does not get to its next poll for longer than the grace period.
	targets, err := a.Queries.ProjectionVersions.Targets(ctx, projs)
	require.NoError(t, err)
	_, _, err = p2.SetTargets(ctx, targets)
	require.NoError(t, err)

	watch := ports.RegistryWatch{Router: p1, Versions: a.Queries.ProjectionVersions, Rebuild: a.Commands.RebuildProjection,
		Projections: projs, Interval: time.Second, Logger: log}
	redistest.Background(t, "registry watcher p1", 20*time.Second, watch.Run)

	versions := adapters.NewProjectionVersions(client, keys)
	require.Eventually(t, func() bool {
		st, err := versions.State(ctx, "users")
		require.NoError(t, err)
		return st.Serving == 2 && st.Building == 0 && st.Retiring == 0
	}, 20*time.Second, 20*time.Millisecond, "the rebuild never finished")
	require.Never(t, func() bool { return count() != 2000 }, 3*time.Second, 50*time.Millisecond,
		"the served count moved from 2000 (p2's own group recreated at the start?)")
}
