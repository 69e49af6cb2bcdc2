package adapters_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
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
		f, ok, err := adapters.DedupeFloor(ctx, c, []string{stream}, lives, nil, progress, limit, time.Now())
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

// roundTrips counts the round trips a client makes: a command or a pipeline each.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { r.n.Add(1); return next(ctx, cmd) }
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { r.n.Add(1); return next(ctx, cmds) }
}

// TestCheckpointRoundTripsDoNotGrowWithPartitions: what the projector does every checkpoint
// (read every group's progress, record the positions, compute the dedupe floors) takes as many
// round trips with 24 partitions as with one, and gives each partition its own answer. A round
// trip per partition made a checkpoint of 24 partitions take 2 s during a drain (each waits
// behind the projection scripts), so the dedupe registries were pruned by floors a whole drain
// old and kept nearly every identity of history (bench memory phase, STREAM_PARTITIONS=24).
func TestCheckpointRoundTripsDoNotGrowWithPartitions(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	old := time.Now().Add(-2 * time.Hour).UnixMilli() // far behind now: the abandoned-group check runs
	checkpoint := func(p int) (trips int64) {
		t.Helper()
		base := env.keys
		base.Prefix += ":p" + strconv.Itoa(p)
		keys, err := base.WithPartitions(p)
		require.NoError(t, err)
		parts := keys.Partitions()
		want := make([]string, p)
		for i, stream := range parts.Streams() {
			// Three entries per partition, at times of its own; two read, the first acknowledged.
			var ids []string
			for j := range 3 {
				id := strconv.FormatInt(old+int64(100*i+j), 10) + "-0"
				require.NoError(t, env.client.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: id, Values: []any{"k", "v"}}).Err())
				ids = append(ids, id)
			}
			require.NoError(t, env.client.XGroupCreate(ctx, stream, "live", "0").Err())
			_, err := env.client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c1", Streams: []string{stream, ">"}, Count: 2, Block: -1}).Result()
			require.NoError(t, err)
			require.NoError(t, env.client.XAck(ctx, stream, "live", ids[0]).Err())
			want[i], _ = ops.PrevEntryID(ids[1])
		}
		// The checkpoint script loaded already, as it is after a projector's first checkpoint.
		require.NoError(t, adapters.NewProjectorBackend(env.client, keys).Checkpoints(ctx, "live", map[string]string{parts.Stream(0): "0-1"}))
		counter := &roundTrips{}
		c := redistest.Client(t, env.url)
		c.AddHook(counter)
		b := adapters.NewProjectorBackend(c, keys)
		for i := range p {
			require.NoError(t, env.client.HSet(ctx, parts.Registry(i), "live:live", `{"users.v1":{"join":"0-0","own":"done"}}`).Err())
		}

		progress, err := b.Positions(ctx)
		require.NoError(t, err)
		acked := map[string]string{}
		for _, stream := range parts.Streams() {
			pos, ok := progress["live"].On(stream)
			require.True(t, ok, stream)
			acked[stream] = pos.AckedThrough
		}
		require.NoError(t, b.Checkpoints(ctx, "live", acked))
		floors, ok, err := b.DedupeFloors(ctx, progress, time.Hour, time.Now())
		require.NoError(t, err)
		require.True(t, ok)
		trips = counter.n.Load()

		assert.Equal(t, want, floors, "each partition's floor is the entry before its oldest pending one")
		for _, stream := range parts.Streams() {
			got, err := b.Acked(ctx, stream, "live")
			require.NoError(t, err)
			assert.Equal(t, acked[stream], got, "the checkpoint of %s", stream)
		}
		return trips
	}
	one, many := checkpoint(1), checkpoint(24)
	assert.Equal(t, one, many, "round trips of a checkpoint: %d with one stream, %d with 24 partitions", one, many)
}
