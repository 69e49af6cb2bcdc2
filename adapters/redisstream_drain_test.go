package adapters_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestDrainingSubscriberHandlesAnEntryAnotherConsumerTookOver: the stock subscriber reads ahead
// (x2 while x1 is handled); consumer B takes x2 over and crashes. When A hands x2 on, it is
// handled there, not acknowledged unhandled: the stock subscriber's XACK is the group's, and
// acking it unhandled took it from B's pending entries, so nobody ever handled it.
func TestDrainingSubscriberHandlesAnEntryAnotherConsumerTookOver(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	ctl := redistest.Client(t, env.URL)
	ctx := context.Background()
	stream, group := env.Prefix+":s", "g"
	newClient := func() *redis.Client {
		c := redistest.Client(t, env.URL)
		return c
	}
	var ids []string
	for _, n := range []string{"x1", "x2", "x3"} {
		id, err := ctl.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{redisstream.UUIDHeaderKey: n, "n": n}}).Result()
		require.NoError(t, err)
		ids = append(ids, id)
	}
	require.NoError(t, ctl.XGroupCreateMkStream(ctx, stream, group, "0").Err())
	stock, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{Client: newClient(), Unmarshaller: adapters.FlatMarshaller{},
		Consumer: "A", ConsumerGroup: group, ClaimInterval: time.Hour, MaxIdleTime: time.Hour, BlockTime: 50 * time.Millisecond,
		DisableIndefiniteInitialBlock: true}, watermill.NopLogger{})
	require.NoError(t, err)
	sub, err := adapters.NewDrainingSubscriber(adapters.DrainingSubscriberConfig{Inner: stock, Client: newClient(),
		ConsumerGroup: group, Consumer: "A", Unmarshaller: adapters.FlatMarshaller{}, DrainTimeout: time.Second})
	require.NoError(t, err)
	sctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		_ = sub.Close()
	}()
	out, err := sub.Subscribe(sctx, stream)
	require.NoError(t, err)
	m1 := <-out
	require.Equal(t, "x1", m1.UUID)
	require.Eventually(t, func() bool { // A's reader has read x2 ahead
		p, err := ctl.XPending(ctx, stream, group).Result()
		return err == nil && p.Count >= 2
	}, 5*time.Second, 10*time.Millisecond)
	// B takes x2 over (idle past CLAIM_IDLE while x1 was slow), then crashes before handling it.
	require.NoError(t, ctl.XClaim(ctx, &redis.XClaimArgs{Stream: stream, Group: group, Consumer: "B", MinIdle: 0, Messages: []string{ids[1]}}).Err())
	m1.Ack()
	handled := map[string]string{}
	timeout := time.After(5 * time.Second)
	for len(handled) < 2 {
		select {
		case m := <-out:
			handled[m.UUID] = m.Metadata.Get(adapters.MetaEntryID)
			m.Ack()
		case <-timeout:
			t.Fatalf("handled %v; x2 was acknowledged unhandled", handled)
		}
	}
	assert.Equal(t, map[string]string{"x2": ids[1], "x3": ids[2]}, handled, "x2 handled here, with its entry ID")
}

// TestFlatMarshallerKeepsTheSubscribersMetadataTheirs: an entry anyone can XADD cannot set the
// metadata the subscribers set ("_" keys: the entry ID, the stream, what is queued behind), and
// a message is never written with them.
func TestFlatMarshallerKeepsTheSubscribersMetadataTheirs(t *testing.T) {
	t.Parallel()
	m, err := adapters.FlatMarshaller{}.Unmarshal(map[string]any{"type": "x", "meta:_entry_id": "0-1", "meta:_queued": "5",
		"meta:_stream": "other", "meta:correlation_id": "c1"})
	require.NoError(t, err)
	assert.Equal(t, "c1", m.Metadata.Get("correlation_id"))
	for _, k := range []string{"_entry_id", "_queued", "_stream"} {
		assert.Empty(t, m.Metadata.Get(k), k)
	}
	m.Metadata.Set(adapters.MetaEntryID, "5-0")
	values, err := adapters.FlatMarshaller{}.Marshal("t", m)
	require.NoError(t, err)
	assert.NotContains(t, values, "meta:"+adapters.MetaEntryID)
	assert.Equal(t, "c1", values["meta:correlation_id"])
}
