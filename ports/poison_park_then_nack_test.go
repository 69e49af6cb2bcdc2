package ports_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
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

// flakyApplier is the real applier, whose next `fail` Apply calls with something to apply fail
// with a connection reset (a transient Redis failure, as on a failover or a dropped connection)
// before touching Redis.
type flakyApplier struct {
	*adapters.ProjectionApplier
	fail atomic.Int32
}

func (a *flakyApplier) Apply(ctx context.Context, works []projection.Work, prune projection.Prune) ([]projection.Outcome, error) {
	if len(works) > 0 && a.fail.Add(-1) >= 0 {
		return nil, fmt.Errorf("apply projection updates: %w", syscall.ECONNRESET)
	}
	return a.ProjectionApplier.Apply(ctx, works, prune)
}

// TestParkedThenNackedEntryIsCountedOnce: projection "faulty" fails an event intermittently
// (every attempt of its first delivery), projection "other" handles it fine. The poison
// middleware parks faulty's unit (decision "counted"), then applies the held unit of "other",
// which meets a transient Redis error on every retry, so the batch is nacked after the park. The
// entry came back to the live group, where "faulty" now succeeded and counted it; the operator's
// replay of the parked entry (under the replay group's own markers, with the parked decision)
// counted it a second time. Now a unit this process parked is not applied when its entry comes
// back before it is acknowledged: "other" is counted on the redelivery, "faulty" by the replay,
// each once. (Found by a review helper.)
func TestParkedThenNackedEntryIsCountedOnce(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	client := redistest.Client(t, env.URL)
	ctx := context.Background()

	real, err := adapters.NewProjectionApplier(client, keys, 0)
	require.NoError(t, err)
	applier := &flakyApplier{ProjectionApplier: real}
	const retries = 3
	faulty := newFaulty("faulty", func(_ context.Context, id string, attempt int) error {
		if id == "flaky" && attempt <= retries {
			if attempt == retries {
				// The unit is about to be parked: the apply of the held unit that follows, and
				// its retries, meet a transient Redis failure.
				applier.fail.Store(retries)
			}
			return errors.New("intermittent failure in the projection")
		}
		return nil
	})
	other := newFaulty("other", nil)

	log := slog.New(slog.DiscardHandler)
	var subMu sync.Mutex
	var subClients []*redis.Client
	newSub := adapters.Subscribers{Kind: "batched", NewClient: func() (redis.UniversalClient, error) {
		opt, err := redis.ParseURL(env.URL)
		if err != nil {
			return nil, err
		}
		c := redis.NewClient(opt)
		subMu.Lock()
		subClients = append(subClients, c)
		subMu.Unlock()
		return c, nil
	}, Consumer: "c1", BatchSize: 50, MaxInFlight: 100, BlockTime: 50 * time.Millisecond, NackDelay: 100 * time.Millisecond,
		ClaimInterval: time.Second, ClaimIdle: 5 * time.Second, DrainTimeout: 5 * time.Second, Logger: watermill.NewSlogLogger(log)}.New
	r, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
		Targets:       []ops.ProjectionTarget{{Projection: faulty, Version: 1}, {Projection: other, Version: 1}},
		Backend:       adapters.NewProjectorBackend(client, keys),
		Applier:       applier,
		NewSubscriber: newSub,
		Retry:         ports.RetryPolicy{InitialInterval: 10 * time.Millisecond, Multiplier: 2, MaxInterval: 50 * time.Millisecond, MaxAttempts: retries},
		CloseTimeout:  10 * time.Second, Logger: log,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		subMu.Lock()
		defer subMu.Unlock()
		for _, c := range subClients {
			_ = c.Close()
		}
	})
	redistest.Background(t, "router", 20*time.Second, r.Run)
	require.Eventually(t, r.Running, 10*time.Second, 10*time.Millisecond, "router never started")

	h := &harness{t: t, keys: keys, client: client, proj: faulty}
	countOf := func(name string) int64 {
		v, err := client.HGet(ctx, keys.ProjectionKey(name, 1, "all", "stats"), "count").Int64()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		require.NoError(t, err)
		return v
	}
	pending := func() int64 {
		p, err := client.XPending(ctx, keys.Stream(), ports.LiveGroupName(nil, true)).Result()
		if err != nil {
			return -1
		}
		return p.Count
	}

	h.add("flaky", 4)
	require.Eventually(t, func() bool {
		return countOf("other") == 1 && pending() == 0
	}, 15*time.Second, 20*time.Millisecond, "the redelivery applies the entry's other unit")
	assert.Zero(t, countOf("faulty"), "the parked unit is not applied on the redelivery: its replay counts it")
	assert.Equal(t, retries, faulty.attempts("flaky"), "nor even handled")
	es := h.poison()
	require.Len(t, es, 1, "parked once")
	assert.Equal(t, ops.DecisionCounted, es[0].Decision)
	// The operator replays what the poison queue holds.
	replay, err := command.NewReplayPoisoned(command.ReplayPoisonedConfig{
		Backend:     adapters.NewOpsBackend(client, keys),
		Projections: []projection.Projection{faulty, other},
		Applier:     testApplier(t, client, keys),
		Logger:      slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	res, err := replay.Replay(ctx, es[0].ID)
	require.NoError(t, err)
	assert.True(t, res.Applied, "the replay counts it: %+v", res)
	assert.Equal(t, int64(1), countOf("faulty"), "one check-in, counted once by projection faulty")
	assert.Equal(t, int64(1), countOf("other"))
}

// TestParkedUnitTakenOverByAnotherProcessIsNotApplied: the projector that parked faulty's unit
// dies before the entry is acknowledged (here: every apply of the entry's other unit fails, and
// the process stops), so the entry stays pending; another projector takes it over after
// CLAIM_IDLE, where faulty's intermittent failure is gone. It applied the parked unit, and the
// replay counted it again: what the process that parked it remembers does not cross processes.
// Now the poison queue records each parked unit with the park, until its entry is acknowledged,
// and a redelivered entry's parked units are left to the replay.
func TestParkedUnitTakenOverByAnotherProcessIsNotApplied(t *testing.T) {
	t.Parallel()
	r := newTakeover(t, adapters.SubscriberBatched)
	require.Zero(t, r.countOf("other"))
	r.takeOverWithB()
	assert.Zero(t, r.countOf("faulty"), "the parked unit is left to the replay")
	require.Eventually(t, func() bool {
		n, err := r.client.HLen(r.ctx, r.keys.PoisonParked()).Result()
		return err == nil && n == 0
	}, 5*time.Second, 20*time.Millisecond, "the record goes once the entry is acknowledged")

	res := r.replay()
	assert.True(t, res.Applied, "%+v", res)
	assert.Equal(t, int64(1), r.countOf("faulty"), "counted once, by the replay")
}
