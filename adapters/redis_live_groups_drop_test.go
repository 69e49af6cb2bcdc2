package adapters_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
)

// TestDropMovedVersion: a version a disband took out of its live group, and that no set runs
// any more, is dropped: its own group, moved record and checkpoint go, and its read model with
// them, so that run again it starts as a first start (from the stream's start, onto nothing).
// A check (--dry-run) changes nothing. A drop cut short after its first step holds joins off
// (its read model is half removed) and holds the partition migration off, until it is run
// again. It refuses a version that is in a live group again, and names the moved versions for
// one that is not moved. On a server and a cluster, with one stream and with four partitions.
func TestDropMovedVersion(t *testing.T) {
	eachEnv(t, func(t *testing.T, env projEnv) {
		for _, p := range []int{1, 4} {
			t.Run(fmt.Sprintf("P=%d", p), func(t *testing.T) {
				base := env.keys
				base.Prefix += ":drop" + strconv.Itoa(p)
				base.Cluster = env.cluster
				keys, err := base.WithPartitions(p)
				require.NoError(t, err)
				dropMovedVersion(t, env.client, base, keys)
			})
		}
	})
}

func dropMovedVersion(t *testing.T, c redis.UniversalClient, base, keys adapters.KeySpace) {
	ctx := context.Background()
	parts := keys.Partitions()
	l := adapters.NewLiveGroups(c, keys)
	b := adapters.NewOpsBackend(c, keys)
	for _, stream := range parts.Streams() {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Err())
	}
	for _, m := range []string{"users.v1", "locations.v1"} {
		_, err := l.Join(ctx, "live", m)
		require.NoError(t, err)
	}
	for _, stream := range parts.Streams() {
		res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c1", Streams: []string{stream, ">"}, Block: -1}).Result()
		require.NoError(t, err)
		require.NoError(t, c.XAck(ctx, stream, "live", res[0].Messages[0].ID).Err())
	}
	// users.v1's read model: a key under its prefix, in a slot of its own.
	model := keys.ProjectionPrefix("users", 1) + "{user:7}:stats"
	require.NoError(t, c.HSet(ctx, model, "numCheckins", 4).Err())
	time.Sleep(5 * time.Millisecond)
	disband, err := command.NewDisbandLiveGroup(b, time.Millisecond)
	require.NoError(t, err)
	_, err = disband.Run(ctx, "live", false)
	require.NoError(t, err)

	drop, err := command.NewDropMovedVersion(b, time.Millisecond)
	require.NoError(t, err)
	fields := func(prefix string) int {
		t.Helper()
		n := 0
		for i := range parts.Count() {
			ok, err := c.HExists(ctx, parts.Registry(i), prefix+"users.v1").Result()
			require.NoError(t, err)
			if ok {
				n++
			}
		}
		return n
	}
	groups := func() int {
		t.Helper()
		n := 0
		for _, stream := range parts.Streams() {
			gs, err := c.XInfoGroups(ctx, stream).Result()
			require.NoError(t, err)
			for _, g := range gs {
				if g.Name == "users.v1" {
					n++
				}
			}
		}
		return n
	}
	require.Equal(t, parts.Count(), fields("moved:"))
	require.Equal(t, parts.Count(), groups())

	// Not a version name, and not a moved version.
	_, err = drop.Run(ctx, "users", false)
	require.ErrorContains(t, err, "is not a projection version")
	_, err = drop.Run(ctx, "daily_checkins.v1", false)
	require.ErrorIs(t, err, domain.ErrNotFound)
	assert.Contains(t, err.Error(), "they are: locations.v1, users.v1")

	// A check changes nothing.
	rep, err := drop.Run(ctx, "users.v1", true)
	require.NoError(t, err)
	assert.False(t, rep.Done)
	assert.Len(t, rep.Positions, parts.Count())
	assert.Equal(t, parts.Count(), fields("moved:"))
	assert.Equal(t, parts.Count(), groups())
	assert.Equal(t, int64(1), c.Exists(ctx, model).Val())

	// Cut short after its first step: the group and the moved record are gone, the read model
	// is still there, and a join would build on it.
	rep, err = l.DropMoved(ctx, "users.v1", time.Millisecond, true)
	require.NoError(t, err)
	require.True(t, rep.Done)
	assert.Equal(t, 0, fields("moved:"))
	assert.Equal(t, 0, fields("acked:"))
	assert.Equal(t, parts.Count(), fields("dropping:"))
	assert.Equal(t, 0, groups())
	_, err = l.Join(ctx, "live:users", "users.v1")
	require.ErrorIs(t, err, ops.ErrDropUnfinished)
	assert.Contains(t, err.Error(), "run `checkins projections drop users.v1` again")
	unsettled, err := adapters.NewPartitionMigrator(c, base).JoinsUnsettled(ctx, parts.Count())
	require.NoError(t, err)
	assert.Contains(t, fmt.Sprint(unsettled), "users.v1 is being dropped")

	// Run again, it finishes.
	rep, err = drop.Run(ctx, "users.v1", false)
	require.NoError(t, err)
	assert.True(t, rep.Done)
	assert.True(t, rep.Resumed)
	assert.GreaterOrEqual(t, rep.KeysRemoved, int64(1))
	assert.Equal(t, int64(0), c.Exists(ctx, model).Val(), "its read model is gone")
	assert.Equal(t, 0, fields("dropping:"))
	_, err = drop.Run(ctx, "users.v1", false)
	require.ErrorIs(t, err, domain.ErrNotFound, "dropped: no longer a moved version")

	// Run again by a projector, it is a first start: joined at the start, nothing to backfill.
	ms, err := l.Join(ctx, "live:users", "users.v1")
	require.NoError(t, err)
	assert.Equal(t, ops.BackfillDone, ms.Members["users.v1"].Own)
	assert.Equal(t, "0-0", ms.Members["users.v1"].Join)

	// locations.v1 joined a live group again: refused, changing nothing.
	_, err = l.Join(ctx, "live:locations", "locations.v1")
	require.NoError(t, err)
	_, err = drop.Run(ctx, "locations.v1", false)
	require.ErrorIs(t, err, ops.ErrDropRefused)
	assert.Contains(t, err.Error(), "it is in live group live:locations")

	// Nothing moved or dropping is left: the migration may run.
	unsettled, err = adapters.NewPartitionMigrator(c, base).JoinsUnsettled(ctx, parts.Count())
	require.NoError(t, err)
	assert.Empty(t, unsettled)
}
