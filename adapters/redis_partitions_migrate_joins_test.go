package adapters_test

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/domain"
)

// TestMigrateWaitsForTheLiveGroupToPassEveryJoin: users.v2 joined the live group at 10-0 on
// partition 0 and at 40-0 on partition 1 (a join walks the partitions while check-ins arrive),
// and its backfill is done on both: its own group applied h (40-0, at its join on partition 1).
// The live group lags on partition 1: it has not delivered h, which it will apply to v1 only.
// The merge 2 -> 1 went on (only versions still backfilling were checked): Position gave v2 one
// join, 10-0 (x at 30-0 closes the prefix), and the live group then delivered h past it and
// applied it to v2 a second time. Now the migration is refused, with nothing changed, until the
// live group has delivered up to every member's join; then it goes, and h is v2's own group's.
func TestMigrateWaitsForTheLiveGroupToPassEveryJoin(t *testing.T) {
	t.Parallel()
	client, keys, parts, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	for _, e := range []struct {
		p      int
		id, ck string
		user   int64
	}{{0, "10-0", "a", u0}, {0, "30-0", "x", u0}, {1, "40-0", "h", u1}} {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(e.p), ID: e.id, Values: checkinValues(e.ck, e.user)}).Err())
	}
	// live delivered everything on partition 0, nothing past 20-0 on partition 1.
	require.NoError(t, client.XGroupCreate(ctx, parts.Stream(0), "live", "30-0").Err())
	require.NoError(t, client.XGroupCreate(ctx, parts.Stream(1), "live", "20-0").Err())
	for i, join := range []string{"10-0", "40-0"} {
		require.NoError(t, client.HSet(ctx, parts.Registry(i), "live:live",
			`{"users.v1":{"join":"0-0","own":"done","doneAt":"1"},"users.v2":{"join":"`+join+`","own":"done","doneAt":"1"}}`).Err())
	}

	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(client, keys))
	require.NoError(t, err)
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1, Batch: 2})
	require.ErrorContains(t, err, "live group live has delivered up to 20-0 on partition 1, below the join of users.v2 there (40-0)")
	require.ErrorContains(t, err, "nothing was changed")
	n, err := client.Exists(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing copied")

	// The live group catches up on partition 1 (h applied to v1 alone: v2's own group has it).
	res, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c", Streams: []string{parts.Stream(1), ">"}, Count: 10, Block: -1}).Result()
	require.NoError(t, err)
	require.Len(t, res[0].Messages, 1)
	require.NoError(t, client.XAck(ctx, parts.Stream(1), "live", res[0].Messages[0].ID).Err())
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1, Batch: 2})
	require.NoError(t, err)

	res, err = client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c", Streams: []string{keys.Stream(), ">"}, Count: 10, Block: -1}).Result()
	assert.ErrorIs(t, err, redis.Nil, "the live group delivers nothing again (h, which v2's own group applied, among it): %v", res)
}

// quiesceHook runs before() when the migration quiesces the stream.
type quiesceHook struct {
	command.PartitionMigration
	before func()
}

func (q quiesceHook) Quiesce(ctx context.Context, reason string, from, to int) error {
	if q.before != nil {
		q.before()
	}
	return q.PartitionMigration.Quiesce(ctx, reason, from, to)
}

// TestMigrateChecksTheJoinsAgainOnceQuiesced: the joins were settled when the migration checked
// them, and a projector joined users.v2 (a rebuild's) to the live group before the quiesce
// stopped it, at 50-0 on partition 1, which the live group has not delivered. The checks ran
// only before the quiesce, so the merge went on with the live group behind the join (the case
// TestMigrateWaitsForTheLiveGroupToPassEveryJoin refuses). Checked again once the projectors
// stand still, the migration is called off, with nothing copied and the stream no longer
// quiesced; run again once the live group caught up, it goes.
func TestMigrateChecksTheJoinsAgainOnceQuiesced(t *testing.T) {
	t.Parallel()
	client, keys, parts, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	for _, e := range []struct {
		p      int
		id, ck string
		user   int64
	}{{0, "10-0", "a", u0}, {1, "40-0", "h", u1}} {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(e.p), ID: e.id, Values: checkinValues(e.ck, e.user)}).Err())
	}
	require.NoError(t, client.XGroupCreate(ctx, parts.Stream(0), "live", "10-0").Err())
	require.NoError(t, client.XGroupCreate(ctx, parts.Stream(1), "live", "40-0").Err())
	for i := range 2 {
		require.NoError(t, client.HSet(ctx, parts.Registry(i), "live:live", `{"users.v1":{"join":"0-0","own":"done","doneAt":"1"}}`).Err())
	}
	pm := adapters.NewPartitionMigrator(client, keys)
	joined := false
	mp, err := command.NewMigratePartitions(quiesceHook{PartitionMigration: pm, before: func() {
		if joined {
			return
		}
		joined = true
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(1), ID: "50-0", Values: checkinValues("k", u1)}).Err())
		for i, join := range []string{"10-0", "50-0"} {
			require.NoError(t, client.HSet(ctx, parts.Registry(i), "live:live",
				`{"users.v1":{"join":"0-0","own":"done","doneAt":"1"},"users.v2":{"join":"`+join+`","own":"done","doneAt":"1"}}`).Err())
		}
	}})
	require.NoError(t, err)
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1, Batch: 2})
	require.ErrorContains(t, err, "live group live has delivered up to 40-0 on partition 1, below the join of users.v2 there (50-0)")
	require.ErrorContains(t, err, "the migration is called off and nothing was changed")
	p, err := pm.Progress(ctx)
	require.NoError(t, err)
	assert.Empty(t, p.Phase, "no migration is recorded")
	why, err := adapters.NewOpsBackend(client, keys).Migration.Running(ctx)
	require.NoError(t, err)
	assert.Empty(t, why, "the stream is no longer quiesced")
	n, err := client.Exists(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing copied")

	// The live group catches up on partition 1; run again, the migration goes.
	res, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c", Streams: []string{parts.Stream(1), ">"}, Count: 10, Block: -1}).Result()
	require.NoError(t, err)
	require.NoError(t, client.XAck(ctx, parts.Stream(1), "live", res[0].Messages[0].ID).Err())
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1, Batch: 2})
	require.NoError(t, err)
}

