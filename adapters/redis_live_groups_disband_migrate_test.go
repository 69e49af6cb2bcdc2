package adapters_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
)

// TestMigrationWaitsForMovedVersions: a version disbanded from its live group and not yet joined
// to another has a moved:<member> record in each partition's registry, which a partition
// migration would not translate (its own group would then hold no dedupe floor, and its join
// would be taken for an upgrade). The migration refuses to start, naming it, and changes nothing.
func TestMigrationWaitsForMovedVersions(t *testing.T) {
	t.Parallel()
	client, keys, parts, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	k2, err := keys.WithPartitions(2)
	require.NoError(t, err)
	for i, u := range []int64{u0, u1} {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(i), ID: "1-1", Values: checkinValues("a"+string(rune('0'+i)), u)}).Err())
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(i), ID: "2-0", Values: checkinValues("b"+string(rune('0'+i)), u)}).Err())
		require.NoError(t, client.XGroupCreate(ctx, parts.Stream(i), "live", "2-0").Err())
		require.NoError(t, client.HSet(ctx, parts.Registry(i), "live:live", `{"users.v1":{"join":"0-0","own":"done","doneAt":"1"}}`,
			"acked:live", "2-0").Err())
	}
	rep, err := adapters.NewLiveGroups(client, k2).Disband(ctx, "live", time.Millisecond, true)
	require.NoError(t, err)
	require.True(t, rep.Done)

	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(client, keys))
	require.NoError(t, err)
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "users.v1 was taken out of live group live by `checkins projections disband` and has joined no other yet")
	moved, err := adapters.NewLiveGroups(client, k2).ReadMoved(ctx)
	require.NoError(t, err)
	assert.Len(t, moved, 2, "nothing changed")
	n, err := client.Exists(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "no copy to one stream was started")
}

// TestFinishedBackfillRemovalSparesADisbandedVersionsGroup: the disband refuses while a member's
// finished backfill's group is there, which a running projector removes after the grace; once it
// is removed the disband makes a group of the same name, and removing finished backfills (a
// projector that read the membership before the disband) must not destroy it: the destroy checks
// the membership in the same step.
func TestFinishedBackfillRemovalSparesADisbandedVersionsGroup(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	l := adapters.NewLiveGroups(c, keys)
	require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: []any{"k", "v"}}).Err())
	require.NoError(t, c.XGroupCreate(ctx, keys.Stream(), "live", "$").Err())
	_, err := l.Join(ctx, "live", "users.v1") // the live group exists: users.v1 backfills
	require.NoError(t, err)
	_, err = l.FinishBackfill(ctx, "live", "users.v1", time.Now().Add(-time.Hour))
	require.NoError(t, err)

	_, err = l.Disband(ctx, "live", time.Millisecond, true)
	require.ErrorIs(t, err, ops.ErrDisbandRefused)
	rb := removalRun(t, adapters.NewOpsBackend(c, keys), time.Second)
	require.NoError(t, rb.RemoveFinishedBackfills(ctx))
	rep, err := l.Disband(ctx, "live", time.Millisecond, true)
	require.NoError(t, err)
	require.True(t, rep.Done)

	destroyed, err := l.DestroyFinishedOwnGroup(ctx, "live", "users.v1", "t1", time.Minute)
	require.NoError(t, err)
	assert.False(t, destroyed, "a moved version's group is no finished backfill")
	require.NoError(t, rb.RemoveFinishedBackfills(ctx))
	gs, err := c.XInfoGroups(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	require.Len(t, gs, 1)
	assert.Equal(t, "users.v1", gs[0].Name)

	// Joined again and finished: now it goes.
	_, err = l.Join(ctx, "live:users", "users.v1")
	require.NoError(t, err)
	_, err = l.FinishBackfill(ctx, "live:users", "users.v1", time.Now().Add(-time.Hour))
	require.NoError(t, err)
	destroyed, err = l.DestroyFinishedOwnGroup(ctx, "live:users", "users.v1", "t1", time.Minute)
	require.NoError(t, err)
	assert.True(t, destroyed)
}
