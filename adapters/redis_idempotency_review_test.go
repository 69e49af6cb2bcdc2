package adapters_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
)

// TestRetryAfterMigratingATrimmedStream: a cluster keyspace with one stream writes its
// records in the users' slots (layout "user", which was never recorded in <prefix>:meta). Its
// stream is trimmed to nothing (RETENTION shorter than IDEMPOTENCY_TTL, a quiet spell), then
// `partitions migrate --to 24` runs: no entry to copy, so the new partitions never held one.
// The first store of the 24 partitions must still look up the users' slots for
// IDEMPOTENCY_TTL: a retry of a check-in accepted minutes before is a retry, and the same
// checkinId with another body is a 409. It looked them up only if a new partition had held an
// entry, and recorded the retry again (found by a review); on a cluster the "user" layout is now
// recorded, and retired by the migration's first store.
func TestRetryAfterMigratingATrimmedStream(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	k1, err := adapters.NewKeySpace(env.keys.Prefix+"trim", true)
	require.NoError(t, err)
	now := time.Now().UnixMilli()

	// The one-stream keyspace records a check-in of user 7 (two-step: a cluster with one stream).
	store1 := adapters.NewIdempotencyStore(env.client, k1, time.Hour)
	rec := publishedRecord("c-1", 7, 3, 4, 0, now) // the server set the timestamp
	res := rec
	res.Published, res.Owner = false, "o1"
	got, err := store1.Reserve(ctx, res)
	require.NoError(t, err)
	require.Nil(t, got)
	require.NoError(t, env.client.XAdd(ctx, &redis.XAddArgs{Stream: k1.Stream(), Values: checkinValues("c-1", 7)}).Err())
	require.NoError(t, store1.MarkPublished(ctx, res))
	// RETENTION trims the stream to nothing.
	require.NoError(t, env.client.XTrimMaxLen(ctx, k1.Stream(), 0).Err())

	// partitions migrate --to 24 (the real migrator).
	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(env.client, k1))
	require.NoError(t, err)
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 24})
	require.NoError(t, err)
	k24, err := k1.WithPartitions(24)
	require.NoError(t, err)
	require.NotEqual(t, k1.Idempotency(7, "c-1"), k24.Idempotency(7, "c-1"), "the layout changed")

	store24 := adapters.NewIdempotencyStore(env.client, k24, time.Hour)
	retry := rec
	retry.Published, retry.Owner, retry.RecordedAt, retry.ReservedAt = false, "o2", now+60_000, now+60_000
	retry.Checkin.Timestamp = retry.RecordedAt // the retry's own server timestamp
	got, err = store24.Reserve(ctx, retry)
	require.NoError(t, err)
	meta, _ := env.client.HGetAll(ctx, k24.Meta()).Result()
	require.NotNil(t, got, "a retry 1 minute later is taken for a new check-in (recorded again with another timestamp); meta %v", meta)
	assert.Equal(t, rec.Checkin, got.Checkin, "replayed with the original check-in")
}

// TestUnreadableRecordOfAnEarlierLayout: a record the store cannot read is an error
// naming its checkinId at the current key; in an earlier layout (looked up for IDEMPOTENCY_TTL
// after a layout change) the same record was skipped without a word and the checkinId reserved
// anew: a retry recorded again, another body accepted rather than refused or failed (found by a
// review). It is the same error now.
func TestUnreadableRecordOfAnEarlierLayout(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	k24, err := adapters.NewKeySpace(env.keys.Prefix+"bad", true)
	require.NoError(t, err)
	k24, err = k24.WithPartitions(24)
	require.NoError(t, err)
	// An earlier version served (an entry in a partition) and wrote user 7's record in the users'
	// slot; the record is damaged (one byte of a compact record cut off).
	require.NoError(t, env.client.XAdd(ctx, &redis.XAddArgs{Stream: k24.Partitions().StreamOf(7), Values: checkinValues("x", 7)}).Err())
	now := time.Now().UnixMilli()
	rec := publishedRecord("c-1", 7, 3, 4, 0, now)
	good, ok := adapters.EncodeCompact(rec)
	require.True(t, ok)
	bad := string(good[:len(good)-1])

	current := publishedRecord("c-cur", 7, 3, 4, 0, now)
	require.NoError(t, env.client.Set(ctx, k24.Idempotency(7, "c-cur"), bad, time.Hour).Err())
	userKey, err := k24.IdempotencyIn(adapters.IdemLayoutUser, 7, "c-1")
	require.NoError(t, err)
	require.NoError(t, env.client.Set(ctx, userKey, bad, time.Hour).Err())

	store := adapters.NewIdempotencyStore(env.client, k24, time.Hour)
	_, err = store.Reserve(ctx, current)
	require.ErrorContains(t, err, `idempotency record for "c-cur" is corrupt`, "at the current key")

	other := publishedRecord("c-1", 7, 9, 1, 0, now+1000) // another body
	other.Published, other.Owner = false, "o"
	got, err := store.Reserve(ctx, other)
	assert.Error(t, err, "the same record in the users' slot: got %+v, no error", got)
}

// TestFormatSwitchBeforeTheFirstCheckinIsKept: `checkins idempotency format compact`
// on a keyspace with no format recorded and no check-in yet answered "already compact" and
// recorded nothing. When the keyspace then looked served (the README's move from a single Redis
// to a cluster copies the stream in before the API starts), the API wrote JSON: the switch the
// operator made, and was told is in force, was lost (found by a review). It is recorded now.
func TestFormatSwitchBeforeTheFirstCheckinIsKept(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	keys := env.with("switch").keys
	rf, err := command.NewRecordFormat(adapters.NewIdempotencyRecords(env.client, keys))
	require.NoError(t, err)
	before, err := rf.Set(ctx, "compact")
	require.NoError(t, err)
	t.Logf("format compact: before %q", before)
	// The stream is copied in (it held entries before).
	require.NoError(t, env.client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: checkinValues("x", 7)}).Err())
	store := adapters.NewIdempotencyStore(env.client, keys, time.Hour)
	rec := publishedRecord("c-1", 7, 3, 4, 0, time.Now().UnixMilli())
	res := rec
	res.Published, res.Owner = false, "o"
	got, err := store.Reserve(ctx, res)
	require.NoError(t, err)
	require.Nil(t, got)
	require.NoError(t, store.MarkPublished(ctx, res))
	v, err := env.client.Get(ctx, keys.Idempotency(7, "c-1")).Result()
	require.NoError(t, err)
	now, err := rf.Get(ctx)
	require.NoError(t, err)
	assert.True(t, len(v) > 1 && v[1] == 1, "written compact as switched: %q (format now %q)", v, now)
}
