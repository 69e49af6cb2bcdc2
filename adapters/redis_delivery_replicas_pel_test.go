package adapters_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/batchsub"
	"github.com/checkins/checkins/adapters/redistest"
)

func redisMsOf(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	require.NoError(t, err)
	return now.UnixMilli()
}

// failoverTakeover promotes the replica and has another consumer ("b") take the entry over
// there as soon as ClaimMinIdle allows; it returns the replica's Redis time at the takeover.
func failoverTakeover(t *testing.T, rc *redis.Client, topic, id string, idle time.Duration) int64 {
	t.Helper()
	ctx := context.Background()
	p, err := rc.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: topic, Group: "g", Start: id, End: id, Count: 1}).Result()
	require.NoError(t, err)
	require.Len(t, p, 1)
	t.Logf("replica's record of %s before the failover: consumer %s, idle %s, deliveries %d", id, p[0].Consumer, p[0].Idle, p[0].RetryCount)
	require.NoError(t, rc.SlaveOf(ctx, "NO", "ONE").Err())
	var at int64
	require.Eventually(t, func() bool {
		msgs, _, err := rc.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: topic, Group: "g", Consumer: "b", MinIdle: idle, Start: "0-0"}).Result()
		if err != nil || len(msgs) == 0 {
			return false
		}
		at = redisMsOf(t, rc)
		return true
	}, 20*time.Second, 10*time.Millisecond)
	return at
}

// TestPELRereadAfterRestartLeaseEndsBeforeATakeover: a projector restarted with the same
// consumer name reads its own pending entries again (XREADGROUP ... 0). Redis does not replicate
// such a read: it reset the entry's idle time on the master only, and a replica promoted after it
// lets another consumer take the entry over CLAIM_IDLE after its last replicated delivery. So
// the entry's lease does not start at that read but at a replicated (and, with
// RequireDeliveryReplicas, confirmed) reset of its idle time: it ends before such a takeover.
func TestPELRereadAfterRestartLeaseEndsBeforeATakeover(t *testing.T) {
	t.Parallel()
	master, replica, mc := startReplicated(t)
	rc := redistest.Client(t, replica.URL())
	ctx := context.Background()
	const topic = "events"
	const idle = 3 * time.Second
	id, err := mc.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: map[string]any{"uuid": "u", "payload": "p", "metadata": "{}"}}).Result()
	require.NoError(t, err)
	require.NoError(t, mc.XGroupCreate(ctx, topic, "g", "0").Err())
	// Consumer a's first process reads the entry, confirmed by the replica, then dies.
	var wait *redis.Cmd
	_, err = mc.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "a", Streams: []string{topic, ">"}, Count: 10, Block: -1})
		wait = p.Do(ctx, "WAIT", 1, 2000)
		return nil
	})
	require.NoError(t, err)
	require.EqualValues(t, 1, wait.Val())
	time.Sleep(2500 * time.Millisecond) // it restarts (same CONSUMER_NAME)

	c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: master.URL(), ReadTimeout: 3 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, adapters.RequireDeliveryReplicas(c, 1, 500*time.Millisecond))
	sub, err := batchsub.NewSubscriber(batchsub.Config{Client: c, ConsumerGroup: "g", Consumer: "a",
		ClaimMinIdle: idle, ClaimInterval: 100 * time.Millisecond, DrainTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	var m *message.Message
	select {
	case m = <-msgs:
	case <-time.After(10 * time.Second):
		t.Fatal("no message")
	}
	until, ok := batchsub.LeaseUntil(m.Context())
	require.True(t, ok)
	takenAt := failoverTakeover(t, rc, topic, id, idle)
	t.Logf("lease until %d; another consumer took the entry over on the promoted replica at %d (%d ms after the lease)", until, takenAt, takenAt-until)
	assert.GreaterOrEqual(t, takenAt, until, "another consumer read the entry within the lease of the one holding it")
}

// TestPELRereadAfterAFailedWaitLeaseEndsBeforeATakeover: a read's WAIT fails (the replica
// lags), its entry stays in the consumer's pending list and is read again from there once the
// replica is back; reads of it meanwhile reset its idle time on the master alone. Its lease ends
// before another consumer could take it over on the replica promoted in a failover.
func TestPELRereadAfterAFailedWaitLeaseEndsBeforeATakeover(t *testing.T) {
	t.Parallel()
	master, replica, mc := startReplicated(t)
	rc := redistest.Client(t, replica.URL())
	ctx := context.Background()
	const topic = "events"
	const idle = 3 * time.Second
	c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: master.URL(), ReadTimeout: 3 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, adapters.RequireDeliveryReplicas(c, 1, 200*time.Millisecond))
	require.NoError(t, mc.XGroupCreateMkStream(ctx, topic, "g", "0").Err())
	sub, err := batchsub.NewSubscriber(batchsub.Config{Client: c, ConsumerGroup: "g", Consumer: "a",
		ClaimMinIdle: idle, ClaimInterval: 100 * time.Millisecond, DrainTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	time.Sleep(500 * time.Millisecond)

	resume := lagReplica(t, mc, replica.Signal)
	id, err := mc.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: map[string]any{"uuid": "u", "payload": "p", "metadata": "{}"}}).Result()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		p, err := mc.XPending(ctx, topic, "g").Result()
		return err == nil && p.Count == 1
	}, 5*time.Second, 10*time.Millisecond, "the read delivered it on the master")
	select {
	case m := <-msgs:
		t.Fatalf("handed out while the replica lags: %s", m.Metadata.Get(batchsub.MetaEntryID))
	case <-time.After(5 * time.Second):
	}
	resume()
	var m *message.Message
	select {
	case m = <-msgs:
	case <-time.After(20 * time.Second):
		t.Fatal("no message")
	}
	until, ok := batchsub.LeaseUntil(m.Context())
	require.True(t, ok)
	takenAt := failoverTakeover(t, rc, topic, id, idle)
	t.Logf("lease until %d; another consumer took the entry over on the promoted replica at %d (%d ms after the lease)", until, takenAt, takenAt-until)
	assert.GreaterOrEqual(t, takenAt, until, "another consumer read the entry within the lease of the one holding it")
}
