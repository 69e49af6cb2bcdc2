package adapters_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/batchsub"
	"github.com/checkins/checkins/app/projection"
)

// TestFencedScriptsOnMiniredis: the embedded quick start runs the fenced scripts on
// miniredis: TIME in Lua (apply, decide, park, keep, ack), XINFO STREAM, XPENDING with and
// without a consumer, XRANGE id id (keep), XCLAIM JUSTID.
func TestFencedScriptsOnMiniredis(t *testing.T) {
	mini := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mini.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	env := projEnv{client: client, keys: adapters.KeySpace{Prefix: "mini"}}
	a := env.applier(t, client)
	ev := recorded("mini-1", 7, 9, 4, time.Now().UnixMilli())
	id := entry(ev.RecordedAt)
	now := env.redisNowMs(t)

	_, err := a.Decide(projection.WithLease(ctx, now-1), []projection.EventRef{projection.RefOf(ev, id)})
	require.ErrorIs(t, err, projection.ErrLeaseExpired)
	counted, err := a.Decide(projection.WithLease(ctx, now+60_000), []projection.EventRef{projection.RefOf(ev, id)})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, counted)
	q := adapters.NewPoisonQueue(client, env.keys)
	_, err = q.Park(projection.WithLease(ctx, now-1), parkable(ev, id))
	require.ErrorIs(t, err, projection.ErrLeaseExpired)
	_, err = q.Park(projection.WithLease(ctx, now+60_000), parkable(ev, id))
	require.NoError(t, err)

	// The subscriber: keep (clock, XCLAIM JUSTID, XPENDING, XINFO STREAM) and the fenced ack.
	const topic = "mini-events"
	for i := 0; i < 3; i++ {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: map[string]any{"uuid": "u", "payload": "p", "metadata": "{}"}}).Err())
	}
	sub, err := batchsub.NewSubscriber(batchsub.Config{Client: client, ConsumerGroup: "g", Consumer: "a",
		ClaimMinIdle: 600 * time.Millisecond, ClaimInterval: 100 * time.Millisecond, DrainTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	var got []*message.Message
	for len(got) < 3 {
		select {
		case m := <-msgs:
			got = append(got, m)
		case <-time.After(5 * time.Second):
			t.Fatalf("only %d of 3 messages", len(got))
		}
	}
	time.Sleep(time.Second) // keep runs several times (ClaimMinIdle/3) while the handler holds them
	p, err := client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: topic, Group: "g", Start: "-", End: "+", Count: 10}).Result()
	require.NoError(t, err)
	require.Len(t, p, 3)
	for _, e := range p {
		require.Equal(t, "a", e.Consumer, "kept, not taken over")
		require.Less(t, e.Idle, 600*time.Millisecond, "keep reset the idle time")
	}
	for _, m := range got {
		until, ok := batchsub.LeaseUntil(m.Context())
		require.True(t, ok)
		require.Greater(t, until, env.redisNowMs(t), "lease renewed by keep")
		m.Ack()
	}
	require.Eventually(t, func() bool {
		n, err := client.XPending(ctx, topic, "g").Result()
		return err == nil && n.Count == 0
	}, 5*time.Second, 20*time.Millisecond, "the fenced XACK acknowledged them")
}
