package ports_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/query"
)

// TestBackfillToGoWithUnknownEntriesReadOnPartitions: with stream partitions, an own group
// that Redis lost and the checkpoint recreated where it had acknowledged through (XGROUP CREATE
// at a mid-stream ID) has no entries-read Redis knows (XINFO GROUPS: entries-read and lag nil,
// for good). BackfillLag says it then reports the group's lag as before; but with partitions,
// StreamAdmin.Info has already replaced each partition's nil lag by a count (ops.GroupLag), so
// the `gi.Lag < 0` guard never fires and the figure is entries-added - 0: the whole history of
// the partition "to go". Here each partition's backfill has 1 entry left up to its join (4 in
// all; 204 with the 200 after the join, the group lag of before), and the status said 1000.
// GroupInfo.Counted now says whether Redis told the counters, per partition. (Found by a review
// helper.)
func TestBackfillToGoWithUnknownEntriesReadOnPartitions(t *testing.T) {
	t.Parallel()
	e := newPartitionedEnv(t, 4)
	e.add(25) // 1,000 entries, which v1 applies
	require.Eventually(t, func() bool { s, _ := e.total(); return s == 1000 }, 15*time.Second, 20*time.Millisecond)
	e.paused.Store(true) // v2's own groups read nothing
	_, err := e.a.Commands.RebuildProjection.Start(e.ctx, "users")
	require.NoError(t, err)
	targets, err := e.a.Queries.ProjectionVersions.Targets(e.ctx, e.projs)
	require.NoError(t, err)
	_, _, err = e.router.SetTargets(e.ctx, targets) // v2 joins at each partition's end
	require.NoError(t, err)
	e.add(5) // 200 after the join

	// v2's own group on each partition is lost and recreated one entry before the join (where
	// it had acknowledged through), as the checkpoint does: atomically, so nothing else does.
	for i := range 4 {
		raw, err := e.client.HGet(e.ctx, e.parts.Registry(i), "live:live").Result()
		require.NoError(t, err)
		ms, err := adapters.ParseMembership("live", raw)
		require.NoError(t, err)
		join := ms.Members["users.v2"].Join
		xs, err := e.client.XRevRangeN(e.ctx, e.parts.Stream(i), join, "-", 2).Result()
		require.NoError(t, err)
		require.Len(t, xs, 2)
		_, err = e.client.TxPipelined(e.ctx, func(p redis.Pipeliner) error {
			p.XGroupDestroy(e.ctx, e.parts.Stream(i), "users.v2")
			p.XGroupCreate(e.ctx, e.parts.Stream(i), "users.v2", xs[1].ID)
			return nil
		})
		require.NoError(t, err)
	}

	rep, err := e.a.Queries.ProjectionVersions.List(e.ctx)
	require.NoError(t, err)
	var v2 *query.ProjectionVersionStatus
	for i := range rep.Versions {
		if rep.Versions[i].Projection == "users" && rep.Versions[i].Version == 2 {
			v2 = &rep.Versions[i]
		}
	}
	require.NotNil(t, v2, "v2 in %+v", rep.Versions)
	require.Equal(t, ops.BackfillRunning, v2.Backfill)
	require.NotNil(t, v2.Lag)
	assert.LessOrEqual(t, *v2.Lag, int64(204), "4 entries up to the joins (204 counting those after: the group lag); state %q", v2.State)

	rp, err := e.a.Commands.RebuildProjection.Step(e.ctx, "users")
	require.NoError(t, err)
	assert.LessOrEqual(t, rp.Lag, int64(204), "the rebuild's progress")
}
