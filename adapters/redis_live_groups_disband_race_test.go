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
)

// racingLive runs after() right after DestroyFinishedOwnGroup answers: a disband that lands
// between RemoveFinishedBackfills' checked destroy and its unconditional removeOwnGroup.
type racingLive struct {
	ops.LiveGroups
	after func()
}

func (r racingLive) DestroyFinishedOwnGroup(ctx context.Context, group, member, token string, hold time.Duration) (bool, error) {
	d, err := r.LiveGroups.DestroyFinishedOwnGroup(ctx, group, member, token, hold)
	if d && r.after != nil {
		r.after()
	}
	return d, err
}

// TestFinishedBackfillRemovalRacingADisbandKeepsTheMovedGroup: RemoveFinishedBackfills checks
// the membership and destroys the finished backfill's group in one script, then removes what
// the group left (its markers: all of them). A disband in between would make a group of that
// name whose markers that removal would take, or (before) whose group a second destroy would
// remove, and the version's next join would start over from the whole history: it is refused
// until the removal is done, and then goes ahead; the moved version's group stands where the live
// group stopped.
func TestFinishedBackfillRemovalRacingADisbandKeepsTheMovedGroup(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	l := adapters.NewLiveGroups(c, keys)
	stream := keys.Stream()
	add := func() string {
		id, err := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Result()
		require.NoError(t, err)
		return id
	}
	add()
	require.NoError(t, c.XGroupCreate(ctx, stream, "live", "$").Err())
	_, err := l.Join(ctx, "live", "users.v1") // the live group had delivered: users.v1 backfills
	require.NoError(t, err)
	_, err = l.FinishBackfill(ctx, "live", "users.v1", time.Now().Add(-time.Hour)) // done long ago
	require.NoError(t, err)
	var last string
	for range 5 {
		last = add()
	}
	// The live group applied and acknowledged everything; its projectors stopped.
	res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c1", Streams: []string{stream, ">"}, Block: -1}).Result()
	require.NoError(t, err)
	for _, m := range res[0].Messages {
		require.NoError(t, c.XAck(ctx, stream, "live", m.ID).Err())
	}
	time.Sleep(5 * time.Millisecond)

	b := adapters.NewOpsBackend(c, keys)
	b.Live = racingLive{LiveGroups: b.Live, after: func() {
		_, err := l.Disband(ctx, "live", time.Millisecond, true)
		require.ErrorIs(t, err, ops.ErrDisbandRefused, "not while what the group left is being removed")
		assert.Contains(t, err.Error(), "is still there or being removed")
	}}
	rb := removalRun(t, b, time.Second)
	require.NoError(t, rb.RemoveFinishedBackfills(ctx))
	rep, err := l.Disband(ctx, "live", time.Millisecond, true)
	require.NoError(t, err)
	require.True(t, rep.Done)

	moved, err := l.ReadMoved(ctx)
	require.NoError(t, err)
	require.Contains(t, moved[stream], "users.v1")
	assert.Equal(t, last, moved[stream]["users.v1"].Pos)
	gs, err := c.XInfoGroups(ctx, stream).Result()
	require.NoError(t, err)
	names := []string{}
	for _, g := range gs {
		names = append(names, g.Name)
	}
	assert.Contains(t, names, "users.v1", "the moved version's own group (at %s) must survive", last)

	// A projector of the new set joins it.
	ms, err := l.Join(ctx, "live:users", "users.v1")
	require.NoError(t, err)
	t.Logf("users.v1 in live:users: %+v", ms.Members["users.v1"])
	gs, err = c.XInfoGroups(ctx, stream).Result()
	require.NoError(t, err)
	for _, g := range gs {
		t.Logf("group %s last-delivered %s", g.Name, g.LastDeliveredID)
		if g.Name == "users.v1" || g.Name == "live:users" && ms.Members["users.v1"].Join == "0-0" {
			assert.Equal(t, last, g.LastDeliveredID, "users.v1 had applied through %s: its own group must not deliver that history again", last)
		}
	}
}
