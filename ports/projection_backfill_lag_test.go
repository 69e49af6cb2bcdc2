package ports_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/query"
)

// TestBackfillToGoCountsUpToTheJoin: while v2 backfills, the check-ins recorded after its join
// reach it through the live group; the status said its own group's lag, which counts them too,
// so a rebuild under load never came near "0 to go". Now `projections list`, GET
// /ops/projections and the rebuild's progress count what the backfill has to read: the 1,000
// entries up to the join, not the 1,200 of the stream.
func TestBackfillToGoCountsUpToTheJoin(t *testing.T) {
	t.Parallel()
	for _, p := range []int{1, 4} {
		t.Run(fmt.Sprintf("partitions=%d", p), func(t *testing.T) {
			t.Parallel()
			testBackfillToGo(t, newPartitionedEnv(t, p))
		})
	}
}

func testBackfillToGo(t *testing.T, e *lostJoinEnv) {
	e.add(25) // 1,000 entries, which v1 applies
	require.Eventually(t, func() bool { s, _ := e.total(); return s == 1000 }, 15*time.Second, 20*time.Millisecond)
	e.paused.Store(true) // nothing more is read: v2's own groups stay at the start
	_, err := e.a.Commands.RebuildProjection.Start(e.ctx, "users")
	require.NoError(t, err)
	targets, err := e.a.Queries.ProjectionVersions.Targets(e.ctx, e.projs)
	require.NoError(t, err)
	_, _, err = e.router.SetTargets(e.ctx, targets) // v2 joins at each partition's end
	require.NoError(t, err)
	e.add(5) // 200 after the join

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
	assert.Equal(t, int64(1000), *v2.Lag, "the backfill has the entries up to its join to read")
	assert.Contains(t, v2.State, ": 1000 to go")

	rp, err := e.a.Commands.RebuildProjection.Step(e.ctx, "users")
	require.NoError(t, err)
	assert.Equal(t, int64(1000), rp.Lag, "the rebuild's progress")
	assert.Equal(t, 2, rp.To)

	e.paused.Store(false)
	require.Eventually(t, func() bool { s, _ := e.total(); return s == 1200 }, 15*time.Second, 20*time.Millisecond)
}
