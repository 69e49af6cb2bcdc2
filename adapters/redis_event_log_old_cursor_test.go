package adapters_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
)

// TestOldCursorOfALaterPartitionAfterMerge: README (partitions migrate) says a cursor
// "<ID>.<partition>" of a partitioned stream "names a partition of the old count, and after an
// N -> M migration may skip or repeat entries that share its ID". A cursor naming partition 1
// of 2, after 2 -> 1, was refused outright instead: the client could not page on at all (found
// by a review). It now means after its ID in every partition.
func TestOldCursorOfALaterPartitionAfterMerge(t *testing.T) {
	t.Parallel()
	client, keys, parts, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	add := func(p int, id, ck string, user int64) {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(p), ID: id, Values: checkinValues(ck, user)}).Err())
	}
	add(0, "5-0", "a", u0)
	add(1, "5-0", "b", u1)
	add(0, "6-0", "c", u0)
	add(1, "7-0", "d", u1)

	before := adapters.NewPartitionedEventLog(client, parts)
	page, err := before.Range(ctx, 0, 1<<40, "", 2)
	require.NoError(t, err)
	require.Len(t, page.Checkins, 2)
	cursor := page.Next
	require.Equal(t, "5-0.1", cursor, "a cursor the API gave out before the migration")

	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(client, keys))
	require.NoError(t, err)
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1})
	require.NoError(t, err)

	after := adapters.NewEventLog(client, keys) // the service restarted with STREAM_PARTITIONS=1
	page, err = after.Range(ctx, 0, 1<<40, cursor, 10)
	require.NoError(t, err, "the cursor of before keeps paging (possibly repeating an entry that shared its ID)")
	var got []string
	for _, c := range page.Checkins {
		got = append(got, c.ID)
	}
	assert.Subset(t, got, []string{"c", "d"})
}
