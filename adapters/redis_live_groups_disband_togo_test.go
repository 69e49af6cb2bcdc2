package adapters_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/app/query"
)

// TestMovedVersionsToGoCountsUpToItsJoin: `checkins projections list` says how many
// entries a backfill still has to read up to its join (ops.BackfillLag, from the join's "added"
// and the own group's entries-read), not the group's lag, which counts what the live group feeds
// after the join too and never comes near 0 under load. A moved version's own group is created
// by the disband at an ID in mid-stream (XGROUP CREATE without ENTRIESREAD), so Redis never knows
// its entries-read while it backfills: the list falls back to the group's lag, everything up to
// the stream's end.
func TestMovedVersionsToGoCountsUpToItsJoin(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	l := adapters.NewLiveGroups(c, keys)
	stream := keys.Stream()
	add := func(n int) {
		for range n {
			require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Err())
		}
	}
	_, err := l.Join(ctx, "live", "users.v1") // first start: the live group feeds everything
	require.NoError(t, err)
	add(10)
	res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c1", Streams: []string{stream, ">"}, Count: 4, Block: -1}).Result()
	require.NoError(t, err)
	for _, m := range res[0].Messages {
		require.NoError(t, c.XAck(ctx, stream, "live", m.ID).Err())
	}
	time.Sleep(5 * time.Millisecond)
	_, err = l.Disband(ctx, "live", time.Millisecond, true)
	require.NoError(t, err)
	add(3) // the API keeps taking check-ins
	ms, err := l.Join(ctx, "live:users", "users.v1")
	require.NoError(t, err)
	t.Logf("joined: %+v", ms.Members["users.v1"])
	add(20) // ... and after the join, which the live group feeds
	// The own group read two entries of its backfill.
	res, err = c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "users.v1", Consumer: "c2", Streams: []string{stream, ">"}, Count: 2, Block: -1}).Result()
	require.NoError(t, err)
	for _, m := range res[0].Messages {
		require.NoError(t, c.XAck(ctx, stream, "users.v1", m.ID).Err())
	}

	q, err := query.NewProjectionVersions(adapters.NewOpsBackend(c, keys), []projection.Projection{projection.UserStats{}}, 0)
	require.NoError(t, err)
	rep, err := q.List(ctx)
	require.NoError(t, err)
	for _, v := range rep.Versions {
		if v.Version != 1 {
			continue
		}
		t.Logf("%s v%d: %s", v.Projection, v.Version, v.State)
		require.Equal(t, ops.BackfillRunning, v.Backfill)
		require.NotNil(t, v.Lag)
		// 10+3 entries up to the join; 4 delivered by the old live group, 2 by the own group.
		assert.Equal(t, int64(7), *v.Lag, "to go up to its join")
	}
}
