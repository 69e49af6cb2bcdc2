package ports_test

import (
	"context"
	"errors"
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

// TestPoisonReplayOfThisBuildsEntryDespiteClockSkew: whether a parked entry was parked by the
// running build of a version or by an earlier one was decided by comparing its FailedAt
// (time.Now() of the projector that parked it) with BuildStart.At (the clock of whatever process
// started the rebuild: the CLI on an operator's machine, the API, a projector). With the
// rebuild starter's clock 3 s ahead of the projector's, an entry the new build itself failed on
// and parked 1 s after the build began looked parked "before this build began": the replay took
// it for superseded, deleted it and applied nothing, and version 2 never counted the check-in.
// Both times are now the Redis server's: the build start's from TIME on the poison queue's node,
// taken before the build's group exists, the entry's from its ID.
func TestPoisonReplayOfThisBuildsEntryDespiteClockSkew(t *testing.T) {
	t.Parallel()
	p := newFaulty("faulty", nil)
	h := startHarness(t, p, harnessOptions{})
	_, replay := opsAPI(t, h)
	ctx := context.Background()
	countV2 := func() int64 {
		v, err := h.client.HGet(ctx, h.keys.ProjectionKey("faulty", 2, "all", "stats"), "count").Int64()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		require.NoError(t, err)
		return v
	}
	ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "skewed", UserID: 1, LocationID: 2, StarRating: 3, Timestamp: time.Now().UnixMilli()},
		RecordedAt: time.Now().UnixMilli()}
	entryID := h.xadd(h.values(ev, "corr"))
	h.settled(1)

	// Version 2's build is started by a process whose clock runs 3 s ahead (an operator's
	// machine, say).
	const skew = 3 * time.Second
	rb, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: adapters.NewOpsBackend(h.client, h.keys),
		Projections: []projection.Projection{p}, Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return time.Now().Add(skew) }})
	require.NoError(t, err)
	rp, err := rb.Start(ctx, "faulty")
	require.NoError(t, err)
	require.Equal(t, 2, rp.To)

	// The build reached the entry, failed on it and parked it, right after it began.
	id, err := adapters.NewPoisonQueue(h.client, h.keys).Park(ctx, ops.PoisonEntry{Stream: h.keys.Stream(), EntryID: entryID,
		Projection: "faulty", Group: "faulty.v2", Version: 2, Error: "bug", Attempts: 5,
		FailedAt: time.Now(), Fields: ev.Fields(), Decision: ops.DecisionCounted})
	require.NoError(t, err)

	res, err := replay.Replay(ctx, id)
	require.NoError(t, err)
	assert.Empty(t, h.poison(), "the entry is deleted either way")
	assert.True(t, res.Applied, "parked by this build: must be applied into version 2 (%+v)", res)
	assert.Equal(t, int64(1), countV2(), "version 2 counts the check-in once; it was lost")
}

// TestPoisonReplayOfAnEarlierBuildsEntryAfterARepark: an entry an earlier build of version 2
// parked stays superseded by the build running now (which went through the whole stream) after a
// failed replay re-parked it with a new ID (and a new time): replayed into version 2 it would be
// counted a second time. The re-park keeps when it was first parked.
func TestPoisonReplayOfAnEarlierBuildsEntryAfterARepark(t *testing.T) {
	t.Parallel()
	p := newFaulty("faulty", nil)
	h := startHarness(t, p, harnessOptions{})
	_, replay := opsAPI(t, h)
	ctx := context.Background()
	ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "earlier", UserID: 1, LocationID: 2, StarRating: 3, Timestamp: time.Now().UnixMilli()},
		RecordedAt: time.Now().UnixMilli()}
	entryID := h.xadd(h.values(ev, "corr"))
	h.settled(1)
	q := adapters.NewPoisonQueue(h.client, h.keys)
	id, err := q.Park(ctx, ops.PoisonEntry{Stream: h.keys.Stream(), EntryID: entryID, Projection: "faulty", Group: "faulty.v2",
		Version: 2, Error: "bug", Attempts: 5, FailedAt: time.Now(), Fields: ev.Fields(), Decision: ops.DecisionCounted})
	require.NoError(t, err)
	time.Sleep(5 * time.Millisecond)

	// A new build of version 2 begins (from the start of the stream)...
	rb, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: adapters.NewOpsBackend(h.client, h.keys),
		Projections: []projection.Projection{p}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	rp, err := rb.Start(ctx, "faulty")
	require.NoError(t, err)
	require.Equal(t, 2, rp.To)
	time.Sleep(5 * time.Millisecond)
	// ...and a replay of the earlier build's entry failed and re-parked it.
	e, err := q.Get(ctx, id)
	require.NoError(t, err)
	e.Error, e.Attempts, e.FailedAt = "replay: bug", e.Attempts+1, time.Now()
	newID, err := q.Repark(ctx, e)
	require.NoError(t, err)

	res, err := replay.Replay(ctx, newID)
	require.NoError(t, err)
	assert.False(t, res.Applied, "the running build covers it: %+v", res)
	assert.Empty(t, h.poison())
	v, err := h.client.HGet(ctx, h.keys.ProjectionKey("faulty", 2, "all", "stats"), "count").Int64()
	if !errors.Is(err, redis.Nil) {
		require.NoError(t, err)
	}
	assert.Zero(t, v, "the replay did not count it into version 2")
}
