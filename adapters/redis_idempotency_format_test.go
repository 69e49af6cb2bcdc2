package adapters_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
)

// publishedRecord is the record the API makes of a request: the fingerprint of its body, with
// or without the timestamp (then the server's, the millisecond of recording).
func publishedRecord(id string, user, location, rating, ts, recordedAt int64) command.IdempotencyRecord {
	in := domain.CheckinInput{UserID: &user, LocationID: &location, StarRating: &rating}
	if ts != 0 {
		in.Timestamp = &ts
	} else {
		ts = recordedAt
	}
	return command.IdempotencyRecord{Fingerprint: in.Fingerprint(), RecordedAt: recordedAt, ReservedAt: recordedAt, Published: true,
		Checkin: domain.Checkin{ID: id, UserID: user, LocationID: location, StarRating: int(rating), Timestamp: ts}}
}

// A published record in the compact format reads back as the record it was made of, the
// fingerprint included, in 15 bytes or so where the JSON takes about 140; a record it cannot
// hold exactly is not written compact; a damaged one is an error naming the checkinId.
func TestCompactRecordReadsBackExactly(t *testing.T) {
	t.Parallel()
	now := time.Now().UnixMilli()
	for name, rec := range map[string]command.IdempotencyRecord{
		"the server's timestamp":           publishedRecord("c-1", 42, 7, 4, 0, now),
		"the client's timestamp":           publishedRecord("c-2", 42, 7, 4, now-3_600_000, now),
		"a client's timestamp ahead":       publishedRecord("c-3", 1, 1, 0, now+60_000, now),
		"the client's timestamp, the same": publishedRecord("c-4", 9, 3, 5, now, now),
		"large ids":                        publishedRecord("c-5", 1<<62, 1<<40, 1, domain.MaxTimestamp, now),
	} {
		b, ok := adapters.EncodeCompact(rec)
		require.True(t, ok, name)
		limit := 16 // ids of up to 21 bits: 3 bytes each
		if rec.Checkin.UserID > 1<<21 {
			limit = 32
		}
		assert.LessOrEqual(t, len(b), limit, "%s: %d bytes", name, len(b))
		assert.Equal(t, byte('P'), b[0], "%s: published", name)
		got, err := adapters.DecodeRecord(rec.Checkin.ID, string(b))
		require.NoError(t, err, name)
		assert.Equal(t, rec, *got, name)
		js, err := adapters.EncodeRecord('P', rec)
		require.NoError(t, err)
		fromJSON, err := adapters.DecodeRecord(rec.Checkin.ID, string(js))
		require.NoError(t, err)
		assert.Equal(t, *fromJSON, *got, "%s: reads as its JSON does", name)
	}

	for name, mod := range map[string]func(*command.IdempotencyRecord){
		"a fingerprint of another body": func(r *command.IdempotencyRecord) { r.Checkin.StarRating = 3 },
		"no fingerprint":                func(r *command.IdempotencyRecord) { r.Fingerprint = "" },
		"a negative timestamp":          func(r *command.IdempotencyRecord) { r.Checkin.Timestamp = -1 },
		"a rating out of range":         func(r *command.IdempotencyRecord) { r.Checkin.StarRating = 9 },
		"no user":                       func(r *command.IdempotencyRecord) { r.Checkin.UserID = 0 },
	} {
		rec := publishedRecord("c", 42, 7, 4, 0, now)
		mod(&rec)
		_, ok := adapters.EncodeCompact(rec)
		assert.False(t, ok, name)
	}

	good, ok := adapters.EncodeCompact(publishedRecord("c", 42, 7, 4, 0, now))
	require.True(t, ok)
	for name, v := range map[string]string{
		"truncated":       string(good[:len(good)-1]),
		"trailing bytes":  string(good) + "\x00",
		"unknown flags":   string(good[:2]) + "\x40" + string(good[3:]),
		"a reservation":   "R" + string(good[1:]),
		"no fields":       string(good[:3]),
		"an endless uint": string(good[:3]) + strings.Repeat("\xff", 11),
	} {
		_, err := adapters.DecodeRecord("c", v)
		assert.ErrorContains(t, err, `idempotency record for "c" is corrupt`, name)
	}
}

