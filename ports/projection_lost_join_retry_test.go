package ports_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/ports"
)

// blipApplier fails the first Apply of v2's own group once with a transient error (a failover:
// the very thing that loses a join), and runs onFail as it does.
type blipApplier struct {
	*adapters.ProjectionApplier
	armed  atomic.Bool
	onFail func()
	fired  atomic.Int32
}

func (a *blipApplier) Apply(ctx context.Context, works []projection.Work, prune projection.Prune) ([]projection.Outcome, error) {
	if len(works) > 0 && works[0].Group == "users.v2" && a.armed.CompareAndSwap(true, false) {
		a.fired.Add(1)
		a.onFail()
		return nil, fmt.Errorf("simulated failover: %w", io.ErrUnexpectedEOF)
	}
	return a.ProjectionApplier.Apply(ctx, works, prune)
}

// gatherSubscriber hands out its first n messages (every partition's first read: MAX_IN_FLIGHT
// 200 over 4 partitions) together, as one run the batching takes in one batch, so that the first
// batch of v2's backfill surely mixes partition 3's entries with the others' (what READ_LINGER
// does most of the time).
type gatherSubscriber struct {
	message.Subscriber
	n int
}

func (s *gatherSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		var buf []*message.Message
		deadline := time.After(10 * time.Second)
	gather:
		for len(buf) < s.n {
			select {
			case m, ok := <-in:
				if !ok {
					break gather
				}
				buf = append(buf, m)
			case <-deadline:
				break gather
			}
		}
		for i, m := range buf {
			m.Metadata.Set(ports.MetaQueued, strconv.Itoa(len(buf)-1-i))
			out <- m
		}
		for m := range in {
			out <- m
		}
	}()
	return out, nil
}

// TestLostJoinThenTransientApplyErrorKeepsTheLostEntries: v2's join on partition 3 is
// lost, and the first attempt of a backfill batch (mixing partition 3's entries with others')
// fails applying with a transient Redis error. handle returns that error before aroundLost, so
// the retry middleware takes plan.progress.all() as the units to retry: the attempt's units,
// from which partition 3's entries were filtered out as lost. The router joins partition 3
// again during the retry's backoff; the retry then finds nothing lost, applies the pinned units
// only, and the batch is acked whole: partition 3's entries in it acknowledged unapplied (950 of
// 1,000 check-ins after the switch). Now any error of an attempt that left lost entries out says
// so (errNotJoinedThere), and the batch comes back whole. (Found by a review helper.)
func TestLostJoinThenTransientApplyErrorKeepsTheLostEntries(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys, err := adapters.KeySpace{Prefix: env.Prefix}.WithPartitions(4)
	require.NoError(t, err)
	e := &lostJoinEnv{t: t, ctx: context.Background(), client: client, keys: keys, parts: keys.Partitions(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), projs: []projection.Projection{projection.UserStats{}}}
	e.a = opsApp(t, client, keys, e.projs, app.OpsConfig{RetireGrace: 300 * time.Millisecond, Logger: e.log})
	subs := adapters.Subscribers{Kind: "batched", NewClient: func() (redis.UniversalClient, error) { return redistest.Client(t, env.URL), nil },
		Parts: e.parts, Consumer: "c1", BlockTime: 50 * time.Millisecond, DrainTimeout: 5 * time.Second, Paused: e.paused.Load,
		Logger: watermill.NopLogger{}, MaxInFlight: 200, BatchSize: 400, ReadLinger: 100 * time.Millisecond}
	ap := &blipApplier{ProjectionApplier: testApplier(t, client, keys)}
	e.router, err = ports.NewProjectionRouter(ports.ProjectionRouterConfig{
		Targets: []ops.ProjectionTarget{{Projection: projection.UserStats{}, Version: 1}},
		Backend: adapters.NewProjectorBackend(client, keys), Applier: ap,
		Logger: e.log, CloseTimeout: 10 * time.Second, Retry: ports.DefaultRetryPolicy(),
		NewSubscriber: func(group string, start func(ctx context.Context, stream string) (string, error)) (message.Subscriber, error) {
			sub, err := subs.New(group, start)
			if err != nil || group != "users.v2" {
				return sub, err
			}
			return &gatherSubscriber{Subscriber: sub, n: 200}, nil
		},
	})
	require.NoError(t, err)
	redistest.Background(t, "router", 20*time.Second, e.router.Run)
	require.Eventually(t, e.router.Running, 10*time.Second, 10*time.Millisecond)

	e.add(25)
	require.Eventually(t, func() bool { s, _ := e.total(); return s == 1000 }, 10*time.Second, 20*time.Millisecond)
	e.paused.Store(true)

	// The rebuild: v2 joins every partition, then its join on partition 3 is lost.
	_, err = e.a.Commands.RebuildProjection.Start(e.ctx, "users")
	require.NoError(t, err)
	targets, err := e.a.Queries.ProjectionVersions.Targets(e.ctx, e.projs)
	require.NoError(t, err)
	_, _, err = e.router.SetTargets(e.ctx, targets)
	require.NoError(t, err)
	reg := e.parts.Registry(3)
	joined, err := client.HGet(e.ctx, reg, "live:live").Result()
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(joined), &m))
	delete(m, "users.v2")
	b, _ := json.Marshal(m)
	require.NoError(t, client.HSet(e.ctx, reg, "live:live", string(b)).Err())

	// The first v2 batch's apply meets the failover; meanwhile the join on partition 3 is back
	// (as the router's rejoinIfLost makes it: the same record, nothing was added since).
	ap.onFail = func() {
		require.NoError(t, client.HSet(context.Background(), reg, "live:live", joined).Err())
	}
	ap.armed.Store(true)
	e.paused.Store(false)
	require.Eventually(t, func() bool { return ap.fired.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "the transient failure happened")

	// The registry watch finishes the rebuild (and would join partition 3 again, had it not been).
	watch := ports.RegistryWatch{Router: e.router, Versions: e.a.Queries.ProjectionVersions, Rebuild: e.a.Commands.RebuildProjection,
		Projections: e.projs, Interval: 50 * time.Millisecond, Logger: e.log}
	redistest.Background(t, "registry watcher", 20*time.Second, watch.Run)
	versions := adapters.NewProjectionVersions(client, keys)
	require.Eventually(t, func() bool {
		st, err := versions.State(e.ctx, "users")
		require.NoError(t, err)
		return st.Serving == 2 && st.Building == 0 && st.Retiring == 0
	}, 20*time.Second, 20*time.Millisecond, "the rebuild never finished")
	s, byPart := e.total()
	require.Equal(t, int64(1000), s, "after the switch to v2, by partition %v (partition 3 had 250 check-ins)", byPart)
}
