package adapters_test

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
	"github.com/checkins/checkins/app/projection"
)

// TestMigrationCarriesARemovalCutShort: a finished backfill's removal is cut short after the
// checked destroy (the member is marked removing, its group gone, its markers still there). A
// partition migration (2 -> 1) rewrites the membership; it carries the mark, so the first run
// after it removes the markers (dropping the mark, no run ever would).
func TestMigrationCarriesARemovalCutShort(t *testing.T) {
	t.Parallel()
	client, base, parts, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	k2, err := base.WithPartitions(2)
	require.NoError(t, err)
	for i, u := range []int64{u0, u1} {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(i), ID: "1-1", Values: checkinValues("a"+string(rune('0'+i)), u)}).Err())
		require.NoError(t, client.XGroupCreate(ctx, parts.Stream(i), "live", "$").Err())
	}
	l := adapters.NewLiveGroups(client, k2)
	_, err = l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	// The backfill applied both entries (its markers), acknowledged everything, and finished.
	for i := range 2 {
		_, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "users.v1", Consumer: "c", Streams: []string{parts.Stream(i), ">"}}).Result()
		require.NoError(t, err)
		require.NoError(t, client.XAck(ctx, parts.Stream(i), "users.v1", "1-1").Err())
	}
	marker := k2.MarkerPrefix("users.v1") + "{0}"
	require.NoError(t, client.ZAdd(ctx, marker, redis.Z{Score: 1, Member: "identity-of-a"}).Err())
	_, err = l.FinishBackfill(ctx, "live", "users.v1", time.Now().Add(-time.Hour))
	require.NoError(t, err)

	newRB := func(c redis.UniversalClient, keys adapters.KeySpace) *command.RebuildProjection {
		rb, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: adapters.NewOpsBackend(c, keys),
			Projections: []projection.Projection{projection.UserStats{}}, RetireGrace: time.Second, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		return rb
	}
	rdbURL := client.Options()
	flaky := redis.NewClient(rdbURL)
	t.Cleanup(func() { _ = flaky.Close() })
	flaky.AddHook(&failingScan{})
	require.Error(t, newRB(flaky, k2).RemoveFinishedBackfills(ctx), "the removal is cut short after the checked destroy")
	ms, err := l.Read(ctx, "live")
	require.NoError(t, err)
	require.NotEmpty(t, ms.Members["users.v1"].Removing, "marked removing")

	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(client, base))
	require.NoError(t, err)
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1})
	require.NoError(t, err)

	ms, err = adapters.NewLiveGroups(client, base).Read(ctx, "live")
	require.NoError(t, err)
	t.Logf("membership after the migration: %s", ms.Raw)
	assert.NotEmpty(t, ms.Members["users.v1"].Removing, "the migration carries the mark")
	after, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: adapters.NewOpsBackend(client, base),
		Projections: []projection.Projection{projection.UserStats{}}, RetireGrace: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, after.RemoveFinishedBackfills(ctx))
	n, err := client.Exists(ctx, marker).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the finished backfill's markers are removed after the migration (%s)", ms.Raw)
}

// TestMigrationMarksAFinishedBackfillNotYetRemoved: the finished backfill's group is still there
// (within the grace) at the migration, which does not carry it to the new partitions; it marks
// the member removing, so a later run removes the markers the group left.
func TestMigrationMarksAFinishedBackfillNotYetRemoved(t *testing.T) {
	t.Parallel()
	client, base, parts, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	k2, err := base.WithPartitions(2)
	require.NoError(t, err)
	for i, u := range []int64{u0, u1} {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(i), ID: "1-1", Values: checkinValues("a"+string(rune('0'+i)), u)}).Err())
		require.NoError(t, client.XGroupCreate(ctx, parts.Stream(i), "live", "$").Err())
	}
	l := adapters.NewLiveGroups(client, k2)
	_, err = l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	for i := range 2 {
		_, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "users.v1", Consumer: "c", Streams: []string{parts.Stream(i), ">"}}).Result()
		require.NoError(t, err)
		require.NoError(t, client.XAck(ctx, parts.Stream(i), "users.v1", "1-1").Err())
	}
	marker := k2.MarkerPrefix("users.v1") + "{0}"
	require.NoError(t, client.ZAdd(ctx, marker, redis.Z{Score: 1, Member: "identity-of-a"}).Err())
	_, err = l.FinishBackfill(ctx, "live", "users.v1", time.Now())
	require.NoError(t, err)

	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(client, base))
	require.NoError(t, err)
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1})
	require.NoError(t, err)
	ms, err := adapters.NewLiveGroups(client, base).Read(ctx, "live")
	require.NoError(t, err)
	t.Logf("membership after the migration: %s; groups: %v", ms.Raw, client.XInfoGroups(ctx, base.Stream()).Val())
	assert.NotEmpty(t, ms.Members["users.v1"].Removing, "the migration marks it: it dropped the group")
	rb, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: adapters.NewOpsBackend(client, base),
		Projections: []projection.Projection{projection.UserStats{}}, RetireGrace: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	time.Sleep(10 * time.Millisecond)
	for range 3 {
		require.NoError(t, rb.RemoveFinishedBackfills(ctx))
	}
	n, err := client.Exists(ctx, marker).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the finished backfill's markers are removed after the migration")
}
