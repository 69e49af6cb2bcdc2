package adapters_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/query"
)

// TestPartitionStallIsPerPartition: with two partitions, a group stuck on one (an entry pending
// for ever) is stalled although it keeps progressing on the other; the stream admin sums the
// partitions up (length, pending) and keeps each one's figures.
func TestPartitionStallIsPerPartition(t *testing.T) {
	t.Parallel()
	c, keys, admin := partitionedGroup(t, 2)
	ctx := context.Background()
	parts := keys.Partitions()
	add := func(i int) {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(i), Values: map[string]any{"k": "v"}}).Err())
	}
	read := func(i int, ack bool) {
		xs, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{parts.Stream(i), ">"}, Count: 10, Block: -1}).Result()
		require.NoError(t, err)
		if ack {
			for _, x := range xs[0].Messages {
				require.NoError(t, c.XAck(ctx, parts.Stream(i), "g", x.ID).Err())
			}
		}
	}
	add(0)
	read(0, false) // stuck: pending on partition 0 for ever
	add(1)
	read(1, true)

	info, err := admin.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), info.Length)
	g := info.Group("g")
	require.NotNil(t, g)
	assert.Equal(t, int64(1), g.Pending)
	assert.Len(t, g.Parts, 2)
	first, err := c.XRangeN(ctx, parts.Stream(0), "-", "+", 1).Result()
	require.NoError(t, err)
	assert.Equal(t, first[0].ID, g.OldestPendingID, "the oldest pending entry of all partitions")

	b := adapters.NewOpsBackend(c, keys)
	mon := query.NewProgressMonitor(b, 300*time.Millisecond, query.FixedGroups([]string{"g"}))
	gs, _, err := mon.Check(ctx)
	require.NoError(t, err)
	require.Len(t, gs, 1)
	assert.False(t, gs[0].Stalled, "just seen")
	for range 8 { // partition 1 progresses all along
		time.Sleep(60 * time.Millisecond)
		add(1)
		read(1, true)
	}
	gs, _, err = mon.Check(ctx)
	require.NoError(t, err)
	assert.True(t, gs[0].Stalled, "stuck on partition 0 while partition 1 progresses: %+v", gs[0])
	assert.True(t, strings.Contains(gs[0].StallCause, parts.Stream(0)) && !strings.Contains(gs[0].StallCause, parts.Stream(1)),
		"the cause names the stuck partition only: %s", gs[0].StallCause)
}

// TestPartitionedInfoSumsUp: with three partitions, the stream admin's figures for a group are
// the partitions' summed up: its pending entries in total, its oldest pending entry the oldest of
// all the partitions' (here on the last partition, the older of two pending ones), its lag the
// total of what it has not read.
func TestPartitionedInfoSumsUp(t *testing.T) {
	t.Parallel()
	c, keys, admin := partitionedGroup(t, 3)
	ctx := context.Background()
	parts := keys.Partitions()
	add := func(i int, id string) {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(i), ID: id, Values: map[string]any{"k": "v"}}).Err())
	}
	read := func(i int) {
		_, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{parts.Stream(i), ">"}, Count: 1, Block: -1}).Result()
		require.NoError(t, err)
	}
	add(2, "1000-0") // the oldest entry, pending on the last partition
	add(1, "2000-0") // pending on partition 1
	add(0, "3000-0") // partition 0: read and acknowledged
	read(2)
	read(1)
	read(0)
	require.NoError(t, c.XAck(ctx, parts.Stream(0), "g", "3000-0").Err())
	add(0, "4000-0") // not read yet: lag 1 on partition 0
	add(1, "5000-0") // and 1 on partition 1

	info, err := admin.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(5), info.Length)
	g := info.Group("g")
	require.NotNil(t, g)
	assert.Equal(t, int64(2), g.Pending, "pending on partitions 1 and 2")
	assert.Equal(t, "1000-0", g.OldestPendingID, "the oldest pending entry of all the partitions, not the first partition's")
	assert.Equal(t, int64(2), g.Lag, "unread on partitions 0 and 1")
	assert.Len(t, g.Parts, 3)
}

// partitionedGroup is a key space of p stream partitions on a private prefix, its stream admin,
// and the consumer group "g" created on every partition.
func partitionedGroup(t *testing.T, p int) (*redis.Client, adapters.KeySpace, *adapters.StreamAdmin) {
	t.Helper()
	env := redistest.Open(t)
	c := redistest.Client(t, env.URL)
	keys, err := adapters.KeySpace{Prefix: env.Prefix}.WithPartitions(p)
	require.NoError(t, err)
	admin := adapters.NewStreamAdmin(c, keys)
	require.NoError(t, admin.CreateGroup(context.Background(), "g", "0"))
	return c, keys, admin
}