// TestIdempotencyRecordFormat: a keyspace no earlier release served writes compact published
// records from its first check-in; one they served keeps writing the JSON they read until
// the format is switched in <prefix>:meta, which every process follows at its next refresh;
// records of either format answer retries and conflicts alike throughout.
func TestIdempotencyRecordFormat(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	now := time.Now().UnixMilli()
	value := func(keys adapters.KeySpace, rec command.IdempotencyRecord) string {
		v, err := env.client.Get(ctx, keys.Idempotency(rec.Checkin.UserID, rec.Checkin.ID)).Result()
		require.NoError(t, err)
		return v
	}
	compact := func(v string) bool { return len(v) > 1 && v[0] == 'P' && v[1] == 1 }
	// answers checks what the store makes of rec's retry and of its checkinId with another body.
	answers := func(store *adapters.IdempotencyStore, rec command.IdempotencyRecord, what string) {
		t.Helper()
		got, err := store.Reserve(ctx, rec)
		require.NoError(t, err)
		require.NotNil(t, got, what)
		assert.Equal(t, rec, *got, "%s: a retry finds the record", what)
		other := publishedRecord(rec.Checkin.ID, rec.Checkin.UserID, rec.Checkin.LocationID+1, 2, 0, now)
		got, err = store.Reserve(ctx, other)
		require.NoError(t, err)
		require.NotNil(t, got)
		assert.NotEqual(t, other.Fingerprint, got.Fingerprint, "%s: another body conflicts", what)
	}
	record := func(store *adapters.IdempotencyStore, rec command.IdempotencyRecord) {
		t.Helper()
		r := rec
		r.Published, r.Owner = false, "o"
		got, err := store.Reserve(ctx, r)
		require.NoError(t, err)
		require.Nil(t, got)
		require.NoError(t, store.MarkPublished(ctx, r))
	}

	t.Run("new keyspace", func(t *testing.T) {
		keys := env.with("new").keys
		require.NoError(t, env.client.XGroupCreateMkStream(ctx, keys.Stream(), "live", "0").Err(), "serve's projectors create the stream empty")
		before, err := adapters.NewIdempotencyRecords(env.client, keys).Format(ctx)
		require.NoError(t, err)
		assert.Equal(t, ops.RecordFormatCompact, before, "what the first check-in will record")
		store := adapters.NewIdempotencyStore(env.client, keys, time.Hour)
		rec := publishedRecord("n-1", 3, 4, 5, 0, now)
		record(store, rec)
		v := value(keys, rec)
		assert.True(t, compact(v), "compact from the start: %q", v)
		format, err := adapters.NewIdempotencyRecords(env.client, keys).Format(ctx)
		require.NoError(t, err)
		assert.Equal(t, ops.RecordFormatCompact, format, "recorded for every process after it")
		answers(store, rec, "a compact record")

		// The one-script path of the API stores the record as published, compact too.
		pipe := adapters.NewAutoPipeline(redistest.Client(t, env.url), 64, 1)
		t.Cleanup(func() { _ = pipe.Close() })
		pub, err := adapters.NewPipelinedEventPublisher(redistest.Client(t, env.url), pipe, keys, watermill.NopLogger{})
		require.NoError(t, err)
		rp, err := adapters.NewReservingPublisher(pub, pipe, adapters.NewIdempotencyStore(env.client, keys, time.Hour), nil)
		require.NoError(t, err)
		one := publishedRecord("n-2", 3, 4, 1, now-5000, now)
		_, existing, ok, err := rp.ReserveAndPublish(ctx, one, "", false)
		require.NoError(t, err)
		require.True(t, ok)
		require.Nil(t, existing)
		assert.True(t, compact(value(keys, one)))
		_, existing, _, err = rp.ReserveAndPublish(ctx, one, "", false)
		require.NoError(t, err)
		require.NotNil(t, existing)
		assert.Equal(t, one, *existing, "a retry through the script reads the compact record")
		n, err := env.client.XLen(ctx, keys.Stream()).Result()
		require.NoError(t, err)
		assert.EqualValues(t, 1, n, "and adds no entry")
	})

	// Keyspaces that earlier releases served although their streams hold nothing now.
	for name, served := range map[string]func(adapters.KeySpace){
		"stream trimmed to empty": func(keys adapters.KeySpace) {
			require.NoError(t, env.client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: map[string]any{"x": "y"}}).Err())
			require.NoError(t, env.client.XTrimMaxLen(ctx, keys.Stream(), 0).Err())
		},
		"marked by a release since scoped keys, its stream gone": func(keys adapters.KeySpace) {
			require.NoError(t, env.client.Set(ctx, keys.IdempotencyScopedSince(), "0", 0).Err())
		},
	} {
		t.Run(name, func(t *testing.T) {
			keys := env.with(name).keys
			served(keys)
			format, err := adapters.NewIdempotencyRecords(env.client, keys).Format(ctx)
			require.NoError(t, err)
			assert.Equal(t, ops.RecordFormatJSON, format)
			rec := publishedRecord("s-1", 3, 4, 5, 0, now)
			record(adapters.NewIdempotencyStore(env.client, keys, time.Hour), rec)
			assert.True(t, strings.HasPrefix(value(keys, rec), `P{"f":`), "JSON: %q", value(keys, rec))
			n, err := env.client.HExists(ctx, keys.Meta(), "idem-format").Result()
			require.NoError(t, err)
			assert.False(t, n, "nothing recorded")
		})
	}

	t.Run("keyspace an earlier release served", func(t *testing.T) {
		keys := env.with("earlier").keys
		require.NoError(t, env.client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: map[string]any{"x": "y"}}).Err())
		store := adapters.NewIdempotencyStore(env.client, keys, time.Hour).WithLayoutRefresh(time.Millisecond)
		old := publishedRecord("e-1", 3, 4, 5, 0, now)
		record(store, old)
		v := value(keys, old)
		assert.True(t, strings.HasPrefix(v, `P{"f":`), "JSON, which earlier releases read: %q", v)
		records := adapters.NewIdempotencyRecords(env.client, keys)
		format, err := records.Format(ctx)
		require.NoError(t, err)
		assert.Equal(t, ops.RecordFormatJSON, format, "nothing recorded: JSON")

		require.NoError(t, records.SetFormat(ctx, ops.RecordFormatCompact))
		time.Sleep(5 * time.Millisecond)
		rec := publishedRecord("e-2", 3, 4, 5, now-1000, now)
		record(store, rec)
		assert.True(t, compact(value(keys, rec)), "switched at the next refresh")
		answers(store, old, "a JSON record after the switch")
		answers(store, rec, "a compact record")

		require.NoError(t, records.SetFormat(ctx, ops.RecordFormatJSON))
		time.Sleep(5 * time.Millisecond)
		back := publishedRecord("e-3", 3, 4, 5, 0, now)
		record(store, back)
		assert.True(t, strings.HasPrefix(value(keys, back), `P{"f":`), "switched back to JSON")
		answers(store, rec, "a compact record after switching back")

		assert.ErrorContains(t, records.SetFormat(ctx, "binary"), `unknown idempotency record format "binary"`)
	})
}

