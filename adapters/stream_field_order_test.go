package adapters_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
)

// rawFieldNames are the field names of every entry of stream as Redis stores them, in order
// (go-redis's XRange would hand back a map, which has none).
func rawFieldNames(t *testing.T, c *redis.Client, stream string) [][]string {
	t.Helper()
	v, err := c.Do(context.Background(), "XRANGE", stream, "-", "+").Slice()
	require.NoError(t, err)
	var out [][]string
	for _, e := range v {
		kv := e.([]any)[1].([]any)
		var names []string
		for i := 0; i < len(kv); i += 2 {
			names = append(names, kv[i].(string))
		}
		out = append(out, names)
	}
	return out
}

func sortedEntries(t *testing.T, entries [][]string, min int) {
	t.Helper()
	require.GreaterOrEqual(t, len(entries), min)
	for i, names := range entries {
		assert.Truef(t, slices.IsSorted(names), "entry %d has its fields out of order: %v", i, names)
	}
}

// TestPublishedEntriesKeepOneFieldOrder: every writer of the event stream (Watermill's publisher
// on its own, through the auto-pipeline inside the ingest script, and the partition migration)
// and the poison queue write an entry's fields sorted by name, so that Redis stores the names of
// each listpack once; the same entries in map order take far more memory.
func TestPublishedEntriesKeepOneFieldOrder(t *testing.T) {
	t.Parallel()
	e := newIngestEnv(t, "order")
	ctx := context.Background()

	// Through the auto-pipeline and the ingest script (the API's path on a single Redis).
	rp, err := adapters.NewReservingPublisher(e.pub, e.pipe, e.idem, nil)
	require.NoError(t, err)
	const n = 200
	for i := range n {
		_, _, ok, err := rp.ReserveAndPublish(ctx, ingestRecord(int64(1+i%7), fmt.Sprintf("c-%d", i), 3), "corr", false)
		require.NoError(t, err)
		require.True(t, ok)
	}
	sortedEntries(t, rawFieldNames(t, e.check, e.keys.Stream()), n)

	// Watermill's publisher on a client of its own (the path with INGEST_MIN_REPLICAS).
	plainKeys := adapters.KeySpace{Prefix: "order-plain"}
	c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: "redis://" + e.check.Options().Addr})
	require.NoError(t, err)
	pub, err := adapters.NewEventPublisher(c, plainKeys, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	for i := range n {
		ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: fmt.Sprintf("p-%d", i), UserID: 5, LocationID: 2, StarRating: 3, Timestamp: 9},
			RecordedAt: time.Now().UnixMilli(), Fingerprint: "fp"}
		require.NoError(t, pub.PublishCheckinRecorded(ctx, ev, "corr"))
	}
	sortedEntries(t, rawFieldNames(t, e.check, plainKeys.Stream()), n)

	// The same entries in a shuffled order, as the publisher wrote them before: Redis keeps every
	// entry's names then.
	shuffled := "order-shuffled"
	for i, names := range rawFieldNames(t, e.check, plainKeys.Stream()) {
		args := []any{"XADD", shuffled, "*"}
		for j := range names {
			k := names[(j+i)%len(names)]
			args = append(args, k, "v")
		}
		require.NoError(t, e.check.Do(ctx, args...).Err())
	}
	sortedSize, err := e.check.MemoryUsage(ctx, plainKeys.Stream(), 0).Result()
	require.NoError(t, err)
	shuffledSize, err := e.check.MemoryUsage(ctx, shuffled, 0).Result()
	require.NoError(t, err)
	assert.Less(t, float64(sortedSize), 0.8*float64(shuffledSize), "sorted %d B, shuffled %d B", sortedSize, shuffledSize)

	// The poison queue, parked and parked again.
	q := adapters.NewPoisonQueue(e.check, e.keys)
	id, err := q.Park(ctx, ops.PoisonEntry{Stream: e.keys.Stream(), EntryID: "1-0", Projection: "users", Group: "live", Version: 1,
		Error: "boom", Attempts: 3, FailedAt: time.Now(), Fields: map[string]string{"type": "x", "checkinId": "c", "userId": "1", "zz": "1", "aa": "2"}})
	require.NoError(t, err)
	_, err = q.Repark(ctx, ops.PoisonEntry{ID: id, Stream: e.keys.Stream(), EntryID: "1-0", Projection: "users", Group: "live", Version: 1,
		Error: "boom again", Attempts: 4, FailedAt: time.Now(), Fields: map[string]string{"type": "x", "checkinId": "c", "userId": "1", "zz": "1", "aa": "2"}})
	require.NoError(t, err)
	sortedEntries(t, rawFieldNames(t, e.check, q.Stream()), 1)
}

// TestSortedXAddValues: the helper for writers that XADD a marshalled entry themselves.
func TestSortedXAddValues(t *testing.T) {
	t.Parallel()
	got := adapters.SortedXAddValues(map[string]any{"userId": "1", "_watermill_message_uuid": "u", "checkinId": "c", "meta:x": "m"})
	assert.Equal(t, []any{"_watermill_message_uuid", "u", "checkinId", "c", "meta:x", "m", "userId", "1"}, got)
	assert.Empty(t, adapters.SortedXAddValues(nil))
}
