package adapters_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
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

// TestDisbandLiveGroup: a live group is disbanded only when nothing of it can be lost. It refuses,
// changing nothing, while entries are pending, while a consumer read within the idle time, while
// a member still backfills, and when its consumer group is missing; a check (apply false)
// changes nothing either. Disbanded, each member has an own group at the position the live group
// had delivered through (with nothing pending) and a moved record, and the live group, its
// membership and its checkpoint are gone; the moved members' own groups hold the dedupe floor
// (until the window passes); a member joining another live group then backfills from its own
// group's position, not as an upgrade from an earlier layout, and its moved record goes. On a
// server and a cluster, with one stream and with four partitions.
func TestDisbandLiveGroup(t *testing.T) {
	eachEnv(t, func(t *testing.T, env projEnv) {
		for _, p := range []int{1, 4} {
			t.Run(fmt.Sprintf("P=%d", p), func(t *testing.T) {
				base := env.keys
				base.Prefix += ":d" + strconv.Itoa(p)
				base.Cluster = env.cluster
				keys, err := base.WithPartitions(p)
				require.NoError(t, err)
				disbandLiveGroup(t, env.client, base, keys)
			})
		}
	})
}

// removalRun is the use case that removes finished backfills (of users.v1) on b, after grace.
func removalRun(t *testing.T, b ops.Backend, grace time.Duration) *command.RebuildProjection {
	t.Helper()
	rb, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: b,
		Projections: []projection.Projection{projection.UserStats{}}, RetireGrace: grace, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	return rb
}

// removeFinishedBackfills removes the own groups of finished backfills, as a running projector
// does PROJECTION_RETIRE_GRACE (here a millisecond) after they finished.
func removeFinishedBackfills(t *testing.T, c redis.UniversalClient, keys adapters.KeySpace) {
	t.Helper()
	time.Sleep(5 * time.Millisecond)
	require.NoError(t, removalRun(t, adapters.NewOpsBackend(c, keys), time.Millisecond).RemoveFinishedBackfills(context.Background()))
}

