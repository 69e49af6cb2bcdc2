package adapters_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/ops"
)

// TestPoisonCountReadsOnlyWhatChanged: the per-projection count (the status, the dashboard's
// every second) reads nothing while the queue is unchanged, only the new entries after parks,
// and the whole queue again after a delete, and is always the exact count. It read the whole
// queue each time: with 200,000 parked entries, a quarter of Redis's time with no dashboard open.
func TestPoisonCountReadsOnlyWhatChanged(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	counter := &xrangeCounter{}
	client := redistest.Client(t, env.url)
	client.AddHook(counter)
	q := adapters.NewPoisonQueue(client, env.keys)
	park := func(projection string) string {
		id, err := adapters.NewPoisonQueue(env.client, env.keys).Park(ctx, ops.PoisonEntry{Stream: env.keys.Stream(), EntryID: "1-1",
			Projection: projection, Group: projection + ".v1", Version: 1, Error: "bug", Attempts: 1, FailedAt: time.Now(), Fields: map[string]string{"a": "b"}})
		require.NoError(t, err)
		return id
	}
	count := func() map[string]int64 {
		t.Helper()
		got, err := q.CountByProjection(ctx)
		require.NoError(t, err)
		return got
	}
	reads := func() int64 { return counter.n.Swap(0) }

	assert.Equal(t, map[string]int64{}, count(), "no queue yet")
	var ids []string
	for range 2500 {
		ids = append(ids, park("users"))
	}
	ids = append(ids, park("locations"))
	assert.Equal(t, map[string]int64{"users": 2500, "locations": 1}, count())
	assert.Equal(t, int64(3), reads(), "the whole queue, 1,000 a read")
	for range 3 {
		assert.Equal(t, map[string]int64{"users": 2500, "locations": 1}, count())
	}
	assert.Zero(t, reads(), "unchanged: nothing read")

	park("locations")
	park("")
	assert.Equal(t, map[string]int64{"users": 2500, "locations": 2, "": 1}, count())
	assert.Equal(t, int64(1), reads(), "only the new entries")

	require.NoError(t, q.Delete(ctx, ids[0]))
	park("users") // as many entries as before, one of them another
	assert.Equal(t, map[string]int64{"users": 2500, "locations": 2, "": 1}, count())
	assert.Equal(t, int64(3), reads(), "a delete: all again")
	_, err := q.DeleteIDs(ctx, ids[1:2501]...)
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"users": 1, "locations": 1, "": 1}, count())

	// The stream deleted and made again (or a failover to a replica that lagged) with as many
	// or more entries: counted anew, not added to the old count.
	require.NoError(t, env.client.Del(ctx, env.keys.PoisonStream()).Err())
	for range 4 {
		park("daily_checkins")
	}
	assert.Equal(t, map[string]int64{"daily_checkins": 4}, count())
	require.NoError(t, env.client.Del(ctx, env.keys.PoisonStream()).Err())
	for range 2 {
		park("users")
	}
	assert.Equal(t, map[string]int64{"users": 2}, count())
}

// TestPoisonListLastPageHasNoCursor: a last page of exactly the limit carries no cursor to an
// empty page.
func TestPoisonListLastPageHasNoCursor(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	q := adapters.NewPoisonQueue(env.client, env.keys)
	for range 4 {
		_, err := q.Park(ctx, ops.PoisonEntry{Stream: env.keys.Stream(), EntryID: "1-1", Projection: "users", Error: "bug", FailedAt: time.Now(), Fields: map[string]string{"a": "b"}})
		require.NoError(t, err)
	}
	es, next, err := q.List(ctx, "", 2)
	require.NoError(t, err)
	require.Len(t, es, 2)
	require.NotEmpty(t, next)
	es, next, err = q.List(ctx, next, 2)
	require.NoError(t, err)
	assert.Len(t, es, 2)
	assert.Empty(t, next, "nothing follows")
	es, next, err = q.List(ctx, "", 5)
	require.NoError(t, err)
	assert.Len(t, es, 4)
	assert.Empty(t, next)
}

// TestPoisonParkRecordsTheUnitUntilItsEntryIsAcknowledged: a park records the unit as parked
// with the poison entry, in one script; a re-park, a replay and a purge of the poison entry keep
// the record (the live entry may still be pending, and taken over later); SweepParked drops it
// once the projector says its entry is acknowledged. On a single server and on a cluster (the
// record in the poison stream's slot).
func TestPoisonParkRecordsTheUnitUntilItsEntryIsAcknowledged(t *testing.T) {
	t.Parallel()
	eachEnv(t, func(t *testing.T, env projEnv) {
		ctx := context.Background()
		q := adapters.NewPoisonQueue(env.client, env.keys)
		park := func(entry string, version int) (string, ops.UnitRef) {
			e := ops.PoisonEntry{Stream: env.keys.Stream(), EntryID: entry, Projection: "users", Group: "live", Version: version,
				Error: "bug", Attempts: 1, FailedAt: time.Now(), Fields: map[string]string{"a": "b"}}
			id, err := q.Park(ctx, e)
			require.NoError(t, err)
			return id, e.Unit()
		}
		parked := func(us ...ops.UnitRef) []bool {
			got, err := q.Parked(ctx, us)
			require.NoError(t, err)
			return got
		}
		require.NoError(t, env.client.XAdd(ctx, &redis.XAddArgs{Stream: env.keys.Stream(), ID: "1-3", Values: []any{"a", "b"}}).Err())
		a, ua := park("1-1", 1)
		b, ub := park("1-2", 2)
		_, uc := park("1-3", 1)
		// A record of a stream that no longer exists (an old partition after a migration) goes
		// at the first sweep: nothing of that stream is delivered again.
		_, err := q.Park(ctx, ops.PoisonEntry{Stream: env.keys.Stream() + ":gone", EntryID: "1-1", Projection: "users", Group: "live", Version: 1,
			Error: "bug", Attempts: 1, FailedAt: time.Now(), Fields: map[string]string{"a": "b"}})
		require.NoError(t, err)
		gone := ops.UnitRef{Group: "live", Stream: env.keys.Stream() + ":gone", Entry: "1-1", Member: "users.v1"}
		assert.Equal(t, "users.v2", ub.Member)
		other := ops.UnitRef{Group: "live", Stream: env.keys.Stream(), Entry: "1-1", Member: "locations.v1"}
		assert.Equal(t, []bool{true, true, true, false}, parked(ua, ub, uc, other))

		assert.Equal(t, []bool{true}, parked(gone))
		e, err := q.Get(ctx, a)
		require.NoError(t, err)
		e.Error = "replay: bug"
		a2, err := q.Repark(ctx, e)
		require.NoError(t, err)
		require.NoError(t, q.Delete(ctx, a2))
		_, err = q.DeleteIDs(ctx, b)
		require.NoError(t, err)
		assert.Equal(t, []bool{true, true, true}, parked(ua, ub, uc), "the poison entries' fate does not end the records")

		sweep := func(acked ...ops.UnitRef) {
			var cursor uint64
			for {
				next, err := q.SweepParked(ctx, cursor, func(u ops.UnitRef) bool { return slices.Contains(acked, u) })
				require.NoError(t, err)
				if cursor = next; cursor == 0 {
					return
				}
			}
		}
		sweep(ua, ub)
		assert.Equal(t, []bool{false, false, true, false}, parked(ua, ub, uc, gone))
		sweep(uc)
		left, err := env.client.Exists(ctx, env.keys.PoisonParked()).Result()
		require.NoError(t, err)
		assert.Zero(t, left, "nothing left behind")
	})
}
