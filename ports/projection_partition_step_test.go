package ports_test

import (
	"context"
	"encoding/json"
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

// TestRebuildStepWaitsForAPartitionItsJoinLost: a rebuild step (as `checkins projections
// rebuild` drives it, with no router to join the partition again) does not switch reads to a
// version missing a partition, however caught up it is on the others; and the projector's
// checkpoints go on for the other partitions meanwhile (they stopped at the missing group).
func TestRebuildStepWaitsForAPartitionItsJoinLost(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys, err := adapters.KeySpace{Prefix: env.Prefix}.WithPartitions(4)
	require.NoError(t, err)
	parts := keys.Partitions()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	projs := []projection.Projection{projection.UserStats{}}
	a := opsApp(t, client, keys, projs, app.OpsConfig{RetireGrace: 300 * time.Millisecond, Logger: log})
	router, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
		Targets: []ops.ProjectionTarget{{Projection: projection.UserStats{}, Version: 1}},
		Backend: adapters.NewProjectorBackend(client, keys), Applier: testApplier(t, client, keys),
		Logger: log, CloseTimeout: 10 * time.Second, Retry: ports.DefaultRetryPolicy(),
		NewSubscriber: adapters.Subscribers{Kind: "batched", NewClient: func() (redis.UniversalClient, error) { return redistest.Client(t, env.URL), nil },
			Parts: parts, Consumer: "c1", BlockTime: 50 * time.Millisecond, DrainTimeout: 5 * time.Second, Logger: watermill.NopLogger{}}.New,
	})
	require.NoError(t, err)
	redistest.Background(t, "router", 20*time.Second, router.Run)
	require.Eventually(t, router.Running, 10*time.Second, 10*time.Millisecond)
	n := 0
	for u := int64(1); u <= 40; u++ {
		for range 10 {
			n++
			e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "pl" + strconv.Itoa(n), UserID: u, LocationID: 1, StarRating: 2, Timestamp: int64(n)}}
			values := map[string]any{}
			for k, v := range e.Fields() {
				values[k] = v
			}
			require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(adapters.PartitionOf(u, 4)), Values: values}).Err())
		}
	}
	_, err = a.Commands.RebuildProjection.Start(ctx, "users")
	require.NoError(t, err)
	targets, err := a.Queries.ProjectionVersions.Targets(ctx, projs)
	require.NoError(t, err)
	_, _, err = router.SetTargets(ctx, targets)
	require.NoError(t, err)
	// The join on partition 3 is lost (membership and the group it created).
	reg := parts.Registry(3)
	raw, err := client.HGet(ctx, reg, "live:live").Result()
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(raw), &m))
	delete(m, "users.v2")
	b, _ := json.Marshal(m)
	require.NoError(t, client.HSet(ctx, reg, "live:live", string(b)).Err())
	_ = client.XGroupDestroy(ctx, parts.Stream(3), "users.v2").Err()

	live := adapters.NewLiveGroups(client, keys)
	require.Eventually(t, func() bool { // the checkpoints finish the other partitions' backfills
		ms, err := live.Read(ctx, "live")
		require.NoError(t, err)
		v2 := ms.Members["users.v2"]
		if v2.Missing != 1 || len(v2.Parts) != 3 {
			return false
		}
		for _, p := range v2.Parts {
			if p.Own != ops.BackfillDone {
				return false
			}
		}
		return true
	}, 15*time.Second, 50*time.Millisecond, "the backfills of the partitions v2 has joined finish")
	_, err = a.Commands.RebuildProjection.Step(ctx, "users")
	require.NoError(t, err)
	st, err := adapters.NewProjectionVersions(client, keys).State(ctx, "users")
	require.NoError(t, err)
	require.Equal(t, 1, st.Serving, "reads stay on v1 while v2 misses partition 3")
	require.Equal(t, 2, st.Building)
}
