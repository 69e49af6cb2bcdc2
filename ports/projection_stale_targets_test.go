package ports_test

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// TestStaleTargetsDoNotJoinARetiredVersion: a projector process starting during a rebuild
// reads its targets (users v1 serving, v2 building: initialTargets, or a poll's Targets) and is
// held up before SetTargets joins them (connecting its clients, a slow Redis) for longer than
// PROJECTION_RETIRE_GRACE. Meanwhile v2 switches and v1 is retired (left, group and keys
// removed, registry cleared). Its SetTargets then joined v1 to the live group again: the join
// checked nothing against the registry, so v1 became a member with a fresh own group at "0" (a
// full backfill of a version nothing reads), fed by the live group from then on, with nothing to
// take it out again, its own group holding retention's trims and the dedupe floors (found by a
// review). A join of a version below the serving one is now refused (ops.ErrVersionRetired),
// and the router leaves it out.
func TestStaleTargetsDoNotJoinARetiredVersion(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	projs := []projection.Projection{projection.UserStats{}}
	now := time.Now()
	a := opsApp(t, client, keys, projs, app.OpsConfig{RetireGrace: 10 * time.Second, Logger: log})
	live := adapters.NewLiveGroups(client, keys)
	_, err := live.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	for i := range 10 {
		e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "c" + strconv.Itoa(i), UserID: 7, LocationID: 1, StarRating: 2, Timestamp: int64(i)}}
		values := map[string]any{}
		for k, v := range e.Fields() {
			values[k] = v
		}
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: values}).Err())
	}
	drain := func(group string) {
		require.NoError(t, client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "p", Streams: []string{keys.Stream(), ">"}, Count: 100}).Err())
		ms, err := client.XRange(ctx, keys.Stream(), "-", "+").Result()
		require.NoError(t, err)
		for _, m := range ms {
			require.NoError(t, client.XAck(ctx, keys.Stream(), group, m.ID).Err())
		}
	}
	drain("live")
	rb, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: adapters.NewOpsBackend(client, keys), Projections: projs,
		RetireGrace: 10 * time.Second, Logger: log, Now: func() time.Time { return now }})
	require.NoError(t, err)
	_, err = rb.Start(ctx, "users")
	require.NoError(t, err)
	_, err = live.Join(ctx, "live", "users.v2")
	require.NoError(t, err)

	// The starting projector reads its targets now: v1 serving, v2 building.
	stale, err := a.Queries.ProjectionVersions.Targets(ctx, projs)
	require.NoError(t, err)
	require.Len(t, stale, 2)

	// v2's backfill catches up, reads switch, and after the grace v1 is retired.
	drain("users.v2")
	rp, err := rb.Step(ctx, "users")
	require.NoError(t, err)
	require.Equal(t, ops.RebuildRetiring, rp.State)
	now = now.Add(11 * time.Second)
	rp, err = rb.Step(ctx, "users")
	require.NoError(t, err)
	require.Equal(t, ops.RebuildDone, rp.State)

	// The projector goes on with the targets it read.
	router, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
		Projections: projs, Backend: adapters.NewProjectorBackend(client, keys), Applier: testApplier(t, client, keys),
		Logger: log, CloseTimeout: 5 * time.Second, Retry: ports.DefaultRetryPolicy(),
		NewSubscriber: adapters.Subscribers{Kind: "batched", NewClient: func() (redis.UniversalClient, error) { return redistest.Client(t, env.URL), nil },
			Consumer: "c1", BlockTime: 50 * time.Millisecond, DrainTimeout: 5 * time.Second, Logger: watermill.NopLogger{}}.New,
	})
	require.NoError(t, err)
	_, _, err = router.SetTargets(ctx, stale)
	t.Logf("SetTargets with the targets read before the switch: %v", err)

	ms, err := live.Read(ctx, "live")
	require.NoError(t, err)
	assert.Equal(t, []string{"users.v2"}, slices.Sorted(maps.Keys(ms.Members)), "a retired version never joins again")
	groups, err := client.XInfoGroups(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	var names []string
	for _, g := range groups {
		names = append(names, g.Name+"@"+g.LastDeliveredID)
	}
	assert.NotContains(t, slices.Collect(maps.Keys(ms.Members)), "users.v1")
	t.Logf("groups on the stream: %v; v1 member: %+v", names, ms.Members["users.v1"])
	st, err := a.Queries.ProjectionVersions.Targets(ctx, projs)
	require.NoError(t, err)
	t.Logf("registry targets now: %d (v%d)", len(st), st[0].Version)
}
