package ports_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// purgingApplier is another operator purging (or replaying) the entry while this replay applies
// it, and the apply failing (the projection still broken).
type purgingApplier struct {
	purge func()
}

func (a purgingApplier) ApplyDecided(context.Context, string, projection.Projection, int, domain.CheckinRecorded, string, projection.Decision) (projection.Outcome, error) {
	a.purge()
	return 0, errors.New("bug in the projection")
}

// TestPoisonReplayAllCountsAnEntryPurgedMeanwhileAsGone: a bulk replay whose apply fails
// on an entry another run purged (or replayed) meanwhile finds nothing to re-park (Repark:
// ErrNotFound) and changed nothing, which BulkResult documents as "gone" ("so the totals of
// concurrent runs add up to what was parked"). It is counted "failed" and listed among the
// failures instead: the CLI then exits 1 saying the entry "stays in the queue" (kept as its old
// ID), which it does not, and the two runs' totals count the one entry twice.
func TestPoisonReplayAllCountsAnEntryPurgedMeanwhileAsGone(t *testing.T) {
	t.Parallel()
	h := startHarness(t, newFaulty("faulty", nil), harnessOptions{})
	ctx := context.Background()
	id := h.park("raced", 1)
	q := adapters.NewPoisonQueue(h.client, h.keys)
	replay, err := command.NewReplayPoisoned(command.ReplayPoisonedConfig{
		Backend:     adapters.NewOpsBackend(h.client, h.keys),
		Projections: []projection.Projection{h.proj},
		Applier:     purgingApplier{purge: func() { require.NoError(t, q.Delete(ctx, id)) }},
		Logger:      slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)

	res, err := replay.ReplayAll(ctx, command.BulkRequest{})
	require.NoError(t, err)
	assert.Empty(t, h.poison(), "the other run purged it; nothing was re-parked")
	assert.Equal(t, 1, res.Gone, "purged by another run meanwhile: gone for this run (%+v)", res)
	assert.Zero(t, res.Failed, "nothing failed that stays in the queue (%+v)", res)
}

// TestPoisonReplayOfAnEntryPurgedMeanwhileIsNotFound: the single replay of the same race
// answers ErrReplayFailed (HTTP 422 replay_failed, "it stays in the queue" per the OpenAPI
// description, result.newId empty; the dashboard says "replay failed, kept as <old id>"), though
// the entry is gone: it should be the 404 a replay of a gone entry answers.
func TestPoisonReplayOfAnEntryPurgedMeanwhileIsNotFound(t *testing.T) {
	t.Parallel()
	h := startHarness(t, newFaulty("faulty", nil), harnessOptions{})
	ctx := context.Background()
	id := h.park("raced-one", 1)
	q := adapters.NewPoisonQueue(h.client, h.keys)
	replay, err := command.NewReplayPoisoned(command.ReplayPoisonedConfig{
		Backend:     adapters.NewOpsBackend(h.client, h.keys),
		Projections: []projection.Projection{h.proj},
		Applier:     purgingApplier{purge: func() { require.NoError(t, q.Delete(ctx, id)) }},
		Logger:      slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	res, err := replay.Replay(ctx, id)
	assert.Empty(t, h.poison())
	assert.ErrorIs(t, err, domain.ErrNotFound, "the entry is gone (%+v)", res)
	assert.NotErrorIs(t, err, command.ErrReplayFailed, "nothing stays in the queue (%+v)", res)
}

// applyingPurger is another operator purging the entry while this replay applies it
// successfully.
type applyingPurger struct {
	next  command.EventApplier
	purge func()
}

func (a applyingPurger) ApplyDecided(ctx context.Context, g string, p projection.Projection, v int, e domain.CheckinRecorded, id string, d projection.Decision) (projection.Outcome, error) {
	a.purge()
	return a.next.ApplyDecided(ctx, g, p, v, e, id, d)
}

// TestPoisonReplayThatAppliedReportsIt: a replay that applied (counted) the event and then
// found the entry purged by another operator reported applied false and "replayed or purged by
// another run meanwhile", though it is the one that counted the check-in. It is still "gone"
// for this run (so concurrent runs' totals add up), with applied true and a message that says so.
func TestPoisonReplayThatAppliedReportsIt(t *testing.T) {
	t.Parallel()
	h := startHarness(t, newFaulty("faulty", nil), harnessOptions{})
	ctx := context.Background()
	id := h.park("applied-then-purged", 1)
	q := adapters.NewPoisonQueue(h.client, h.keys)
	replay, err := command.NewReplayPoisoned(command.ReplayPoisonedConfig{
		Backend:     adapters.NewOpsBackend(h.client, h.keys),
		Projections: []projection.Projection{h.proj},
		Applier:     applyingPurger{next: testApplier(t, h.client, h.keys), purge: func() { require.NoError(t, q.Delete(ctx, id)) }},
		Logger:      slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	res, err := replay.Replay(ctx, id)
	require.Equal(t, int64(1), h.count(), "this replay counted the event")
	assert.True(t, res.Applied, "this replay applied it: %+v (err %v)", res, err)
	assert.ErrorContains(t, err, "this replay applied it")
}
