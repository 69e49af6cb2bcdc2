package adapters_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/batchsub"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/domain"
)

// partitionedPublisher is a publisher on its own client of env, into n partitions of env's keys.
func partitionedPublisher(t *testing.T, env projEnv, n int) (adapters.Partitions, *adapters.EventPublisher) {
	t.Helper()
	parts, err := adapters.NewPartitions(env.keys, n)
	require.NoError(t, err)
	pub, err := adapters.NewEventPublisher(env.newClient(t), env.keys, watermill.NopLogger{})
	require.NoError(t, err)
	pub.WithPartitions(parts)
	t.Cleanup(func() { _ = pub.Close() })
	return parts, pub
}

// TestPartitionedPublishAndSubscribe: check-ins published with P = 4 land in their user's
// partition, in order; one merged subscription of the 4 partitions delivers each exactly once,
// with its partition's stream in the metadata, each user's in order, runs of one partition
// unbroken; acks leave nothing pending on any partition. On a single server and on a cluster.
func TestPartitionedPublishAndSubscribe(t *testing.T) {
	eachEnv(t, func(t *testing.T, env projEnv) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		parts, pub := partitionedPublisher(t, env, 4)

		const users, each = 40, 15
		var mu sync.Mutex
		order := map[int64][]string{} // user -> checkinIds in publish order
		var wg sync.WaitGroup
		for u := int64(1); u <= users; u++ {
			wg.Go(func() {
				for i := range each {
					e := recorded(uuid.NewString(), u, 1+int64(i)%5, i%6, 1_700_000_000_000+int64(i))
					require.NoError(t, pub.PublishCheckinRecorded(ctx, e, ""))
					mu.Lock()
					order[u] = append(order[u], e.ID)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		perPartition := make([]int64, parts.Count())
		for p, stream := range parts.Streams() {
			xs, err := env.client.XRange(ctx, stream, "-", "+").Result()
			require.NoError(t, err)
			perPartition[p] = int64(len(xs))
			for _, x := range xs {
				u := x.Values[domain.FieldUserID].(string)
				id, err := parseInt(u)
				require.NoError(t, err)
				assert.Equal(t, stream, parts.StreamOf(id), "user %s", u)
			}
		}
		for p, n := range perPartition {
			assert.Positive(t, n, "partition %d took none of %d users", p, users)
		}

		inner, err := batchsub.NewSubscriber(batchsub.Config{Client: env.newClient(t), ConsumerGroup: "g", Consumer: "c1",
			Unmarshaller: adapters.FlatMarshaller{}, BatchSize: 7})
		require.NoError(t, err)
		sub := adapters.NewPartitionedSubscriber(inner, parts, env.keys.Stream())
		t.Cleanup(func() { _ = sub.Close() })
		msgs, err := sub.Subscribe(ctx, env.keys.Stream())
		require.NoError(t, err)
		// Joining is opportunistic (runs ready at the moment one is taken): a moment before the
		// first read lets every partition's subscription read its first batch, so the runs of
		// several are ready at once however slowly this machine schedules them (under -race on
		// two busy cores, consuming as fast as they arrived joined none in one CI run).
		time.Sleep(300 * time.Millisecond)

		got := map[int64][]string{}
		seen := map[string]bool{}
		runLeft, runStreams, joined := 0, map[string]bool{}, 0
		for n := 0; n < users*each; n++ {
			var m *message.Message
			select {
			case m = <-msgs:
			case <-ctx.Done():
				t.Fatalf("only %d of %d check-ins delivered", n, users*each)
			}
			require.NotNil(t, m)
			stream := m.Metadata.Get(adapters.MetaStream)
			queued, err := strconv.Atoi(m.Metadata.Get(batchsub.MetaQueued))
			require.NoError(t, err)
			if runLeft > 0 {
				assert.Equal(t, runLeft-1, queued, "MetaQueued counts down through a run")
			}
			runStreams[stream] = true
			if runLeft = queued; runLeft == 0 {
				if len(runStreams) > 1 {
					joined++
				}
				runStreams = map[string]bool{}
			}
			fields, err := adapters.DecodeFields(m)
			require.NoError(t, err)
			u, err := parseInt(fields[domain.FieldUserID])
			require.NoError(t, err)
			assert.Equal(t, parts.StreamOf(u), stream)
			id := fields[domain.FieldCheckinID]
			assert.False(t, seen[id], "delivered twice: %s", id)
			seen[id] = true
			got[u] = append(got[u], id)
			m.Ack()
		}
		assert.Equal(t, order, got, "every user's check-ins, in order")
		assert.Positive(t, joined, "runs of several partitions ready at once are joined into one")
		require.NoError(t, sub.Close())
		for _, stream := range parts.Streams() {
			pending, err := env.client.XPending(ctx, stream, "g").Result()
			require.NoError(t, err)
			assert.Zero(t, pending.Count, stream)
		}
	})
}

func parseInt(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }

// TestPartitionedSubscriberLingersForOtherPartitions: with a linger, a run that is short waits
// for other partitions' runs and goes out joined with them; without one, what is not ready at
// once goes out apart.
func TestPartitionedSubscriberLingersForOtherPartitions(t *testing.T) {
	t.Parallel()
	env := projEnv{url: redistest.Open(t).URL}
	env.client = redistest.Client(t, env.url)
	for _, tc := range []struct {
		name   string
		linger time.Duration
		joined bool
	}{{"lingering", 2 * time.Second, true}, {"not lingering", 0, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			env := env
			env.keys = adapters.KeySpace{Prefix: "linger-" + uuid.NewString()}
			parts, pub := partitionedPublisher(t, env, 4)
			userIn := func(p int) int64 {
				for u := int64(1); ; u++ {
					if parts.StreamOf(u) == parts.Stream(p) {
						return u
					}
				}
			}
			inner, err := batchsub.NewSubscriber(batchsub.Config{Client: env.newClient(t), ConsumerGroup: "g", Consumer: "c1",
				Unmarshaller: adapters.FlatMarshaller{}, BatchSize: 40, BlockTime: 50 * time.Millisecond})
			require.NoError(t, err)
			sub := adapters.NewPartitionedSubscriber(inner, parts, env.keys.Stream()).WithLinger(tc.linger, 10)
			t.Cleanup(func() { _ = sub.Close() })
			msgs, err := sub.Subscribe(ctx, env.keys.Stream())
			require.NoError(t, err)
			time.Sleep(300 * time.Millisecond) // every partition's subscription is reading

			next := func() *message.Message {
				select {
				case m := <-msgs:
					m.Ack()
					return m
				case <-ctx.Done():
					t.Fatal("nothing delivered")
					return nil
				}
			}
			require.NoError(t, pub.PublishCheckinRecorded(ctx, recorded("first", userIn(0), 1, 1, 1_700_000_000_000), ""))
			if !tc.joined {
				assert.Equal(t, "0", next().Metadata.Get(batchsub.MetaQueued), "alone: nothing else was ready")
			}
			time.Sleep(100 * time.Millisecond)
			require.NoError(t, pub.PublishCheckinRecorded(ctx, recorded("second", userIn(1), 1, 1, 1_700_000_000_001), ""))
			if tc.joined {
				first := next()
				assert.Equal(t, "1", first.Metadata.Get(batchsub.MetaQueued), "the short run waited for the other partition's")
				assert.Equal(t, parts.Stream(0), first.Metadata.Get(adapters.MetaStream))
			}
			second := next()
			assert.Equal(t, "0", second.Metadata.Get(batchsub.MetaQueued))
			assert.Equal(t, parts.Stream(1), second.Metadata.Get(adapters.MetaStream))

		})
	}
}

// failPartition fails the Subscribe of one stream while fail is set.
type failPartition struct {
	message.Subscriber
	stream string
	fail   *atomic.Bool
}

func (f failPartition) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == f.stream && f.fail.Load() {
		return nil, errors.New("OOM command not allowed when used memory > 'maxmemory' (injected)")
	}
	return f.Subscriber.Subscribe(ctx, topic)
}

// TestPartitionedSubscribeThatFailsEndsThePartitionsItStarted: when one partition's subscription
// fails, those already started end at once, handing back what they read; a new Subscribe then
// works and delivers everything. They went on unread, holding their entries and their topics
// (the next Subscribe refused as already subscribed) until their drain timed out.
func TestPartitionedSubscribeThatFailsEndsThePartitionsItStarted(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	parts, pub := partitionedPublisher(t, env, 4)
	const users = 40
	for u := int64(1); u <= users; u++ {
		require.NoError(t, pub.PublishCheckinRecorded(ctx, recorded(uuid.NewString(), u, 1, 1, 1_700_000_000_000), ""))
	}
	inner, err := batchsub.NewSubscriber(batchsub.Config{Client: env.newClient(t), ConsumerGroup: "g", Consumer: "c1",
		Unmarshaller: adapters.FlatMarshaller{}, BatchSize: 7, DrainTimeout: time.Minute})
	require.NoError(t, err)
	fail := &atomic.Bool{}
	fail.Store(true)
	sub := adapters.NewPartitionedSubscriber(failPartition{inner, parts.Streams()[2], fail}, parts, env.keys.Stream())
	t.Cleanup(func() { _ = sub.Close() })
	_, err = sub.Subscribe(ctx, env.keys.Stream())
	require.ErrorContains(t, err, "subscribe partition 2")
	fail.Store(false)

	var msgs <-chan *message.Message
	require.Eventually(t, func() bool {
		msgs, err = sub.Subscribe(ctx, env.keys.Stream())
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "a new Subscribe well before the minute of drain: %v", err)
	seen := map[string]bool{}
	for len(seen) < users {
		select {
		case m := <-msgs:
			seen[m.UUID] = true
			m.Ack()
		case <-time.After(15 * time.Second):
			t.Fatalf("%d of %d check-ins delivered", len(seen), users)
		}
	}
}