// copyHook runs before() when the migration starts copying (its joins checked, its projectors
// standing still).
type copyHook struct {
	command.PartitionMigration
	before func()
}

func (c copyHook) Copy(ctx context.Context, from, to, batch int, pause time.Duration, saved func(last string) error) (command.CopyResult, error) {
	c.before()
	return c.PartitionMigration.Copy(ctx, from, to, batch, pause, saved)
}

// TestMigrationHoldsOffJoinsUntilItFinishes: once the migration checked the joins with its
// projectors standing still, it translates the memberships as they are then. A projector
// started meanwhile joins at start, whatever the quiesce flag says (the flag only stops reading,
// as the processes poll it), so its join landed after the check, or half of it (a join walks the
// partitions) under the translation. Now every registry, old and new, is marked migrating from
// the quiesce on, and a join refuses it (domain.ErrMigrating, which a projector waits out) until
// the migration finishes; then the version joins the new partitions. Called off, the migration
// clears the marks too.
func TestMigrationHoldsOffJoinsUntilItFinishes(t *testing.T) {
	t.Parallel()
	client, keys, parts, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(0), ID: "10-0", Values: checkinValues("a", u0)}).Err())
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(1), ID: "20-0", Values: checkinValues("b", u1)}).Err())
	k2, err := keys.WithPartitions(2)
	require.NoError(t, err)
	old, now := adapters.NewLiveGroups(client, k2), adapters.NewLiveGroups(client, keys)
	_, err = old.Join(ctx, "live", "users.v1")
	require.NoError(t, err)

	tried := 0
	mp, err := command.NewMigratePartitions(copyHook{PartitionMigration: adapters.NewPartitionMigrator(client, keys), before: func() {
		tried++
		_, err := old.Join(ctx, "live", "users.v2")
		require.ErrorIs(t, err, domain.ErrMigrating, "a join on the old partitions waits")
		require.ErrorContains(t, err, "2 to 1 partitions")
		_, err = now.Join(ctx, "live", "users.v2")
		require.ErrorIs(t, err, domain.ErrMigrating, "and one on the new partitions")
	}})
	require.NoError(t, err)
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1, Batch: 2})
	require.NoError(t, err)
	require.Equal(t, 1, tried)
	ms, err := now.Read(ctx, "live")
	require.NoError(t, err)
	assert.Equal(t, []string{"users.v1"}, slices.Sorted(maps.Keys(ms.Members)), "the refused joins changed nothing")
	n, err := client.HExists(ctx, keys.Partitions().Registry(0), "migrating").Result()
	require.NoError(t, err)
	assert.False(t, n, "the mark is gone")
	_, err = now.Join(ctx, "live", "users.v2")
	require.NoError(t, err, "once it is done, the version joins the new partitions")

	// Called off (a disband moved a version between the first check and the quiesce), it clears
	// the marks as well.
	mp, err = command.NewMigratePartitions(quiesceHook{PartitionMigration: adapters.NewPartitionMigrator(client, keys), before: func() {
		require.NoError(t, client.HSet(ctx, keys.Partitions().Registry(0), "moved:daily_checkins.v1", `{"from":"live","pos":"0-0"}`).Err())
	}})
	require.NoError(t, err)
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 2, Batch: 2})
	require.ErrorContains(t, err, "the migration is called off")
	require.NoError(t, client.HDel(ctx, keys.Partitions().Registry(0), "moved:daily_checkins.v1").Err())
	_, err = now.Join(ctx, "live", "users.v3")
	require.NoError(t, err, "nothing holds a join after a refusal")
}
