package command_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
)

func TestNextRebuildAction(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(1_700_000_010_000)
	grace := 10 * time.Second
	switched := func(ago time.Duration) int64 { return now.Add(-ago).UnixMilli() }
	for _, tc := range []struct {
		name string
		st   ops.VersionState
		want command.RebuildAction
	}{
		{"nothing to do", ops.VersionState{Serving: 1}, command.RebuildNothing},
		{"a finished rebuild", ops.VersionState{Serving: 2, SwitchedAt: switched(time.Hour)}, command.RebuildNothing},
		{"building", ops.VersionState{Serving: 1, Building: 2}, command.RebuildWatchBuilding},
		{"building wins over a leftover", ops.VersionState{Serving: 2, Building: 3, Retiring: 1}, command.RebuildWatchBuilding},
		{"switched just now", ops.VersionState{Serving: 2, Retiring: 1, SwitchedAt: switched(0)}, command.RebuildWaitGrace},
		{"switched within the grace", ops.VersionState{Serving: 2, Retiring: 1, SwitchedAt: switched(grace - time.Millisecond)}, command.RebuildWaitGrace},
		{"grace over", ops.VersionState{Serving: 2, Retiring: 1, SwitchedAt: switched(grace)}, command.RebuildRemoveOld},
		{"long retired", ops.VersionState{Serving: 2, Retiring: 1, SwitchedAt: switched(time.Hour)}, command.RebuildRemoveOld},
	} {
		assert.Equal(t, tc.want, command.NextRebuildAction(tc.st, now, grace), tc.name)
	}
}

func TestBackfillCaughtUp(t *testing.T) {
	t.Parallel()
	running := ops.LiveMember{Join: "100-5", Own: ops.BackfillRunning}
	group := func(lastDelivered string, pending int64) *ops.GroupInfo {
		return &ops.GroupInfo{Name: "users.v2", LastDeliveredID: lastDelivered, Pending: pending}
	}
	for _, tc := range []struct {
		name string
		m    ops.LiveMember
		g    *ops.GroupInfo
		want bool
	}{
		{"delivered up to the join, nothing pending", running, group("100-5", 0), true},
		{"delivered past the join", running, group("101-0", 0), true},
		{"one entry short of the join", running, group("100-4", 0), false},
		{"a millisecond short", running, group("99-9", 0), false},
		{"at the join with entries pending", running, group("100-5", 1), false},
		{"its own group is gone", running, nil, false},
		{"already done", ops.LiveMember{Join: "100-5", Own: ops.BackfillDone}, group("100-5", 0), false},
		{"joined at the start: ids compare numerically", ops.LiveMember{Join: "9-0", Own: ops.BackfillRunning}, group("10-0", 0), true},
		// With partitions: every partition it has is caught up, but Redis lost its join on
		// another (a failover): it has none of that partition's entries.
		{"caught up where it joined, missing a partition", ops.LiveMember{Join: "100-5", Own: ops.BackfillRunning, Missing: 1,
			Parts: map[string]ops.LiveMember{"s0": {Join: "100-5", Own: ops.BackfillRunning}}},
			&ops.GroupInfo{Name: "users.v2", Parts: map[string]ops.GroupInfo{"s0": {LastDeliveredID: "100-5"}}}, false},
		{"caught up on every partition", ops.LiveMember{Join: "100-5", Own: ops.BackfillRunning,
			Parts: map[string]ops.LiveMember{"s0": {Join: "100-5", Own: ops.BackfillRunning}}},
			&ops.GroupInfo{Name: "users.v2", Parts: map[string]ops.GroupInfo{"s0": {LastDeliveredID: "100-5"}}}, true},
	} {
		assert.Equal(t, tc.want, command.BackfillCaughtUp(tc.m, tc.g), tc.name)
	}
}
