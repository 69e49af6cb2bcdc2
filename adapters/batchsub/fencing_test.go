package batchsub_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/batchsub"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestQueuedCountHoldsWhenEntriesAreTakenOver: MetaQueued promises that N more messages are ready
// right behind this one; ports.batching then blocks on the channel until N more arrive. Entries
// that keep marked taken while they waited in dispatch's queue were dropped at their turn, so the
// promised messages never came: the batch (and with it the drain at Close) waited for the next
// entry of the stream. Now they are handed out (their writes are refused, and they are let go when
// nacked). (Found by a review helper.)
//
// Interleaving: dispatch prepares X1 with MetaQueued=2 and blocks on out (the router is busy);
// another consumer holds X2 and X3 now (here: XCLAIM, as its XAUTOCLAIM does after this one stood
// still); keep marks them taken; the receiver takes X1 and waits for 2 more: none come.
func TestQueuedCountHoldsWhenEntriesAreTakenOver(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	ctx := context.Background()
	const topic = "queued-taken"
	_, ids := publish(t, client, topic, "m", 3)

	sub := newSub(t, client, batchsub.Config{
		Consumer:      "a",
		ClaimMinIdle:  300 * time.Millisecond, // keep every 100ms
		ClaimInterval: time.Hour,              // a's own XAUTOCLAIM does not take them back
		DrainTimeout:  2 * time.Second,
	})
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return consumerPending(t, client, topic, "a") == 3 }, waitFor, pollEvery)
	time.Sleep(100 * time.Millisecond) // dispatch has X1 ready, with MetaQueued=2

	// Another consumer holds X2 and X3 now.
	require.NoError(t, client.XClaim(ctx, &redis.XClaimArgs{Stream: topic, Group: group, Consumer: "b",
		MinIdle: 0, Messages: ids[1:]}).Err())
	time.Sleep(500 * time.Millisecond) // a's keep marks them taken

	first := receive(t, msgs)
	require.Equal(t, ids[0], first.Metadata.Get(batchsub.MetaEntryID))
	queued, err := strconv.Atoi(first.Metadata.Get(batchsub.MetaQueued))
	require.NoError(t, err)
	first.Ack()
	for i := 0; i < queued; i++ {
		select {
		case m := <-msgs:
			m.Ack()
		case <-time.After(3 * time.Second):
			t.Fatalf("MetaQueued said %d more messages were ready behind %s; message %d never came (a consumer batching on it blocks)",
				queued, ids[0], i+1)
		}
	}
}

// TestEntriesPastHoldMaxAreRenewedWhenTheirWritesAreRefused: keep stopped renewing an entry held
// longer than HoldMax, so once its lease had run out its writes were refused until an XAUTOCLAIM
// gave it a new lease. When the in-flight set was full (MaxInFlight unacked: the reader filled it
// while the handler failed, e.g. a long Redis apply outage), this consumer's claimRound waited
// for capacity and never claimed, and the reader waited too: with no other consumer in the group
// nothing ever gave the entries a new lease. Every apply was refused, every nack redelivered, for
// ever. Now an entry nacked after its lease ran out is kept by the next keep, whatever HoldMax
// says, when it is still this consumer's. (Found by a review helper.)
//
// The handler stands for the projector: it fails during the outage, and afterwards writes only
// while Redis's clock is before LeaseUntil (what applyScript checks), nacking otherwise.
func TestEntriesPastHoldMaxAreRenewedWhenTheirWritesAreRefused(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	ctx := context.Background()
	const topic = "holdmax-full"
	publish(t, client, topic, "m", 2)

	sub := newSub(t, client, batchsub.Config{
		Consumer:      "a",
		MaxInFlight:   2,
		ClaimMinIdle:  time.Second,
		ClaimInterval: 100 * time.Millisecond,
		HoldMax:       500 * time.Millisecond,
		NackDelay:     100 * time.Millisecond,
		DrainTimeout:  time.Second,
	})
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	var outage atomic.Bool
	outage.Store(true)
	var acked, refused atomic.Int32
	go func() {
		for m := range msgs {
			if outage.Load() {
				m.Nack()
				continue
			}
			until, ok := batchsub.LeaseUntil(m.Context())
			now, err := client.Time(ctx).Result()
			if !ok || err != nil || now.UnixMilli() >= until {
				refused.Add(1)
				m.Nack()
				continue
			}
			acked.Add(1)
			m.Ack()
		}
	}()

	time.Sleep(3 * time.Second) // the outage outlasts HoldMax + ClaimMinIdle
	outage.Store(false)
	ok := assertEventually(func() bool { return acked.Load() == 2 && pendingCount(t, client, topic) == 0 }, 10*time.Second)
	require.True(t, ok, "after the outage both entries are applied and acknowledged: acked %d, refused %d since, pending %d",
		acked.Load(), refused.Load(), pendingCount(t, client, topic))
}

func assertEventually(cond func() bool, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(pollEvery)
	}
	return cond()
}
