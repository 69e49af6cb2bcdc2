package adapters_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/ops"
)

// leaveFails fails LiveGroups.Leave: the switch's second Redis call (Promote done, the old
// version not yet out of its live group) does not happen, as after a timeout or a SIGTERM of
// the driver between the two.
type leaveFails struct{ ops.LiveGroups }

func (leaveFails) Leave(context.Context, string, string) error {
	return errors.New("i/o timeout (injected)")
}

// TestDisbandOfARetiringVersionLeavesNoMovedRecord: a rebuild of users switched
// reads to v2, but its driver stopped before taking v1 out of the live group (v1 stays a member
// until RemoveOld, after the grace, takes it out). The projectors of the group are stopped and
// the group disbanded: v1, retiring, is moved with v2. A projector of the new set runs users: it
// joins v2 (the serving version; a retiring one is no target), and its rebuild step removes v1
// (its group and keys) and its moved record with it. Nothing ever joins v1 again: that record
// refused every partition migration for good ("start a projector that runs it": none ever
// will), held the dedupe floors for the window, and `disband live` reported v1 as waiting to join
// (found by a review).
func TestDisbandOfARetiringVersionLeavesNoMovedRecord(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	stream := keys.Stream()
	b := adapters.NewOpsBackend(c, keys)
	l := adapters.NewLiveGroups(c, keys)
	add := func() string {
		id, err := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Result()
		require.NoError(t, err)
		return id
	}
	readAck := func(group string) {
		t.Helper()
		res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c1", Streams: []string{stream, ">"}, Block: -1}).Result()
		if errors.Is(err, redis.Nil) {
			return
		}
		require.NoError(t, err)
		for _, m := range res[0].Messages {
			require.NoError(t, c.XAck(ctx, stream, group, m.ID).Err())
		}
	}
	add()
	// A first start: users.v1 joins at the start, the live group feeds it.
	_, err := l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	add()
	readAck("live")

	// A rebuild of users: v2 joins the live group and backfills through its own group.
	rb := removalRun(t, b, time.Millisecond)
	_, err = rb.Start(ctx, "users")
	require.NoError(t, err)
	_, err = l.Join(ctx, "live", "users.v2")
	require.NoError(t, err)
	readAck("users.v2")
	add()
	readAck("live")

	// The switch: reads go to v2, then its driver fails before v1 leaves the live group.
	b2 := b
	b2.Live = leaveFails{b.Live}
	_, err = removalRun(t, b2, time.Millisecond).Step(ctx, "users")
	require.Error(t, err, "the leave failed")
	st, err := b.Registry.State(ctx, "users")
	require.NoError(t, err)
	require.Equal(t, 2, st.Serving)
	require.Equal(t, 1, st.Retiring)
	ms, err := l.Read(ctx, "live")
	require.NoError(t, err)
	require.Contains(t, ms.Members, "users.v1", "v1 is still in the live group until RemoveOld")

	// v2's finished backfill's group is removed (a projector of another group does it).
	time.Sleep(5 * time.Millisecond)
	require.NoError(t, rb.RemoveFinishedBackfills(ctx))

	// The projectors of live are stopped; the group is disbanded.
	time.Sleep(5 * time.Millisecond)
	rep, err := l.Disband(ctx, "live", time.Millisecond, true)
	require.NoError(t, err)
	require.NoError(t, l.EndDisband(ctx, "live")) // its markers removed (the command does both)
	t.Logf("disband: %+v", rep)

	// A projector of the new set runs users: it joins its targets (serving v2 only) and steps
	// the rebuild, which removes v1 after the grace.
	targets := []string{"users.v2"}
	for _, m := range targets {
		_, err = l.Join(ctx, "live:users", m)
		require.NoError(t, err)
	}
	time.Sleep(5 * time.Millisecond)
	rp, err := rb.Step(ctx, "users")
	require.NoError(t, err)
	require.Equal(t, ops.RebuildDone, rp.State, "v1 retired")
	gs, err := c.XInfoGroups(ctx, stream).Result()
	require.NoError(t, err)
	for _, g := range gs {
		require.NotEqual(t, "users.v1", g.Name, "v1's group is gone with it")
	}

	moved, err := l.ReadMoved(ctx)
	require.NoError(t, err)
	assert.NotContains(t, moved[stream], "users.v1", "v1 is retired: no projector will ever join it, its moved record must not outlive it")
	unsettled, err := adapters.NewPartitionMigrator(c, keys).JoinsUnsettled(ctx, 1)
	require.NoError(t, err)
	assert.Empty(t, unsettled, "a partition migration is refused for good")
	// And every projector's dedupe floors stay unknown (no registry is pruned) for the window:
	// the retired version's moved record names a group that is gone.
	progress, err := adapters.ReadPartitionsProgress(ctx, c, keys.Partitions())
	require.NoError(t, err)
	lives, _, err := l.ReadAll(ctx)
	require.NoError(t, err)
	_, ok, err := adapters.DedupeFloors(ctx, c, keys.Partitions().Streams(), lives, moved, progress, time.Hour, time.Now())
	require.NoError(t, err)
	assert.True(t, ok, "the floors are held back by the moved record of a version that is gone")
	rep, err = l.Disband(ctx, "live", time.Millisecond, true)
	require.NoError(t, err)
	assert.NotContains(t, rep.Members, "users.v1", "disband live reports the retired v1 as waiting to join another group")
}
