package ports_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
)

// TestDisbandWhileLiveIsBehindAJoin: users.v1 joined "live" at J while the live group was
// behind J (it lagged: here a slow member, "slow", holds it back); its own group backfilled up to
// J and the backfill was recorded done. The projectors are stopped (cleanly: nothing pending)
// while the live group is still at L < J. The disband gives users.v1 an own group at L, the live
// group's position, although users.v1 already applied everything up to J: once it joins another
// live group, its own group delivers (L, J] again, and every check-in there is counted twice.
func TestDisbandWhileLiveIsBehindAJoin(t *testing.T) {
	t.Parallel()
	h := newDisbandHarness(t)
	client, keys, ctx := h.client, h.keys, context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	slow := newFaulty("slow", func(context.Context, string, int) error { time.Sleep(10 * time.Millisecond); return nil })
	users := projection.UserStats{}
	start, add, count := h.start, h.add, h.count
	live := adapters.NewLiveGroups(client, keys)

	// slow.v1 alone first: the live group starts at the beginning.
	add(1)
	_, stop := start("live", []ops.ProjectionTarget{{Projection: slow, Version: 1}})
	time.Sleep(500 * time.Millisecond)
	stop()
	add(299)
	// users.v1 is added to the set: it joins at the stream's end J and backfills through its own
	// group, which finishes long before the live group (slow) gets to J.
	_, stop = start("live", []ops.ProjectionTarget{{Projection: slow, Version: 1}, {Projection: users, Version: 1}})
	require.Eventually(t, func() bool {
		ms, err := live.Read(ctx, "live")
		require.NoError(t, err)
		return ms.Members["users.v1"].Own == ops.BackfillDone
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, int64(300), count())
	stop() // SIGTERM: everything read is acknowledged
	ms, err := live.Read(ctx, "live")
	require.NoError(t, err)
	join := ms.Members["users.v1"].Join
	gs, err := client.XInfoGroups(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	for _, g := range gs {
		if g.Name == "live" {
			require.Zero(t, g.Pending)
			require.Negative(t, ops.CompareEntryIDs(g.LastDeliveredID, join), "precondition: the live group is behind users.v1's join")
			t.Logf("live at %s, users.v1 joined at %s", g.LastDeliveredID, join)
		}
	}

	time.Sleep(50 * time.Millisecond)
	// Its finished backfill's group goes first, as a running projector removes it after the
	// grace (the disband refuses while it is there).
	rb, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: adapters.NewOpsBackend(client, keys),
		Projections: []projection.Projection{users}, RetireGrace: time.Millisecond, Logger: log})
	require.NoError(t, err)
	require.NoError(t, rb.RemoveFinishedBackfills(ctx))
	d, err := command.NewDisbandLiveGroup(adapters.NewOpsBackend(client, keys), 20*time.Millisecond)
	require.NoError(t, err)
	_, err = d.Run(ctx, "live", false)
	require.NoError(t, err)

	// users runs in a set of its own now.
	_, stop = start("live:users", []ops.ProjectionTarget{{Projection: users, Version: 1}})
	defer stop()
	require.Eventually(t, func() bool {
		ms, err := live.Read(ctx, "live:users")
		require.NoError(t, err)
		m, ok := ms.Members["users.v1"]
		return ok && m.Own == ops.BackfillDone
	}, 20*time.Second, 20*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, int64(300), count(), "each check-in counted once")
}