// PublishedRecord writes what the API's store writes, in either format: a record set with it
// under the record's key answers a retry and a reuse with another body, as the store's own.
func TestPublishedRecordIsWhatTheStoreReads(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	now := time.Now().UnixMilli()
	keys := env.with("published").keys
	store := adapters.NewIdempotencyStore(env.client, keys, time.Hour)
	for i, format := range []string{ops.RecordFormatCompact, ops.RecordFormatJSON} {
		rec := publishedRecord(fmt.Sprintf("p-%d", i), 5, 6, 3, now-60_000, now)
		v, err := adapters.PublishedRecord(rec, format)
		require.NoError(t, err)
		assert.Equal(t, format == ops.RecordFormatCompact, len(v) > 1 && v[1] == 1, "%s: %q", format, v)
		require.NoError(t, env.client.Set(ctx, keys.Idempotency(5, rec.Checkin.ID), v, time.Hour).Err())
		got, err := store.Reserve(ctx, rec)
		require.NoError(t, err)
		require.NotNil(t, got, format)
		assert.Equal(t, rec, *got, "%s: a retry finds it", format)
		other := publishedRecord(rec.Checkin.ID, 5, 7, 3, now-60_000, now)
		got, err = store.Reserve(ctx, other)
		require.NoError(t, err)
		require.NotNil(t, got)
		assert.Equal(t, rec.Fingerprint, got.Fingerprint, "%s: another body conflicts with it", format)
	}
	// A record the compact format cannot hold (its fingerprint is of another body) is JSON.
	odd := publishedRecord("p-odd", 5, 6, 3, 0, now)
	odd.Fingerprint = "not-the-body's"
	v, err := adapters.PublishedRecord(odd, ops.RecordFormatCompact)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(v), `P{"f":"not-the-body's"`), "%q", v)
	_, err = adapters.PublishedRecord(odd, "binary")
	assert.EqualError(t, err, `unknown idempotency record format "binary": compact or json`)
}
