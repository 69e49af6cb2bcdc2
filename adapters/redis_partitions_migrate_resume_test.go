package adapters_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// crashAfterRecord is the real migrator whose run dies right after it recorded the new count,
// before it recorded the cleanup phase (a SIGKILL there, or the progress write failing).
type crashAfterRecord struct {
	*adapters.PartitionMigrator
	crashed bool
}

func (c *crashAfterRecord) SaveProgress(ctx context.Context, p command.MigrationProgress) error {
	if p.Phase == command.PhaseCleanup && !c.crashed {
		c.crashed = true
		return errors.New("killed")
	}
	return c.PartitionMigrator.SaveProgress(ctx, p)
}

// TestResumeAfterRecordDoesNotPositionAgain: 2 -> 1 where the live group had delivered c's
// partition up to a and the other one through d: c is left pending for partitions-migrate.
// The run dies right after recording the count. A projector restarted with STREAM_PARTITIONS=1
// (what every process of the old count asks for now) takes c over while the flag is still set
// (a paused projector still does), applies it, acknowledges it and, quiet, sweeps its markers
// below what the group has acknowledged (ProjectionRouter.checkpoint). The rerun carried on at
// the position phase and positioned the groups again from the old partitions: c was pending
// again, delivered a second time, and counted twice (found by a review). With the count
// recorded, the rerun goes on to the cleanup.
func TestResumeAfterRecordDoesNotPositionAgain(t *testing.T) {
	t.Parallel()
	client, keys, parts, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	add := func(p int, id, ck string, user int64) {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(p), ID: id, Values: checkinValues(ck, user)}).Err())
	}
	add(0, "1-0", "a", u0)
	add(0, "3-0", "c", u0)
	add(1, "2-0", "b", u1)
	add(1, "4-0", "d", u1)
	require.NoError(t, client.XGroupCreate(ctx, parts.Stream(0), "live", "1-0").Err())
	require.NoError(t, client.XGroupCreate(ctx, parts.Stream(1), "live", "4-0").Err())
	for i := range 2 {
		require.NoError(t, client.HSet(ctx, parts.Registry(i), "live:live", `{"users.v1":{"join":"0-0","own":"done","doneAt":"1"}}`).Err())
	}

	m := &crashAfterRecord{PartitionMigrator: adapters.NewPartitionMigrator(client, keys)}
	mp, err := command.NewMigratePartitions(m)
	require.NoError(t, err)
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1})
	require.ErrorContains(t, err, "killed")
	recorded, err := adapters.NewPartitionMigrator(client, keys).Recorded(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, recorded, "the count is recorded")

	// The restarted projector (P = 1) takes c over and applies it.
	cEv := func(id string) domain.CheckinRecorded {
		msgs, err := client.XRange(ctx, keys.Stream(), id, id).Result()
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		f := map[string]string{}
		for k, v := range msgs[0].Values {
			f[k] = v.(string)
		}
		ev, err := domain.ParseEvent(id, f)
		require.NoError(t, err)
		return ev.(domain.CheckinRecorded)
	}
	claimed, err := client.XClaimJustID(ctx, &redis.XClaimArgs{Stream: keys.Stream(), Group: "live", Consumer: "b", MinIdle: 0, Messages: []string{"3-0"}}).Result()
	require.NoError(t, err)
	require.Equal(t, []string{"3-0"}, claimed, "c is pending for partitions-migrate, b takes it over")
	applier, err := adapters.NewProjectionApplier(client, keys, 0)
	require.NoError(t, err)
	out, err := applier.ApplyEvent(ctx, "live", projection.UserStats{}, 1, cEv("3-0"), "3-0")
	require.NoError(t, err)
	require.Equal(t, projection.Applied, out)
	require.NoError(t, client.XAck(ctx, keys.Stream(), "live", "3-0").Err())
	_, err = applier.Sweep(ctx, "live", "4-0") // quiet: acknowledged through 4-0
	require.NoError(t, err)

	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1}) // the operator runs it again
	require.NoError(t, err)

	pel, err := client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: keys.Stream(), Group: "live", Start: "-", End: "+", Count: 10}).Result()
	require.NoError(t, err)
	var again []string
	for _, p := range pel {
		again = append(again, p.ID+" "+p.Consumer)
	}
	assert.Empty(t, again, "c was delivered and acknowledged on the new stream: nothing is to be delivered again")
	if len(again) > 0 {
		out, err = applier.ApplyEvent(ctx, "live", projection.UserStats{}, 1, cEv("3-0"), "3-0")
		require.NoError(t, err)
		assert.NotEqual(t, projection.Applied, out, "c delivered again is not counted again")
	}
	n, err := client.HGet(ctx, keys.ProjectionPrefix("users", 1)+"{user:"+strconv.FormatInt(u0, 10)+"}:stats", "numCheckins").Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "c counted once")
}
