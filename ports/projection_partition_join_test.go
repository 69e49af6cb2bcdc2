package ports_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
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
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// TestRebuildWithAJoinLostOnAPartition: with 4 partitions, v2's join record on one partition is
// lost (a failover of that partition's master right after the join script: asynchronous
// replication). Reads switched to v2 all the same, without that partition's check-ins, and the
// partition's live group, left without members when v1 left, acknowledged its new check-ins
// unapplied for good. Now the version counts as not caught up while it misses a partition, the
// router joins it there again, and the switch comes with every partition's check-ins.
func TestRebuildWithAJoinLostOnAPartition(t *testing.T) {
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
	add := func(per int) {
		for u := int64(1); u <= 40; u++ {
			for range per {
				n++
				e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "pl" + strconv.Itoa(n), UserID: u, LocationID: 1, StarRating: 2, Timestamp: int64(n)}}
				values := map[string]any{}
				for k, v := range e.Fields() {
					values[k] = v
				}
				require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(adapters.PartitionOf(u, 4)), Values: values}).Err())
			}
		}
	}
	total := func() (int64, map[int]int64) {
		var s int64
		byPart := map[int]int64{}
		for u := int64(1); u <= 40; u++ {
			v, err := projection.UserStats{}.Get(ctx, adapters.NewProjectionReader(client, keys, "users"), u)
			if errors.Is(err, domain.ErrNotFound) {
				continue
			}
			require.NoError(t, err)
			s += v.NumCheckins
			byPart[adapters.PartitionOf(u, 4)] += v.NumCheckins
		}
		return s, byPart
	}
	add(10)
	require.Eventually(t, func() bool { s, _ := total(); return s == 400 }, 10*time.Second, 20*time.Millisecond)

	_, err = a.Commands.RebuildProjection.Start(ctx, "users")
	require.NoError(t, err)
	targets, err := a.Queries.ProjectionVersions.Targets(ctx, projs)
	require.NoError(t, err)
	_, _, err = router.SetTargets(ctx, targets) // v2 joins every partition
	require.NoError(t, err)

	// Partition 3's master fails over and the replica never got the join script: its membership
	// is what it was before (v1 alone).
	reg := parts.Registry(3)
	raw, err := client.HGet(ctx, reg, "live:live").Result()
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(raw), &m))
	delete(m, "users.v2")
	b, _ := json.Marshal(m)
	require.NoError(t, client.HSet(ctx, reg, "live:live", string(b)).Err())

	watch := ports.RegistryWatch{Router: router, Versions: a.Queries.ProjectionVersions, Rebuild: a.Commands.RebuildProjection,
		Projections: projs, Interval: 50 * time.Millisecond, Logger: log}
	redistest.Background(t, "registry watcher", 20*time.Second, watch.Run)
	versions := adapters.NewProjectionVersions(client, keys)
	require.Eventually(t, func() bool {
		st, err := versions.State(ctx, "users")
		require.NoError(t, err)
		return st.Serving == 2 && st.Building == 0 && st.Retiring == 0
	}, 20*time.Second, 20*time.Millisecond, "the rebuild never finished")
	s, byPart := total()
	require.Equal(t, int64(400), s, "after the switch, by partition %v", byPart)
	add(5)
	require.Eventually(t, func() bool { s, _ := total(); return s == 600 }, 10*time.Second, 20*time.Millisecond,
		"every partition's new check-ins reach v2")
	for i := range 4 {
		raw, err := client.HGet(ctx, parts.Registry(i), "live:live").Result()
		require.NoError(t, err)
		assert.Contains(t, raw, "users.v2", "partition %d", i)
	}
}
