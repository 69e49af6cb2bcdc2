package query_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/checkins/checkins/app/query"
)

func TestStalledRule(t *testing.T) {
	t.Parallel()
	after := time.Minute
	for _, tc := range []struct {
		name         string
		lag, pending int64
		unchanged    time.Duration
		want         bool
	}{
		{"caught up and quiet for long", 0, 0, time.Hour, false},
		{"behind, but moved recently", 10, 0, after - time.Second, false},
		{"behind and unchanged for STALL_AFTER", 10, 0, after, true},
		{"nothing to deliver but stuck pending", 0, 3, 2 * after, true},
		{"lag unknown counts as behind", -1, 0, after, true},
		{"group never created (lag = stream length)", 5, 0, after, true},
	} {
		assert.Equal(t, tc.want, query.Stalled(tc.lag, tc.pending, tc.unchanged, after), tc.name)
	}
}

func TestVersionStateSaysWhereAVersionStands(t *testing.T) {
	t.Parallel()
	lag := func(n int64) *int64 { return &n }
	for _, tc := range []struct {
		v          query.ProjectionVersionStatus
		want, code string
	}{
		{query.ProjectionVersionStatus{Role: query.RoleRetiring, GroupExists: true}, "retired: keys are removed after the grace period", "retired"},
		{query.ProjectionVersionStatus{Role: query.RoleServing}, "not started: no projector has run it yet", "idle"},
		{query.ProjectionVersionStatus{Role: query.RoleServing, GroupExists: true, Lag: lag(0)}, "caught up", "ok"},
		{query.ProjectionVersionStatus{Role: query.RoleBuilding, GroupExists: true, Lag: lag(0)}, "caught up: switching reads", "ok"},
		{query.ProjectionVersionStatus{Role: query.RoleServing, GroupExists: true, Lag: lag(0), Pending: 1}, "behind: 0 to go, 1 pending", "behind"},
		{query.ProjectionVersionStatus{Role: query.RoleBuilding, GroupExists: true, Lag: lag(7), Pending: 2}, "building: 7 to go, 2 pending", "building"},
		{query.ProjectionVersionStatus{Role: query.RoleServing, GroupExists: true, Pending: 2}, "behind: lag unknown, 2 pending", "behind"},
		{query.ProjectionVersionStatus{Role: query.RoleBuilding, GroupExists: true, Backfill: "running", Join: "5-0", Lag: lag(3)},
			"backfilling up to 5-0: 3 to go, 0 pending (the live group feeds what came after)", "building"},
	} {
		assert.Equal(t, tc.want, query.VersionState(tc.v))
		assert.Equal(t, tc.code, query.VersionStateCode(tc.v), tc.want)
	}
	stalled := query.ProjectionVersionStatus{Role: query.RoleServing, GroupExists: true, Lag: lag(3), Stalled: true}
	assert.Equal(t, "stalled", query.VersionStateCode(stalled))
}
