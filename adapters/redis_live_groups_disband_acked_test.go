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
	"github.com/checkins/checkins/app/projection"
)

// TestDisbandReplacesAFinishedBackfillsCheckpoint: users.v1's own group, left over from a
// finished backfill, had read and acknowledged past the live group's position (it reads on until
// its handler stops, acknowledging what is not for it), and its checkpoint acked:users.v1 says
// so. The disband refuses while that group is there; once it is removed with its checkpoint (as
// a running projector does after the grace), the disband gives users.v1 a group at the live
// group's position P and a checkpoint there, not above: the projector takes a group's markers
// below its checkpoint as stale (the applier's prune bound), so with the old checkpoint an entry
// after P applied but not yet acknowledged, delivered again, was applied again.
func TestDisbandReplacesAFinishedBackfillsCheckpoint(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	stream := keys.Stream()
	ids := []string{"1000-0", "2000-0", "3000-0", "4000-0", "5000-0", "6000-0"}
	for _, id := range ids[:3] {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: id, Values: []any{"k", "v"}}).Err())
	}
	l := adapters.NewLiveGroups(c, keys)
	// locations.v1 first: the live group starts at the beginning; users.v1 joins at 3000-0 and
	// backfills through users.v1.
	require.NoError(t, c.XGroupCreate(ctx, stream, "live", "0").Err())
	read := func(group, through string) {
		for {
			res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c1", Streams: []string{stream, ">"}, Count: 1, Block: -1}).Result()
			require.NoError(t, err)
			id := res[0].Messages[0].ID
			require.NoError(t, c.XAck(ctx, stream, group, id).Err())
			if id == through {
				return
			}
		}
	}
	read("live", "1000-0")
	ms, err := l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	require.Equal(t, "3000-0", ms.Members["users.v1"].Join)
	for _, id := range ids[3:] {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: id, Values: []any{"k", "v"}}).Err())
	}
	read("users.v1", "6000-0") // the backfill, and on past its join until its handler stopped
	read("live", "4000-0")     // the live group past the join
	require.NoError(t, l.Checkpoint(ctx, stream, "users.v1", "6000-0"))
	require.NoError(t, l.Checkpoint(ctx, stream, "live", "4000-0"))
	_, err = l.FinishBackfill(ctx, "live", "users.v1", time.Now())
	require.NoError(t, err)

	time.Sleep(20 * time.Millisecond)
	d, err := command.NewDisbandLiveGroup(adapters.NewOpsBackend(c, keys), 10*time.Millisecond)
	require.NoError(t, err)
	_, err = d.Run(ctx, "live", false)
	require.ErrorIs(t, err, ops.ErrDisbandRefused, "not while the finished backfill's group is there")
	removeFinishedBackfills(t, c, keys)
	rep, err := d.Run(ctx, "live", false)
	require.NoError(t, err)
	require.Equal(t, "4000-0", rep.Positions[stream])

	// users.v1 joins live:users and backfills 5000-0 and 6000-0 through its own group.
	require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: "7000-0", Values: []any{"k", "v"}}).Err())
	_, err = l.Join(ctx, "live:users", "users.v1")
	require.NoError(t, err)
	acked, err := l.Acked(ctx, stream, "users.v1")
	require.NoError(t, err)
	assert.True(t, acked == "" || acked <= "4000-0", "users.v1's checkpoint %q is above its own group's position 4000-0", acked)

	// The projector applies 5000-0 through users.v1 (its prune bound: the checkpoints it read),
	// crashes before the XACK, and the entry is delivered again.
	a := env.applier(t, c)
	ev := recorded("ck-5", 42, 7, 4, 5000)
	us, err := projection.Updates(ctx, projection.UserStats{}, ev)
	require.NoError(t, err)
	prune := func(group string) (string, bool) {
		_, ackedAll, err := l.ReadAll(ctx)
		require.NoError(t, err)
		a, ok := ackedAll[group]
		return a, ok
	}
	apply := func() projection.Outcome {
		out, err := a.Apply(ctx, []projection.Work{{Group: "users.v1", Projection: "users", Version: 1,
			Event: projection.RefOf(ev, "5000-0"), Updates: us}}, prune)
		require.NoError(t, err)
		return out[0]
	}
	require.Equal(t, projection.Applied, apply())
	assert.Equal(t, projection.AlreadyApplied, apply(), "a redelivery in the group")
	assert.Equal(t, int64(1), env.userStats(t, 42).NumCheckins)
}
