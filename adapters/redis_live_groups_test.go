package adapters_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/ops"
)

// TestDedupeFloor: the floor is the least position of the live group and of members still
// backfilling; a member's group not there yet means no floor; a group nobody has read from for
// longer than the limit, and that far behind, does not hold it back.
func TestDedupeFloor(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, stream := env.client, env.keys.Stream()
	now := time.Now()
	old := now.Add(-2 * time.Hour).UnixMilli()
	for i := range 3 {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: strconv.FormatInt(old+int64(i), 10) + "-0", Values: []any{"k", "v"}}).Err())
	}
	last, err := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Result()
	require.NoError(t, err)
	require.NoError(t, c.XGroupCreate(ctx, stream, "live", "$").Err())
	read := func(group string, n int64) {
		t.Helper()
		res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c1", Streams: []string{stream, ">"}, Count: n, Block: -1}).Result()
		if err != nil && err != redis.Nil {
			require.NoError(t, err)
		}
		for _, s := range res {
			for _, m := range s.Messages {
				require.NoError(t, c.XAck(ctx, stream, group, m.ID).Err())
			}
		}
	}
	read("live", 10)
	lives := map[string]ops.Membership{"live": {Members: map[string]ops.LiveMember{
		"users.v1": {Join: "0-0", Own: ops.BackfillDone},
		"users.v2": {Join: last, Own: ops.BackfillRunning},
	}}}
	floor := func(limit time.Duration) (string, bool) {
		t.Helper()
		progress, err := adapters.ReadGroupsProgress(ctx, c, stream)
		require.NoError(t, err)
		f, ok, err := adapters.DedupeFloor(ctx, c, []string{stream}, lives, progress, limit, time.Now())
		require.NoError(t, err)
		return f, ok
	}

	_, ok := floor(time.Hour)
	assert.False(t, ok, "users.v2 is backfilling and its group does not exist yet")

	require.NoError(t, c.XGroupCreate(ctx, stream, "users.v2", "0").Err())
	f, ok := floor(time.Minute)
	assert.True(t, ok)
	assert.Equal(t, "0-0", f, "a backfill that has read nothing holds the floor at the start, even with no consumer yet")

	read("users.v2", 1)
	f, _ = floor(time.Minute)
	assert.Equal(t, strconv.FormatInt(old, 10)+"-0", f, "the backfill is the least advanced")
	f, _ = floor(time.Hour)
	assert.Equal(t, strconv.FormatInt(old, 10)+"-0", f)

	// Nobody reads users.v2 for longer than the limit while it is that far behind: abandoned.
	time.Sleep(120 * time.Millisecond)
	read("live", 10) // live is read all along
	f, ok = floor(100 * time.Millisecond)
	assert.True(t, ok)
	assert.Equal(t, last, f, "an abandoned backfill does not hold the floor back")
	f, _ = floor(time.Hour)
	assert.Equal(t, strconv.FormatInt(old, 10)+"-0", f, "idle for less than the limit: it still holds")
}
