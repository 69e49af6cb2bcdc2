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

// TestMigrationCarriesARemovalCutShort: a finished backfill's removal is cut short after the
// checked destroy (the member is marked removing, its group gone, its markers still there). A
// partition migration (2 -> 1) rewrites the membership; it carries the mark, so the first run
// after it removes the markers (dropping the mark, no run ever would).
func TestMigrationCarriesARemovalCutShort(t *testing.T) {
	t.Parallel()
	client, base, k2, _, l, marker := finishedOnTwoPartitions(t, time.Now().Add(-time.Hour))
	ctx := context.Background()

	newRB := func(c redis.UniversalClient, keys adapters.KeySpace) *command.RebuildProjection {
		return removalRun(t, adapters.NewOpsBackend(c, keys), time.Second)
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
	after := removalRun(t, adapters.NewOpsBackend(client, base), time.Millisecond)
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
	client, base, _, _, _, marker := finishedOnTwoPartitions(t, time.Now())
	ctx := context.Background()

	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(client, base))
	require.NoError(t, err)
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1})
	require.NoError(t, err)
	ms, err := adapters.NewLiveGroups(client, base).Read(ctx, "live")
	require.NoError(t, err)
	t.Logf("membership after the migration: %s; groups: %v", ms.Raw, client.XInfoGroups(ctx, base.Stream()).Val())
	assert.NotEmpty(t, ms.Members["users.v1"].Removing, "the migration marks it: it dropped the group")
	rb := removalRun(t, adapters.NewOpsBackend(client, base), time.Millisecond)
	time.Sleep(10 * time.Millisecond)
	for range 3 {
		require.NoError(t, rb.RemoveFinishedBackfills(ctx))
	}
	n, err := client.Exists(ctx, marker).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the finished backfill's markers are removed after the migration")
}
