package adapters_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
)

// slowMarkers runs before() before removing markers: a slow SCAN of a large keyspace.
type slowMarkers struct {
	ops.ProjectionKeys
	before func()
}

func (s slowMarkers) RemoveMarkers(ctx context.Context, group string) (int64, error) {
	if s.before != nil {
		s.before()
	}
	return s.ProjectionKeys.RemoveMarkers(ctx, group)
}

// TestConcurrentRemovalsKeepTheMarkUntilTheHolderIsDone: every projector runs
// RemoveFinishedBackfills, and two of them (A, B) take the same finished backfill. A holds the
// removal (its mark) and is slow removing the markers; B finds the mark held and leaves it, so the
// disband stays refused until A is done. With a plain flag B went through and cleared it, the
// disband went ahead, and A's removal (all the markers of that name) took those of the group the
// disband made.
func TestConcurrentRemovalsKeepTheMarkUntilTheHolderIsDone(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	l := adapters.NewLiveGroups(c, keys)
	stream := keys.Stream()
	add := func() string {
		id, err := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Result()
		require.NoError(t, err)
		return id
	}
	add()
	require.NoError(t, c.XGroupCreate(ctx, stream, "live", "$").Err())
	_, err := l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	_, err = l.FinishBackfill(ctx, "live", "users.v1", time.Now().Add(-time.Hour))
	require.NoError(t, err)
	for range 3 {
		add()
	}
	res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c1", Streams: []string{stream, ">"}, Block: -1}).Result()
	require.NoError(t, err)
	for _, m := range res[0].Messages {
		require.NoError(t, c.XAck(ctx, stream, "live", m.ID).Err())
	}
	time.Sleep(5 * time.Millisecond)

	newRB := func(b ops.Backend) *command.RebuildProjection {
		return removalRun(t, b, time.Second)
	}
	newMarker := keys.MarkerPrefix("users.v1") + "{7}"
	a := adapters.NewOpsBackend(c, keys)
	once := false
	refused := false
	a.Keys = slowMarkers{ProjectionKeys: a.Keys, before: func() {
		if once {
			return
		}
		once = true
		// B, another projector, runs meanwhile: A holds the removal, so B leaves it.
		require.NoError(t, newRB(adapters.NewOpsBackend(c, keys)).RemoveFinishedBackfills(ctx))
		ms, err := l.Read(ctx, "live")
		require.NoError(t, err)
		assert.NotEmpty(t, ms.Members["users.v1"].Removing, "still marked while A removes: %s", ms.Raw)
		// The operator disbands the live group: refused while A is still removing.
		_, err = l.Disband(ctx, "live", time.Millisecond, true)
		refused = errors.Is(err, ops.ErrDisbandRefused)
	}}
	require.NoError(t, newRB(a).RemoveFinishedBackfills(ctx))
	assert.True(t, refused, "the disband waited for A's removal")

	// A is done: the disband goes ahead, the moved version joins another group and applies an
	// entry (a marker), and no removal takes it.
	_, err = l.Disband(ctx, "live", time.Millisecond, true)
	require.NoError(t, err)
	_, err = l.Join(ctx, "live:users", "users.v1")
	require.NoError(t, err)
	require.NoError(t, c.ZAdd(ctx, newMarker, redis.Z{Score: 1, Member: "identity-applied-by-the-moved-group"}).Err())
	require.NoError(t, newRB(adapters.NewOpsBackend(c, keys)).RemoveFinishedBackfills(ctx))
	n, err := c.Exists(ctx, newMarker).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "the marker of the group the disband made stays")
}
