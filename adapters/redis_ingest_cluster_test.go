package adapters_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
)

// TestUserStateKeysFollowTheLayout: on a cluster with stream partitions a user's idempotency
// records and rate-limit state share the slot of the user's partition (so that the limit, the
// reservation and the XADD can be one script); with one stream, and on a single server, they
// keep the user's slot and the names of before.
func TestUserStateKeysFollowTheLayout(t *testing.T) {
	t.Parallel()
	cluster, err := adapters.NewKeySpace("ck", true)
	require.NoError(t, err)
	k24, err := cluster.WithPartitions(24)
	require.NoError(t, err)
	assert.Equal(t, "p24", k24.IdempotencyLayout())
	assert.True(t, k24.IngestInOneSlot())
	slots := map[int]bool{}
	for u := int64(1); u <= 500; u++ {
		stream := adapters.KeySlot(k24.Partitions().StreamOf(u))
		assert.Equal(t, stream, adapters.KeySlot(k24.Idempotency(u, "c-"+strconv.FormatInt(u, 10))), "user %d's record", u)
		assert.Equal(t, stream, adapters.KeySlot(k24.RateLimitUser(u)), "user %d's limit", u)
		slots[stream] = true
	}
	assert.Len(t, slots, 24, "spread over the partitions' slots")
	// Two users of one partition keep apart: the user is in the key.
	assert.NotEqual(t, k24.Idempotency(1, "x"), k24.Idempotency(2, "x"))
	// Another partition count: the tags of that count.
	k8, err := cluster.WithPartitions(8)
	require.NoError(t, err)
	key8, err := k24.IdempotencyIn("p8", 42, "x")
	require.NoError(t, err)
	assert.Equal(t, k8.Idempotency(42, "x"), key8)
	_, err = k24.IdempotencyIn("q3", 42, "x")
	assert.ErrorContains(t, err, `unknown idempotency layout "q3"`)

	for _, k := range []adapters.KeySpace{cluster, {Prefix: "ck"}} {
		assert.Equal(t, adapters.IdemLayoutUser, k.IdempotencyLayout())
		assert.Equal(t, "ck:idem:{user:42}:x", k.Idempotency(42, "x"))
		assert.Equal(t, "ck:ratelimit:{user:42}", k.RateLimitUser(42))
	}
	single, err := adapters.KeySpace{Prefix: "ck"}.WithPartitions(4)
	require.NoError(t, err)
	assert.Equal(t, "ck:idem:{user:42}:x", single.Idempotency(42, "x"), "a single server keeps the user's slot")
	assert.False(t, cluster.IngestInOneSlot(), "one stream on a cluster: the user's slot is not the stream's")
	durable := k24.WithRecordsInUserSlots() // INGEST_MIN_REPLICAS
	assert.Equal(t, adapters.IdemLayoutUser, durable.IdempotencyLayout())
	assert.Equal(t, "ck:idem:{user:42}:x", durable.Idempotency(42, "x"))
	assert.Equal(t, "ck:ratelimit:{user:42}", durable.RateLimitUser(42))
	assert.False(t, durable.IngestInOneSlot())
	assert.True(t, single.IngestInOneSlot())
}

// TestReservingPublisherOnACluster: on a cluster with 24 partitions the limit, the reservation
// and Watermill's XADD are one script call per check-in (Redis Cluster would refuse it,
// CROSSSLOT, were the keys in different slots): each entry lands in its user's partition, the
// record is stored as published, a retry finds it and adds nothing.
func TestReservingPublisherOnACluster(t *testing.T) {
	t.Parallel()
	env := redistest.OpenCluster(t)
	ctx := context.Background()
	keys, err := adapters.NewKeySpace(env.Prefix, true)
	require.NoError(t, err)
	keys, err = keys.WithPartitions(adapters.DefaultClusterPartitions)
	require.NoError(t, err)
	check := redistest.ClusterClient(t, env.URL)
	newClient := func() redis.UniversalClient {
		c, err := adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: env.URL})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	hook := &countingHook{}
	pipeClient := newClient()
	pipeClient.AddHook(hook)
	pipe := adapters.NewAutoPipeline(pipeClient, 64, 2)
	t.Cleanup(func() { _ = pipe.Close() })
	pub, err := adapters.NewPipelinedEventPublisher(newClient(), pipe, keys, watermill.NopLogger{})
	require.NoError(t, err)
	idem := adapters.NewIdempotencyStore(newClient(), keys, time.Hour).WithAutoPipeline(pipe)
	policy, err := command.ParseRateLimit("100/s,burst=100")
	require.NoError(t, err)
	l, err := adapters.NewRedisRateLimiter(newClient(), pipe, keys, policy)
	require.NoError(t, err)
	rp, err := adapters.NewReservingPublisher(pub, pipe, idem, l.WithReservations(idem))
	require.NoError(t, err)

	_, _, ok, err := rp.ReserveAndPublish(ctx, ingestRecord(1000, "warm-up", 1), "", true) // the layout question
	require.NoError(t, err)
	require.True(t, ok, "a new cluster keyspace has no records of another layout to look up")
	hook.n.Store(0)
	const users = 60
	for u := int64(1); u <= users; u++ {
		d, existing, ok, err := rp.ReserveAndPublish(ctx, ingestRecord(u, "c-"+strconv.FormatInt(u, 10), 3), "", true)
		require.NoError(t, err, "user %d", u)
		require.True(t, ok)
		assert.True(t, d.Allowed)
		assert.Nil(t, existing)
	}
	assert.Equal(t, int64(users), hook.n.Load(), "one command a check-in")
	for u := int64(1); u <= users; u++ {
		id := "c-" + strconv.FormatInt(u, 10)
		v, err := check.Get(ctx, keys.Idempotency(u, id)).Result()
		require.NoError(t, err)
		assert.Equal(t, byte('P'), v[0], "stored as published")
		entries, err := check.XRange(ctx, keys.Partitions().StreamOf(u), "-", "+").Result()
		require.NoError(t, err)
		found := 0
		for _, e := range entries {
			if e.Values["checkinId"] == id {
				found++
			}
		}
		assert.Equal(t, 1, found, "user %d's entry is in its partition once", u)
	}
	_, existing, ok, err := rp.ReserveAndPublish(ctx, ingestRecord(7, "c-7", 9), "", true)
	require.NoError(t, err)
	require.True(t, ok)
	require.NotNil(t, existing, "a retry finds the record")
	assert.Equal(t, int64(3), existing.Checkin.LocationID)

	one, err := adapters.NewKeySpace(env.Prefix+"one", true)
	require.NoError(t, err)
	onePipe := adapters.NewAutoPipeline(newClient(), 8, 1)
	t.Cleanup(func() { _ = onePipe.Close() })
	onePub, err := adapters.NewPipelinedEventPublisher(newClient(), onePipe, one, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = adapters.NewReservingPublisher(onePub, onePipe, adapters.NewIdempotencyStore(newClient(), one, time.Hour), nil)
	assert.ErrorContains(t, err, "in different slots", "one stream on a cluster: the two-step path")
}