// TestPartitionWithoutTheGroupCountsAsLag: with 2 partitions, the group exists on
// partition 0 (caught up) but not on partition 1 (a master that came back empty, a lost join),
// where 5 entries wait. With one stream a missing group makes the whole stream lag (and stalls
// after STALL_AFTER); with partitions those 5 entries must count as lag too, and the group must
// be reported stalled after STALL_AFTER (README: "/readyz answers 503 after STALL_AFTER, naming
// the group").
func TestPartitionWithoutTheGroupCountsAsLag(t *testing.T) {
	t.Parallel()
	c, keys, admin := partitionedGroup(t, 2)
	ctx := context.Background()
	parts := keys.Partitions()
	// partition 0: one entry, read and acknowledged.
	require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(0), Values: map[string]any{"k": "v"}}).Err())
	xs, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{parts.Stream(0), ">"}, Count: 10, Block: -1}).Result()
	require.NoError(t, err)
	require.NoError(t, c.XAck(ctx, parts.Stream(0), "g", xs[0].Messages[0].ID).Err())
	// partition 1 loses the group; entries keep arriving there.
	require.NoError(t, c.XGroupDestroy(ctx, parts.Stream(1), "g").Err())
	for range 5 {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(1), Values: map[string]any{"k": "v"}}).Err())
	}

	info, err := admin.Info(ctx)
	require.NoError(t, err)
	g := info.Group("g")
	require.NotNil(t, g)
	assert.Equal(t, int64(5), g.Lag, "the 5 entries of the partition without the group are undelivered")

	mon := query.NewProgressMonitor(adapters.NewOpsBackend(c, keys), 200*time.Millisecond, query.FixedGroups([]string{"g"}))
	gs, _, err := mon.Check(ctx)
	require.NoError(t, err)
	time.Sleep(400 * time.Millisecond)
	gs, _, err = mon.Check(ctx)
	require.NoError(t, err)
	require.Len(t, gs, 1)
	assert.Equal(t, int64(5), gs[0].Lag, "lag as reported to /metrics and status")
	assert.True(t, gs[0].Stalled, "nothing can consume partition 1: stalled after STALL_AFTER: %+v", gs[0])
	assert.Contains(t, gs[0].StallCause, parts.Stream(1)+" (lag 5: the group does not exist there")
	p1, ok := g.On(parts.Stream(1))
	assert.False(t, ok, "the group is not on partition 1: %+v", p1)
}

// stuckUnderOOM: a group stuck with an entry pending for ever on each of partitions, and Redis
// refusing writes (out of memory), so a monitor cannot store its observations.
func stuckUnderOOM(t *testing.T, partitions int) (*redis.Client, adapters.KeySpace) {
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Client(t, srv.URL())
	ctx := context.Background()
	keys, err := adapters.KeySpace{Prefix: "oom"}.WithPartitions(partitions)
	require.NoError(t, err)
	admin := adapters.NewStreamAdmin(c, keys)
	require.NoError(t, admin.CreateGroup(ctx, "g", "0"))
	parts := keys.Partitions()
	for i := range partitions {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(i), Values: map[string]any{"k": "v"}}).Err())
		// read, never acknowledged: stuck
		require.NoError(t, c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{parts.Stream(i), ">"}, Count: 1, Block: -1}).Err())
	}
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err())
	t.Cleanup(func() { _ = c.ConfigSet(context.Background(), "maxmemory", "0").Err() })
	require.ErrorContains(t, c.HSet(ctx, keys.Progress(), "x", "y").Err(), "OOM", "writes are refused")
	return c, keys
}

// stallUnderOOM: /readyz and /metrics "only read, and keep working under OOM" (README): the
// process keeps the observation itself (ProgressMonitor.local), and the stuck group must still
// be reported stalled after STALL_AFTER.
func stallUnderOOM(t *testing.T, partitions int) query.GroupProgress {
	c, keys := stuckUnderOOM(t, partitions)
	ctx := context.Background()
	mon := query.NewProgressMonitor(adapters.NewOpsBackend(c, keys), 200*time.Millisecond, query.FixedGroups([]string{"g"}))
	_, _, err := mon.Check(ctx)
	require.NoError(t, err)
	time.Sleep(400 * time.Millisecond)
	gs, _, err := mon.Check(ctx)
	require.NoError(t, err)
	require.Len(t, gs, 1)
	return gs[0]
}

// TestStatusFlagsStallsUnderOOM: `checkins status`, GET /ops/status and the projections' list
// flag a stuck group while Redis refuses writes too, as /readyz does: they made a monitor per
// call, so what the process observed itself was gone by the next call and nothing was ever
// stalled.
func TestStatusFlagsStallsUnderOOM(t *testing.T) {
	t.Parallel()
	c, keys := stuckUnderOOM(t, 1)
	ctx := context.Background()
	status, err := query.NewStatus(adapters.NewOpsBackend(c, keys), nil, 200*time.Millisecond)
	require.NoError(t, err)
	_, err = status.Status(ctx)
	require.NoError(t, err)
	time.Sleep(400 * time.Millisecond)
	st, err := status.Status(ctx)
	require.NoError(t, err)
	require.Len(t, st.Projections, 1)
	assert.True(t, st.Projections[0].Stalled, "%+v", st.Projections[0])
	assert.Contains(t, st.Projections[0].StallCause, "no progress")
}

// TestStallUnderOOM: with one stream and with partitions, a group stuck while Redis refuses
// the monitor's writes is stalled after STALL_AFTER; with partitions every check started again
// from "now" (the observation the process kept was not read).
func TestStallUnderOOM(t *testing.T) {
	t.Parallel()
	for _, p := range []int{1, 2} {
		g := stallUnderOOM(t, p)
		assert.True(t, g.Stalled, "%d partitions: stuck for longer than STALL_AFTER: %+v", p, g)
	}
}
