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

// staleLive runs after() once, right after ReadAll answered: a projector (of another live group)
// whose RemoveFinishedBackfills read the membership, then stood still while others acted.
type staleLive struct {
	ops.LiveGroups
	after func()
	done  *bool
}

func (s staleLive) ReadAll(ctx context.Context) (map[string]ops.Membership, map[string]string, error) {
	a, b, err := s.LiveGroups.ReadAll(ctx)
	if !*s.done {
		*s.done = true
		s.after()
	}
	return a, b, err
}

// TestStaleFinishedBackfillRemovalKeepsTheMovedGroupsState: RemoveFinishedBackfills now
// forgets a finished backfill's markers, acked: (and seen:) and observation first and destroys
// the group last, checked. A projector P that read the membership (users.v1 in live, done long
// ago) and then stood still, while another removed that group (as the LEFTOVER refusal tells the
// operator to have done), the disband made users.v1's own group of the same name at the live
// group's position (with acked:users.v1 there) and users.v1 joined another set and applied
// through it, forgets all of that before its checked destroy finds the group is no finished
// backfill and keeps it. Before 70d6777 the checked destroy came first and P changed nothing.
func TestStaleFinishedBackfillRemovalKeepsTheMovedGroupsState(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	l := adapters.NewLiveGroups(c, keys)
	stream := keys.Stream()
	reg := keys.Partitions().Registry(0)
	add := func() string {
		id, err := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Result()
		require.NoError(t, err)
		return id
	}
	add()
	require.NoError(t, c.XGroupCreate(ctx, stream, "live", "$").Err())
	_, err := l.Join(ctx, "live", "users.v1") // users.v1 backfills
	require.NoError(t, err)
	_, err = l.FinishBackfill(ctx, "live", "users.v1", time.Now().Add(-time.Hour)) // done long ago
	require.NoError(t, err)
	var last string
	for range 5 {
		last = add()
	}
	res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c1", Streams: []string{stream, ">"}, Block: -1}).Result()
	require.NoError(t, err)
	for _, m := range res[0].Messages {
		require.NoError(t, c.XAck(ctx, stream, "live", m.ID).Err())
	}
	time.Sleep(5 * time.Millisecond)

	newRB := func(b ops.Backend) *command.RebuildProjection {
		return removalRun(t, b, time.Second)
	}
	marker := keys.MarkerPrefix("users.v1") + "{0}"
	done := false
	stale := adapters.NewOpsBackend(c, keys)
	stale.Live = staleLive{LiveGroups: stale.Live, done: &done, after: func() {
		// Another projector removes the finished backfill's group; the operator disbands live.
		require.NoError(t, newRB(adapters.NewOpsBackend(c, keys)).RemoveFinishedBackfills(ctx))
		rep, err := l.Disband(ctx, "live", time.Millisecond, true)
		require.NoError(t, err)
		require.True(t, rep.Done)
		// users.v1 joins another set and its backfill applies a batch through its own group.
		_, err = l.Join(ctx, "live:users", "users.v1")
		require.NoError(t, err)
		require.NoError(t, c.Set(ctx, marker, "applied", 0).Err())
	}}
	require.NoError(t, newRB(stale).RemoveFinishedBackfills(ctx))
	require.True(t, done)

	gs, err := c.XInfoGroups(ctx, stream).Result()
	require.NoError(t, err)
	found := false
	for _, g := range gs {
		if g.Name == "users.v1" {
			found = true
		}
	}
	require.True(t, found, "the checked destroy kept the moved version's group")
	got, err := c.HGet(ctx, reg, "acked:users.v1").Result()
	assert.NoError(t, err, "acked:users.v1 (where the disband put the group, %s) is gone: a group lost before its first checkpoint is made again at the start", last)
	assert.Equal(t, last, got)
	n, err := c.Exists(ctx, marker).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "the markers of the group users.v1 backfills through were removed while it runs: a redelivered batch is applied twice")
}
