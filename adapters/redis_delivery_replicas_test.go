package adapters_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/batchsub"
)

// waitCalls is how many WAITs the server has run (INFO commandstats).
func waitCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_wait:calls="); ok {
			n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	return 0
}

// TestDeliveriesWaitForReplicas: with RequireDeliveryReplicas the batched subscriber's reads
// and keeps are confirmed by the replica (a WAIT on their connection) before their entries are
// handed out with a lease. While the replica lags, new entries are not handed out (a failover
// could lose their delivery, and another consumer would read them within the lease; a read
// that got them onto the consumer's pending list on the master is read again from there); once
// it is back they are handed out, exactly once.
func TestDeliveriesWaitForReplicas(t *testing.T) {
	t.Parallel()
	master, replica, mc := startReplicated(t)
	c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: master.URL(), ReadTimeout: 3 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, adapters.RequireDeliveryReplicas(c, 1, 200*time.Millisecond))
	ctx := context.Background()
	const topic = "events"
	add := func(n int) {
		t.Helper()
		for range n {
			require.NoError(t, mc.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: map[string]any{"uuid": "u", "payload": "p", "metadata": "{}"}}).Err())
		}
	}
	add(3)
	before := waitCalls(t, mc)
	sub, err := batchsub.NewSubscriber(batchsub.Config{Client: c, ConsumerGroup: "g", Consumer: "a",
		ClaimMinIdle: 30 * time.Second, ClaimInterval: 100 * time.Millisecond, DrainTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	receive := func(n int) []*message.Message {
		t.Helper()
		var got []*message.Message
		for len(got) < n {
			select {
			case m := <-msgs:
				got = append(got, m)
			case <-time.After(10 * time.Second):
				t.Fatalf("only %d of %d messages", len(got), n)
			}
		}
		return got
	}
	for _, m := range receive(3) {
		m.Ack()
	}
	assert.Greater(t, waitCalls(t, mc), before, "deliveries are confirmed by a WAIT")

	resume := lagReplica(t, mc, replica.Signal)
	add(2)
	select {
	case m := <-msgs:
		t.Fatalf("entry %s handed out while its delivery is not on the replica", m.Metadata.Get(batchsub.MetaEntryID))
	case <-time.After(time.Second):
	}
	resume()
	got := receive(2)
	for _, m := range got {
		m.Ack()
	}
	require.Eventually(t, func() bool {
		p, err := mc.XPending(ctx, topic, "g").Result()
		return err == nil && p.Count == 0
	}, 10*time.Second, 20*time.Millisecond)
	select {
	case m := <-msgs:
		t.Fatalf("entry %s handed out twice", m.Metadata.Get(batchsub.MetaEntryID))
	case <-time.After(300 * time.Millisecond):
	}
}

// TestKeepWaitsForReplicas: the keep script that renews the leases of the entries a consumer
// holds is confirmed by the replica too: while the replica lags, a held entry's lease is not
// renewed (the idle time it reset could go back in a failover, and another consumer take the
// entry over within the lease); once it is back the lease is renewed again.
func TestKeepWaitsForReplicas(t *testing.T) {
	t.Parallel()
	master, replica, mc := startReplicated(t)
	c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: master.URL(), ReadTimeout: 3 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, adapters.RequireDeliveryReplicas(c, 1, 100*time.Millisecond))
	ctx := context.Background()
	const topic = "events"
	require.NoError(t, mc.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: map[string]any{"uuid": "u", "payload": "p", "metadata": "{}"}}).Err())
	sub, err := batchsub.NewSubscriber(batchsub.Config{Client: c, ConsumerGroup: "g", Consumer: "a",
		ClaimMinIdle: 900 * time.Millisecond, ClaimInterval: 100 * time.Millisecond, DrainTimeout: time.Second})
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
	lease := func() int64 {
		u, ok := batchsub.LeaseUntil(m.Context())
		require.True(t, ok)
		return u
	}
	first := lease()
	require.Eventually(t, func() bool { return lease() > first }, 5*time.Second, 20*time.Millisecond, "kept while the replica keeps up")

	resume := lagReplica(t, mc, replica.Signal)
	time.Sleep(400 * time.Millisecond) // a keep that was under way when the replica stopped ends
	lagging := lease()
	time.Sleep(time.Second) // three keeps' worth (every ClaimMinIdle/3)
	assert.Equal(t, lagging, lease(), "no lease renewed by a keep the replica did not confirm")
	resume()
	require.Eventually(t, func() bool { return lease() > lagging }, 20*time.Second, 50*time.Millisecond, "kept again once the replica is back")
	m.Ack()
}
