package adapters_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
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

// finishedBackfillOfUsers is users.v1 in live group live, its backfill finished an hour ago and
// its own group still there, with a marker of that group in slot {7}, which it returns.
func finishedBackfillOfUsers(t *testing.T, c redis.UniversalClient, keys adapters.KeySpace) string {
	t.Helper()
	ctx := context.Background()
	l := adapters.NewLiveGroups(c, keys)
	stream := keys.Stream()
	require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Err())
	require.NoError(t, c.XGroupCreate(ctx, stream, "live", "$").Err())
	_, err := l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	_, err = l.FinishBackfill(ctx, "live", "users.v1", time.Now().Add(-time.Hour))
	require.NoError(t, err)
	marker := keys.MarkerPrefix("users.v1") + "{7}"
	require.NoError(t, c.ZAdd(ctx, marker, redis.Z{Score: 1, Member: "identity-applied-by-the-backfill"}).Err())
	return marker
}

// holdingRun is a run of RemoveFinishedBackfills on b whose hold lasts hold unrenewed.
func holdingRun(t *testing.T, b ops.Backend, hold time.Duration) *command.RebuildProjection {
	t.Helper()
	rb, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: b, RemovalHold: hold,
		Projections: []projection.Projection{projection.UserStats{}}, RetireGrace: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	return rb
}

// removalMark is users.v1's removing mark in live group live.
func removalMark(t *testing.T, l *adapters.LiveGroups) string {
	t.Helper()
	ms, err := l.Read(context.Background(), "live")
	require.NoError(t, err)
	return string(ms.Members["users.v1"].Removing)
}

// TestSlowRemovalRenewsItsHold: run A removes a finished backfill's leftovers for longer than
// its hold (a SCAN of a large keyspace). It renews its hold meanwhile, so run B, which comes in
// the middle, leaves the removal to A instead of taking it over (which would let the first to
// finish clear the mark while the other still deletes markers of that name). A finishes, and
// clears the mark.
func TestSlowRemovalRenewsItsHold(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	l := adapters.NewLiveGroups(c, keys)
	marker := finishedBackfillOfUsers(t, c, keys)
	const hold = time.Second
	a := adapters.NewOpsBackend(c, keys)
	var markA, markAfterB string
	a.Keys = slowMarkers{ProjectionKeys: a.Keys, before: func() {
		markA = removalMark(t, l)
		time.Sleep(5 * hold / 2)
		require.NoError(t, holdingRun(t, adapters.NewOpsBackend(c, keys), hold).RemoveFinishedBackfills(ctx))
		markAfterB = removalMark(t, l)
	}}
	require.NoError(t, holdingRun(t, a, hold).RemoveFinishedBackfills(ctx))
	tokenA, _, _ := strings.Cut(markA, " ")
	require.NotEmpty(t, tokenA)
	assert.True(t, strings.HasPrefix(markAfterB, tokenA+" "), "B left A's removal to A: the mark was %q, then %q", markA, markAfterB)
	assert.Empty(t, removalMark(t, l), "A cleared the mark when done")
	assert.Zero(t, c.Exists(ctx, marker).Val(), "the markers went")
}

// TestRemovalTakenOverStops: while run A removes a finished backfill's leftovers, another run
// takes its removal over (A stood still past its hold). A's next renewal finds that out and A
// stops at once, leaving the removal, and its mark, to the other run.
func TestRemovalTakenOverStops(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	l := adapters.NewLiveGroups(c, keys)
	marker := finishedBackfillOfUsers(t, c, keys)
	const hold = time.Second
	other := "0123456789abcdef " + strconv.FormatInt(time.Now().UnixMilli(), 10) // held by another run
	a := adapters.NewOpsBackend(c, keys)
	a.Keys = slowMarkers{ProjectionKeys: a.Keys, before: func() {
		ms, err := l.Read(ctx, "live")
		require.NoError(t, err)
		var raw map[string]map[string]any
		require.NoError(t, json.Unmarshal([]byte(ms.Raw), &raw))
		raw["users.v1"]["removing"] = other
		b, err := json.Marshal(raw)
		require.NoError(t, err)
		require.NoError(t, c.HSet(ctx, keys.Partitions().Registry(0), "live:live", b).Err())
		time.Sleep(hold / 2) // two renewals
	}}
	err := holdingRun(t, a, hold).RemoveFinishedBackfills(ctx)
	require.ErrorContains(t, err, "another run took the removal over")
	assert.Equal(t, other, removalMark(t, l), "the other run's mark stands")
	assert.Equal(t, int64(1), c.Exists(ctx, marker).Val(), "A deleted nothing once taken over")
}
