package batchsub_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/batchsub"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestEntryLostInAFailoverIsKeptWhateverTheStreamHoldsNow: keepScript's rule for an entry this
// consumer holds that is pending to none and no longer in the stream was "lost in a failover
// (still ours, renewed) if at or above the stream's first entry, else trimmed (gone)". The
// promoted replica's stream has no first entry at or below a lost entry when it holds no entry
// at all (a partition RETENTION had emptied, or a new one), or when the only entries it holds
// were added after the failover (their IDs are above the lost ones'). The lost entry was then
// taken for trimmed and let go: never applied, though only this consumer can apply it (the
// very case the "lost" rule exists for: TestClusterProjectionMinReplicas). Now trimmed means at
// or below the stream's max-deleted-entry-id. (Found by a review helper.)
//
// Each subtest emulates on one server the state a replica promoted without the entry has: the
// stream is replaced, in one MULTI, by what the replica had (the group at the position before the
// entry, no pending entry, the older entries only), then writes go on.
func TestEntryLostInAFailoverIsKeptWhateverTheStreamHoldsNow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		older bool // the replica had an older entry (the control case: kept today)
		after bool // an entry is added to the promoted replica's stream after the failover
	}{
		{"replica had an older entry", true, false},
		{"replica's stream was empty", false, false},
		{"replica's stream was empty, new entries since", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, redistest.Options{})
			client, _ := newClient(t, srv)
			ctx := context.Background()
			const topic = "lost-in-failover"
			var olderID string
			if tc.older {
				_, ids := publish(t, client, topic, "old", 1)
				olderID = ids[0]
				require.NoError(t, client.XGroupCreate(ctx, topic, group, olderID).Err()) // delivered and acked before
			}
			sub := newSub(t, client, batchsub.Config{
				Consumer:      "a",
				ClaimMinIdle:  600 * time.Millisecond, // keep every 200ms; lease span 480ms
				ClaimInterval: time.Hour,
				DrainTimeout:  time.Second,
			})
			msgs, err := sub.Subscribe(ctx, topic)
			require.NoError(t, err)
			_, ids := publish(t, client, topic, "lost", 1)
			m := receive(t, msgs)
			require.Equal(t, ids[0], m.Metadata.Get(batchsub.MetaEntryID))
			// The handler is still at work on it (it has decided it, say, in a registry on
			// another master) when the stream's master dies and a replica without it is promoted.
			_, err = client.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Del(ctx, topic)
				if tc.older {
					p.XAdd(ctx, &redis.XAddArgs{Stream: topic, ID: olderID, Values: map[string]any{"k": "v"}})
					p.XGroupCreate(ctx, topic, group, olderID)
				} else {
					p.XGroupCreateMkStream(ctx, topic, group, "0")
				}
				return nil
			})
			require.NoError(t, err)
			if tc.after {
				time.Sleep(5 * time.Millisecond)
				publish(t, client, topic, "new", 1) // check-ins go on, on the promoted replica
			}
			time.Sleep(time.Second) // several keeps

			until, ok := batchsub.LeaseUntil(m.Context())
			require.True(t, ok)
			now, err := client.Time(ctx).Result()
			require.NoError(t, err)
			require.Greater(t, until, now.UnixMilli(),
				"entry %s, lost with the failover, is still this consumer's to apply (nobody else can): its lease is renewed, not run out (%d)", ids[0], until)
			m.Ack()
		})
	}
}
