package ports_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/ports"
)

// takeover is TestParkedUnitTakenOverByAnotherProcessIsNotApplied with the subscriber kind
// as a parameter and, optionally, the operator's replay of the parked entry done while the
// entry is still pending (between A's death and B's takeover). It returns faulty's count once
// both B and any replay have run.
func takeover(t *testing.T, kind string, replayBeforeTakeover bool) int64 {
	env := redistest.Open(t)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	client := redistest.Client(t, env.URL)
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	const retries = 3
	faulty := newFaulty("faulty", func(_ context.Context, id string, attempt int) error {
		if id == "taken-over" && attempt <= retries {
			return errors.New("intermittent failure in the projection")
		}
		return nil
	})
	other := newFaulty("other", nil)
	targets := []ops.ProjectionTarget{{Projection: faulty, Version: 1}, {Projection: other, Version: 1}}
	start := func(consumer string, applier ports.ProjectionApplier, claimIdle time.Duration) context.CancelFunc {
		r, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
			Targets: targets, Backend: adapters.NewProjectorBackend(client, keys), Applier: applier,
			NewSubscriber: adapters.Subscribers{Kind: kind, NewClient: func() (redis.UniversalClient, error) { return redistest.Client(t, env.URL), nil },
				Consumer: consumer, BatchSize: 50, MaxInFlight: 100, BlockTime: 50 * time.Millisecond, NackDelay: 100 * time.Millisecond,
				ClaimInterval: 100 * time.Millisecond, ClaimIdle: claimIdle, DrainTimeout: time.Second, Logger: watermill.NewSlogLogger(log)}.New,
			Retry:        ports.RetryPolicy{InitialInterval: 10 * time.Millisecond, Multiplier: 2, MaxInterval: 50 * time.Millisecond, MaxAttempts: retries},
			CloseTimeout: 5 * time.Second, Logger: log,
		})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		require.Eventually(t, r.Running, 10*time.Second, 10*time.Millisecond)
		return func() {
			cancel()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Error("router did not stop")
			}
		}
	}
	real, err := adapters.NewProjectionApplier(client, keys, 0)
	require.NoError(t, err)
	broken := &flakyApplier{ProjectionApplier: real}
	broken.fail.Store(1 << 30)

	stopA := start("a", broken, time.Hour)
	h := &harness{t: t, keys: keys, client: client, proj: faulty}
	h.add("taken-over", 4)
	require.Eventually(t, func() bool { return len(h.poison()) == 1 }, 15*time.Second, 20*time.Millisecond, "faulty's unit is parked")
	stopA()
	countOf := func(name string) int64 {
		v, err := client.HGet(ctx, keys.ProjectionKey(name, 1, "all", "stats"), "count").Int64()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		require.NoError(t, err)
		return v
	}
	replay := func() {
		es := h.poison()
		require.Len(t, es, 1)
		rp, err := command.NewReplayPoisoned(command.ReplayPoisonedConfig{Backend: adapters.NewOpsBackend(client, keys),
			Projections: []projection.Projection{faulty, other}, Applier: testApplier(t, client, keys), Logger: log})
		require.NoError(t, err)
		_, err = rp.Replay(ctx, es[0].ID)
		require.NoError(t, err)
	}
	if replayBeforeTakeover {
		replay() // the operator replays the parked entry while its live entry is still pending
		require.Equal(t, int64(1), countOf("faulty"))
	}

	stopB := start("b", testApplier(t, client, keys), 300*time.Millisecond)
	defer stopB()
	require.Eventually(t, func() bool {
		p, err := client.XPending(ctx, keys.Stream(), ports.LiveGroupName(nil, true)).Result()
		return err == nil && p.Count == 0 && countOf("other") == 1
	}, 15*time.Second, 20*time.Millisecond, "B takes the entry over and applies its other unit")
	if !replayBeforeTakeover {
		replay()
	}
	return countOf("faulty")
}

// TestParkedRecordOutlivesAReplayBeforeTheTakeover: the parked record lived only as long as the
// poison entry. A parks faulty's unit and dies with the entry pending; the operator replays the
// poison entry (counted once, and the record was deleted with it); B then took the entry over,
// found no record, and applied faulty's unit under the live group: counted twice. The record now
// lives until the entry is acknowledged. (Found by a review helper.)
func TestParkedRecordOutlivesAReplayBeforeTheTakeover(t *testing.T) {
	t.Parallel()
	assert.Equal(t, int64(1), takeover(t, adapters.SubscriberBatched, true), "counted once (by the replay)")
}

// TestParkedUnitTakenOverWithTheStockSubscriber: with SUBSCRIBER=watermill (the stock
// redisstream subscriber) messages carry no _deliveries metadata, so parkedUnits never asked the
// poison queue: the takeover applied the parked unit and the replay counted it again. Without a
// count, every batch is asked about now. (Found by a review helper.)
func TestParkedUnitTakenOverWithTheStockSubscriber(t *testing.T) {
	t.Parallel()
	assert.Equal(t, int64(1), takeover(t, adapters.SubscriberWatermill, false), "counted once (by the replay)")
}
