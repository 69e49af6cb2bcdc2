package adapters_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
)

// TestMigrateToAPartitionThatGetsNoEntry: 1 -> 2 of a stream whose check-ins are all of
// users of one new partition (a small deployment, or few users and many partitions), with the
// live group. Position destroys the group on every new partition first; on the partition that
// got no entry the stream key does not exist, and XGROUP DESTROY answers "ERR The XGROUP
// subcommand requires the key to exist" (not "no such key", which isNoSuchKey looked for). The
// run failed there, and every rerun the same way: the API answered 503 for good (found by a
// review). Both now mean the key does not exist.
func TestMigrateToAPartitionThatGetsNoEntry(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	u := userOn(0, 2)
	for _, ck := range []string{"a", "b", "c"} {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: checkinValues(ck, u)}).Err())
	}
	require.NoError(t, client.XGroupCreate(ctx, keys.Stream(), "live", "$").Err())

	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(client, keys))
	require.NoError(t, err)
	for run := 1; run <= 2; run++ {
		_, err = mp.Handle(ctx, command.MigrateRequest{To: 2})
		require.NoError(t, err, "run %d", run)
	}
	k2, err := keys.WithPartitions(2)
	require.NoError(t, err)
	for j, s := range k2.Partitions().Streams() {
		gs, err := client.XInfoGroups(ctx, s).Result()
		require.NoError(t, err, "partition %d", j)
		assert.Len(t, gs, 1, "live on partition %d", j)
	}
}
