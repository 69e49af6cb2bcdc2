package batchsub_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/batchsub"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestOwnHeldEntryReportedDeletedIsLetGoWhenNacked: claimRound acked every ID XAUTOCLAIM
// reported deleted, and the acker's xacked then removed it from the in-flight set, without
// unacked-- and without marking it taken. XAUTOCLAIM also reports this consumer's OWN idle
// entries (held past HoldMax, or after it stood still longer than ClaimMinIdle) when the stream
// lost them (RETENTION trim, XDEL). If such an entry was handed out at that moment, its message's
// LeaseUntil was 1 from then on (not a member), every write was refused, the handler nacked, and
// dispatch redelivered it for ever (isTaken was false for a non-member, drop never ran), leaking
// one unacked slot of MaxInFlight for good. Now a held entry reported deleted is marked taken.
// (Found by a review helper.)
//
// Interleaving: a reads E and hands it out; the handler hangs past HoldMax, so keep stops
// renewing E; E is trimmed (XDEL here); after ClaimMinIdle a's own XAUTOCLAIM reports E deleted;
// the handler comes back, its lease has run out, it nacks.
func TestOwnHeldEntryReportedDeletedIsLetGoWhenNacked(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	ctx := context.Background()
	const topic = "own-deleted"
	_, ids := publish(t, client, topic, "m", 1)

	sub := newSub(t, client, batchsub.Config{
		Consumer:      "a",
		ClaimMinIdle:  300 * time.Millisecond,
		ClaimInterval: 50 * time.Millisecond,
		HoldMax:       100 * time.Millisecond,
		NackDelay:     50 * time.Millisecond,
		DrainTimeout:  time.Second,
	})
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	first := receive(t, msgs)
	require.Equal(t, ids[0], first.Metadata.Get(batchsub.MetaEntryID))
	// The handler hangs past HoldMax: keep's XCLAIM no longer touches E (Redis 7's XCLAIM would
	// drop a deleted entry from the PEL itself).
	time.Sleep(250 * time.Millisecond)
	// The stream loses E while the handler works on it.
	require.NoError(t, client.XDel(ctx, topic, ids[0]).Err())
	// a's own XAUTOCLAIM (after ClaimMinIdle of idleness) reports it deleted and takes it out of the PEL.
	require.Eventually(t, func() bool { return pendingCount(t, client, topic) == 0 }, waitFor, pollEvery)
	time.Sleep(300 * time.Millisecond) // the acker's flush of the deleted ID ran

	// The handler is the projector: it writes only before LeaseUntil, by Redis's clock.
	var deliveries atomic.Int32
	handle := func(m interface {
		Context() context.Context
		Ack() bool
		Nack() bool
	}) {
		deliveries.Add(1)
		until, ok := batchsub.LeaseUntil(m.Context())
		now, err := client.Time(ctx).Result()
		if !ok || err != nil || now.UnixMilli() >= until {
			m.Nack()
			return
		}
		m.Ack()
	}
	handle(first)
	go func() {
		for m := range msgs {
			handle(m)
		}
	}()
	time.Sleep(2 * time.Second)
	t.Logf("deliveries %d", deliveries.Load())
	require.LessOrEqual(t, deliveries.Load(), int32(2),
		"the entry the stream lost, XAUTOCLAIM dropped from the PEL and the acker took out of the in-flight set is redelivered every NackDelay for ever (%d deliveries in 2s)", deliveries.Load())
}
