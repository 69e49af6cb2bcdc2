package ports_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// TestDroppedVersionRunAgainCountsAReplayedEvent: users.v1 counted two check-ins through "live"
// and a third, parked, by a replay (markers of replay.users.v1, never pruned). "live" is disbanded
// and users.v1 dropped. Run again, it parks the same entry (the same failure) and the operator
// replays it: the replay found the first run's replay marker and reported the event counted
// already, deleting the entry, though the new read model never counted it (found by a review).
// The drop now removes the markers of replays into the version, as a rebuild's retirement does.
func TestDroppedVersionRunAgainCountsAReplayedEvent(t *testing.T) {
	t.Parallel()
	h := newDisbandHarness(t)
	client, keys, ctx := h.client, h.keys, context.Background()
	users := []ops.ProjectionTarget{{Projection: projection.UserStats{}, Version: 1}}
	parkAs, deliverToLive := twoCountedAndAThirdParked(t, h, users)
	park := func(group string) string { return parkAs("users", group) }
	b := adapters.NewOpsBackend(client, keys)
	replay, err := command.NewReplayPoisoned(command.ReplayPoisonedConfig{
		Backend: b, Projections: []projection.Projection{projection.UserStats{}},
		Applier: testApplier(t, client, keys), Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	res, err := replay.Replay(ctx, park("live"))
	require.NoError(t, err)
	require.True(t, res.Applied)
	require.Equal(t, int64(3), h.count())

	deliverToLive()

	d, err := command.NewDisbandLiveGroup(b, 20*time.Millisecond)
	require.NoError(t, err)
	_, err = d.Run(ctx, "live", false)
	require.NoError(t, err)
	drop, err := command.NewDropMovedVersion(b, 20*time.Millisecond)
	require.NoError(t, err)
	rep, err := drop.Run(ctx, "users.v1", false)
	require.NoError(t, err)
	require.True(t, rep.Done)
	require.Equal(t, int64(0), h.count(), "its read model went with it")

	left, err := client.Keys(ctx, keys.MarkerPrefix(command.ReplayGroup("users", 1))+"*").Result()
	require.NoError(t, err)
	assert.Empty(t, left, "the drop leaves the dropped version's replay markers")

	// Run again (live:users), the version parks the same entry again; it is replayed.
	res, err = replay.Replay(ctx, park("live:users"))
	require.NoError(t, err)
	assert.True(t, res.Applied, "the new read model never counted it: the replay must apply it")
	assert.Equal(t, int64(1), h.count(), "the replayed check-in counts in the read model built after the drop")
}

// TestDropWaitsForTheEventsItParked: users.v1 parked a check-in, which nobody replayed. A replay
// after the version's next run cannot tell whether that run went through the entry: it counted
// it twice when the run had applied it (suspected by a review), and recording the stream's start
// at the drop as the run's start dropped it when RETENTION trimmed it before the run began (found
// by the next review). So the drop refuses while the version's parked events wait, naming them
// and what to do, and changes nothing; purged, the drop goes, and run again the version counts
// the check-in itself, once.
func TestDropWaitsForTheEventsItParked(t *testing.T) {
	t.Parallel()
	h := newDisbandHarness(t)
	client, keys, ctx := h.client, h.keys, context.Background()
	users := []ops.ProjectionTarget{{Projection: projection.UserStats{}, Version: 1}}
	park, deliverToLive := twoCountedAndAThirdParked(t, h, users)
	park("users", "live")
	park("locations", "live") // another projection's parked event does not hold the drop
	deliverToLive()
	q := adapters.NewPoisonQueue(client, keys)
	// Nor does one another version of users parked (say the one serving now).
	e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "other-version", UserID: 8, LocationID: 1, StarRating: 2, Timestamp: 98}}
	otherVersion, err := q.Park(ctx, ops.PoisonEntry{Stream: keys.Stream(), EntryID: "1-1", Projection: "users", Group: "live", Version: 2,
		Error: "boom", Attempts: 5, FailedAt: time.Now(), Fields: e.Fields(), Decision: ops.DecisionCounted})
	require.NoError(t, err)

	b := adapters.NewOpsBackend(client, keys)
	d, err := command.NewDisbandLiveGroup(b, 20*time.Millisecond)
	require.NoError(t, err)
	_, err = d.Run(ctx, "live", false)
	require.NoError(t, err)
	drop, err := command.NewDropMovedVersion(b, 20*time.Millisecond)
	require.NoError(t, err)
	for _, dry := range []bool{true, false} {
		_, err = drop.Run(ctx, "users.v1", dry)
		require.ErrorIs(t, err, ops.ErrDropRefused)
		assert.Contains(t, err.Error(), "1 events it parked are in the poison queue: purge them (checkins poison purge --all --projection users --version 1;")
	}
	assert.Equal(t, int64(2), h.count(), "nothing changed")
	moved, err := adapters.NewLiveGroups(client, keys).ReadMoved(ctx)
	require.NoError(t, err)
	assert.Contains(t, moved[keys.Stream()], "users.v1", "still moved")

	// As the refusal says: the entries users.v1 parked go, the others stay (without --version,
	// the serving version's would have gone too, uncounted for good).
	purge, err := command.NewPurgePoisoned(q, slog.New(slog.DiscardHandler), []projection.Projection{projection.UserStats{}})
	require.NoError(t, err)
	res, err := purge.PurgeAll(ctx, command.BulkRequest{Projection: "users", Version: 1})
	require.NoError(t, err)
	assert.Equal(t, int64(1), res.Purged)
	left, err := q.Range(ctx, "", "+", 10)
	require.NoError(t, err)
	require.Len(t, left, 2)
	assert.Equal(t, "locations", left[0].Projection)
	assert.Equal(t, otherVersion, left[1].ID)
	_, err = drop.Run(ctx, "users.v1", false)
	require.NoError(t, err)

	// Run again: the whole stream, the once-parked check-in among it, counted once.
	_, stop := h.start("live:users", users)
	defer stop()
	require.Eventually(t, func() bool { return h.count() == 3 }, 20*time.Second, 20*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	assert.Equal(t, int64(3), h.count())
}

// twoCountedAndAThirdParked: users.v1 counts two check-ins of user 7 through live, and a third is
// added with its router stopped. park parks that third for a projection, from a group, as
// users.v1's router would have (version 1); deliverToLive has live deliver and acknowledge it,
// as that router did once it had parked it.
func twoCountedAndAThirdParked(t *testing.T, h *disbandHarness, users []ops.ProjectionTarget) (park func(proj, group string) string, deliverToLive func()) {
	t.Helper()
	client, keys, ctx := h.client, h.keys, context.Background()
	_, stop := h.start("live", users)
	h.add(2)
	require.Eventually(t, func() bool { return h.count() == 2 }, 20*time.Second, 20*time.Millisecond)
	stop()
	e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "parked", UserID: 7, LocationID: 1, StarRating: 2, Timestamp: 99}}
	values := map[string]any{}
	for k, v := range e.Fields() {
		values[k] = v
	}
	entryID, err := client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: values}).Result()
	require.NoError(t, err)
	q := adapters.NewPoisonQueue(client, keys)
	park = func(proj, group string) string {
		id, err := q.Park(ctx, ops.PoisonEntry{Stream: keys.Stream(), EntryID: entryID, Projection: proj, Group: group, Version: 1,
			Error: "boom", Attempts: 5, FailedAt: time.Now(), Fields: e.Fields(), Decision: ops.DecisionCounted})
		require.NoError(t, err)
		return id
	}
	deliverToLive = func() {
		rs, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c-live", Streams: []string{keys.Stream(), ">"}, Block: -1}).Result()
		require.NoError(t, err)
		for _, m := range rs[0].Messages {
			require.NoError(t, client.XAck(ctx, keys.Stream(), "live", m.ID).Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return park, deliverToLive
}
