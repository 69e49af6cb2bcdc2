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
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// startsHook is the stream admin with a hook run when Start reads where the build begins: after
// it created the version's group at "0" (the build is under way: BeginBuild made it the building
// version), before SetBuildStart.
type startsHook struct {
	ops.Stream
	hook func()
}

func (s startsHook) Starts(ctx context.Context) (map[string]string, error) {
	s.hook()
	return s.Stream.Starts(ctx)
}

// TestBuildStartAtIsTakenBeforeTheBuildBegins: Start took the build's time (at) before
// creating v2's group ("Anything parked from now on may be this build's"); f744e02 replaces it in
// SetBuildStart by Redis's TIME at that later call. An entry v2's build parks in between (its
// group exists at "0" and BeginBuild made v2 the building version, which projectors join; the
// Starts read of every partition sits in between, from an operator's machine possibly far from
// Redis) has a ParkedAt before At: the replay takes it for an earlier build's, superseded,
// deletes it and counts nothing into v2. The check-in is lost from the rebuilt version. Start
// takes the server's time (Registry.ServerTime) where it took its own clock's, before the group.
// (Found by a review helper.)
func TestBuildStartAtIsTakenBeforeTheBuildBegins(t *testing.T) {
	t.Parallel()
	p := newFaulty("faulty", nil)
	h := startHarness(t, p, harnessOptions{})
	ctx := context.Background()
	ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "between", UserID: 1, LocationID: 2, StarRating: 3, Timestamp: time.Now().UnixMilli()},
		RecordedAt: time.Now().UnixMilli()}
	entryID := h.xadd(h.values(ev, "corr"))
	h.settled(1)

	q := adapters.NewPoisonQueue(h.client, h.keys)
	var parked string
	applier, err := adapters.NewProjectionApplier(h.client, h.keys, 0)
	require.NoError(t, err)
	be := adapters.NewOpsBackend(h.client, h.keys)
	be.Stream = startsHook{Stream: be.Stream, hook: func() {
		// v2's own group (at "0") read the entry, failed on it for good and parked it.
		id, err := q.Park(ctx, ops.PoisonEntry{Stream: h.keys.Stream(), EntryID: entryID, Projection: "faulty", Group: "faulty.v2",
			Version: 2, Error: "bug", Attempts: 1, FailedAt: time.Now(), Fields: ev.Fields(), Decision: ops.DecisionCounted})
		require.NoError(t, err)
		parked = id
		time.Sleep(5 * time.Millisecond) // the rest of Starts' round trips
	}}
	var a app.Application
	require.NoError(t, a.AddOps(app.OpsConfig{Backend: be, Applier: applier, Projections: []projection.Projection{p}, Logger: slog.New(slog.DiscardHandler)}))

	rp, err := a.Commands.RebuildProjection.Start(ctx, "faulty")
	require.NoError(t, err)
	require.Equal(t, 2, rp.To)
	require.NotEmpty(t, parked)

	res, err := a.Commands.ReplayPoisoned.Replay(ctx, parked)
	require.NoError(t, err)
	assert.True(t, res.Applied, "parked by v2's build after it began: applied into v2 (%+v)", res)
	v, err := h.client.HGet(ctx, h.keys.ProjectionKey("faulty", 2, "all", "stats"), "count").Int64()
	if !errors.Is(err, redis.Nil) {
		require.NoError(t, err)
	}
	assert.Equal(t, int64(1), v, "v2 counts the check-in")
}