func disbandLiveGroup(t *testing.T, c redis.UniversalClient, base, keys adapters.KeySpace) {
	ctx := context.Background()
	parts := keys.Partitions()
	l := adapters.NewLiveGroups(c, keys)
	add := func(stream string) string {
		t.Helper()
		id, err := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Result()
		require.NoError(t, err)
		return id
	}
	for _, stream := range parts.Streams() {
		add(stream)
	}
	// A first start: both versions join at the start, and the live group feeds them everything.
	for _, m := range []string{"users.v1", "locations.v1"} {
		_, err := l.Join(ctx, "live", m)
		require.NoError(t, err)
	}
	pos := map[string]string{}
	for _, stream := range parts.Streams() {
		for range 4 {
			add(stream)
		}
		res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c1", Streams: []string{stream, ">"}, Count: 3, Block: -1}).Result()
		require.NoError(t, err)
		msgs := res[0].Messages
		require.NoError(t, c.XAck(ctx, stream, "live", msgs[0].ID, msgs[1].ID).Err())
		pos[stream] = msgs[2].ID
	}
	registry := func() map[string]string {
		t.Helper()
		out := map[string]string{}
		for i := range parts.Count() {
			h, err := c.HGetAll(ctx, parts.Registry(i)).Result()
			require.NoError(t, err)
			for f, v := range h {
				out[parts.Stream(i)+" "+f] = v
			}
		}
		return out
	}
	require.NoError(t, l.Checkpoints(ctx, "live", map[string]string{parts.Stream(0): "0-1"}))
	// Refused: a projector of it checkpointed within the hour (on Redis before 7.2 the one sign
	// of a projector that runs on a quiet stream).
	_, err := l.Disband(ctx, "live", time.Hour, true)
	require.ErrorIs(t, err, ops.ErrDisbandRefused)
	assert.Contains(t, err.Error(), "a projector of it recorded its progress")
	require.NoError(t, c.HDel(ctx, parts.Registry(0), "seen:live").Err()) // as if an hour passed
	before := registry()

	// Refused, changing nothing: an entry of each partition is pending.
	time.Sleep(5 * time.Millisecond) // c1 idle longer than the idle time asked for
	_, err = l.Disband(ctx, "live", time.Millisecond, true)
	require.ErrorIs(t, err, ops.ErrDisbandRefused)
	assert.Contains(t, err.Error(), "1 entries are pending")
	for _, stream := range parts.Streams() {
		require.NoError(t, c.XAck(ctx, stream, "live", pos[stream]).Err())
	}
	// Refused: consumer c1 read within the hour.
	_, err = l.Disband(ctx, "live", time.Hour, true)
	require.ErrorIs(t, err, ops.ErrDisbandRefused)
	assert.Contains(t, err.Error(), "consumer c1 read from it")
	// Refused: a version joined since (the live group had delivered: it backfills).
	_, err = l.Join(ctx, "live", "daily_checkins.v1")
	require.NoError(t, err)
	_, err = l.Disband(ctx, "live", time.Millisecond, true)
	require.ErrorIs(t, err, ops.ErrDisbandRefused)
	assert.Contains(t, err.Error(), "daily_checkins.v1 is still backfilling")
	require.NoError(t, l.Leave(ctx, "live", "daily_checkins.v1"))
	for _, stream := range parts.Streams() {
		require.NoError(t, c.XGroupDestroy(ctx, stream, "daily_checkins.v1").Err())
	}
	assert.Equal(t, before["live"], registry()["live"])
	assert.Len(t, registry(), len(before), "nothing was disbanded by a refused call")

	rep, err := l.Disband(ctx, "live", time.Millisecond, false)
	require.NoError(t, err)
	assert.Equal(t, ops.DisbandReport{Group: "live", Members: []string{"locations.v1", "users.v1"}, Positions: pos}, rep)
	groups := func(stream string) map[string]redis.XInfoGroup {
		t.Helper()
		gs, err := c.XInfoGroups(ctx, stream).Result()
		require.NoError(t, err)
		out := map[string]redis.XInfoGroup{}
		for _, g := range gs {
			out[g.Name] = g
		}
		return out
	}
	for _, stream := range parts.Streams() {
		assert.Contains(t, groups(stream), "live", "a check changes nothing")
	}

	rep, err = l.Disband(ctx, "live", time.Millisecond, true)
	require.NoError(t, err)
	assert.Equal(t, ops.DisbandReport{Group: "live", Members: []string{"locations.v1", "users.v1"}, Positions: pos, Done: true}, rep)
	for _, stream := range parts.Streams() {
		gs := groups(stream)
		assert.NotContains(t, gs, "live")
		for _, m := range []string{"users.v1", "locations.v1"} {
			assert.Equal(t, pos[stream], gs[m].LastDeliveredID, "%s's own group on %s", m, stream)
			assert.Zero(t, gs[m].Pending)
		}
	}
	reg := registry()
	for _, stream := range parts.Streams() {
		assert.NotContains(t, reg, stream+" live:live")
		assert.NotContains(t, reg, stream+" acked:live")
		assert.NotContains(t, reg, stream+" seen:live")
		assert.Equal(t, pos[stream], reg[stream+" acked:users.v1"], "a group lost before its first checkpoint is made again there")
		assert.Contains(t, reg, stream+" disbanding:live", "until its markers are gone (the command's EndDisband)")
	}
	// Meanwhile no projector joins a group of that name: a projector of the old set would write
	// markers the removal then takes.
	_, err = l.Join(ctx, "live", "daily_checkins.v1")
	require.ErrorIs(t, err, ops.ErrDisbandUnfinished)
	assert.Contains(t, err.Error(), "run it again if it was cut short")
	moved, err := l.ReadMoved(ctx)
	require.NoError(t, err)
	require.Len(t, moved, parts.Count())
	for _, stream := range parts.Streams() {
		require.Len(t, moved[stream], 2)
		assert.Equal(t, "live", moved[stream]["users.v1"].From)
		assert.Equal(t, pos[stream], moved[stream]["users.v1"].Pos)
	}

	// A partition migration waits for them to join another group (the copy translates live
	// groups' memberships, not the moved records).
	unsettled, err := adapters.NewPartitionMigrator(c, base).JoinsUnsettled(ctx, parts.Count())
	require.NoError(t, err)
	assert.Equal(t, []string{
		"live group live was disbanded and removing its markers was cut short (run: checkins projections disband live)",
		"locations.v1 was taken out of live group live by `checkins projections disband` and has joined no other yet (start a projector that runs it, or drop it: checkins projections drop locations.v1)",
		"users.v1 was taken out of live group live by `checkins projections disband` and has joined no other yet (start a projector that runs it, or drop it: checkins projections drop users.v1)",
	}, unsettled)
	require.NoError(t, l.EndDisband(ctx, "live"))
	for _, stream := range parts.Streams() {
		assert.NotContains(t, registry(), stream+" disbanding:live")
	}

	// The moved versions' own groups hold the dedupe floor at the position, until the window
	// has passed since the disband.
	progress, err := adapters.ReadPartitionsProgress(ctx, c, parts)
	require.NoError(t, err)
	lives, _, err := l.ReadAll(ctx)
	require.NoError(t, err)
	floors, ok, err := adapters.DedupeFloors(ctx, c, parts.Streams(), lives, moved, progress, time.Hour, time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	for i, stream := range parts.Streams() {
		assert.Equal(t, pos[stream], floors[i])
	}
	_, ok, err = adapters.DedupeFloors(ctx, c, parts.Streams(), lives, moved, progress, time.Hour, time.Now().Add(2*time.Hour))
	require.NoError(t, err)
	assert.False(t, ok, "moved and run by nobody for the whole window: abandoned, it holds no floor")

	// A projector runs users in another set: it backfills from its own group's position.
	last := map[string]string{}
	for _, stream := range parts.Streams() {
		last[stream] = add(stream)
	}
	ms, err := l.Join(ctx, "live:users", "users.v1")
	require.NoError(t, err)
	m := ms.Members["users.v1"]
	assert.Equal(t, ops.BackfillRunning, m.Own)
	assert.Empty(t, m.Legacy, "no earlier layout's sets to look in")
	for _, stream := range parts.Streams() {
		pm, ok := m.On(stream)
		require.True(t, ok)
		assert.Equal(t, last[stream], pm.Join)
		assert.Equal(t, pos[stream], groups(stream)["users.v1"].LastDeliveredID, "the own group still stands where live left it")
	}
	moved, err = l.ReadMoved(ctx)
	require.NoError(t, err)
	for _, stream := range parts.Streams() {
		assert.NotContains(t, moved[stream], "users.v1", "the join removes the moved record")
		assert.Contains(t, moved[stream], "locations.v1")
	}

	// Run again: the group is gone everywhere; it reports what is still moved out of it.
	rep, err = l.Disband(ctx, "live", time.Millisecond, true)
	require.NoError(t, err)
	assert.Equal(t, ops.DisbandReport{Group: "live", Members: []string{"locations.v1"}, Positions: pos, Done: true}, rep)
	_, err = l.Join(ctx, "live:users", "locations.v1")
	require.NoError(t, err)
	rep, err = l.Disband(ctx, "live", time.Millisecond, true)
	require.NoError(t, err)
	assert.Empty(t, rep.Positions, "no such group any more")

	// Not while a member's finished backfill's group is still there (a running projector
	// removes it after the grace; replacing it here could race that).
	for _, m := range []string{"users.v1", "locations.v1"} {
		_, err = l.FinishBackfill(ctx, "live:users", m, time.Now())
		require.NoError(t, err)
	}
	_, err = l.Disband(ctx, "live:users", time.Millisecond, true)
	require.ErrorIs(t, err, ops.ErrDisbandRefused)
	assert.Contains(t, err.Error(), "the own group of locations.v1, through which it backfilled, is still there")
	removeFinishedBackfills(t, c, keys)

	// A live group whose consumer group Redis lost is not disbanded: where it stood is unknown.
	for _, stream := range parts.Streams() {
		require.NoError(t, c.XGroupDestroy(ctx, stream, "live:users").Err())
	}
	_, err = l.Disband(ctx, "live:users", time.Millisecond, true)
	require.ErrorIs(t, err, ops.ErrDisbandRefused)
	assert.Contains(t, err.Error(), "its consumer group is missing")
}
