package ports_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// TestOtherLiveGroupLeavesWhatABackfillRegistered: two projectors with different PROJECTIONS
// sets, so two live groups ("live:backfill" and "live:other") on one stream and one dedupe
// registry per user. A rebuild of "backfill" (v2) starts: the projector of live:backfill holds its
// registry floors as the backfill starts (swapHandlers -> HoldRegistryFloors), but the projector
// of live:other never added a handler for it and so never held: until its next checkpoint it kept
// the floors of before (everything up to now passed), and its call deciding a check-in of user 1
// pruned her registry below them, removing the identity the backfill had just registered for a
// two-hour-old check-in. The copy of that check-in 10 s later was then counted again in v2 (404
// against v1's 403). Now every batch reads the registries' count of joins with its membership,
// and a projector that sees it change holds its floors until its next checkpoint.
//
// The projector of live:other checkpoints every 3 s here (the default is 250 ms, and a
// checkpoint of many partitions under a drain takes seconds): the window is one checkpoint of
// the other group's projector, made wide enough to hit every run.
func TestOtherLiveGroupLeavesWhatABackfillRegistered(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	client := redistest.Client(t, env.URL)
	ctx := context.Background()

	// Version 2 handles the copy (the dup's fourth handling: v1's two, then its own first) a
	// second late.
	bf := newFaulty("backfill", func(ctx context.Context, id string, n int) error {
		if id == "dup" && n == 4 {
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
			}
		}
		return nil
	})
	other := newFaulty("other", nil)

	values := func(e domain.CheckinRecorded) map[string]any {
		msg, err := adapters.NewEventMessage(e.Fields(), "corr")
		require.NoError(t, err)
		v, err := adapters.FlatMarshaller{}.Marshal(keys.Stream(), msg)
		require.NoError(t, err)
		return v
	}
	at := func(ms int64, e domain.CheckinRecorded) string {
		id := ""
		if ms > 0 {
			id = strconv.FormatInt(ms, 10) + "-0"
		}
		got, err := client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), ID: id, Values: values(e)}).Result()
		require.NoError(t, err)
		return got
	}
	ck := func(id string, user, ts int64) domain.CheckinRecorded {
		return domain.CheckinRecorded{Checkin: domain.Checkin{ID: id, UserID: user, LocationID: 2, StarRating: 3, Timestamp: ts}, RecordedAt: ts}
	}
	old := time.Now().Add(-2 * time.Hour).UnixMilli()
	const fillers = 400
	at(old, ck("dup", 1, old))
	for i := range fillers {
		at(old+1+int64(i), ck("fill-"+strconv.Itoa(i), int64(2+i), old))
	}
	at(old+10_000, ck("dup", 1, old)) // the same check-in 10 s later: a duplicate
	recent := at(0, ck("recent", 9999, time.Now().UnixMilli()))

	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	start := func(name string, p *faultyProjection, group string, every time.Duration) (*ports.ProjectionRouter, *adapters.ProjectionApplier) {
		newSub := adapters.Subscribers{Kind: "batched", NewClient: func() (redis.UniversalClient, error) { return redistest.Client(t, env.URL), nil },
			Consumer: name, BatchSize: 50, MaxInFlight: 100, BlockTime: 50 * time.Millisecond, NackDelay: 100 * time.Millisecond,
			ClaimInterval: time.Second, ClaimIdle: 5 * time.Second, DrainTimeout: 5 * time.Second, Logger: watermill.NewSlogLogger(log)}.New
		applier := windowOf(time.Minute, 1)(client, keys)
		r, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
			Targets: []ops.ProjectionTarget{{Projection: p, Version: 1}}, LiveGroup: group,
			Backend: adapters.NewProjectorBackend(client, keys), Applier: applier, NewSubscriber: newSub,
			Retry:          ports.RetryPolicy{InitialInterval: 10 * time.Millisecond, Multiplier: 2, MaxInterval: 50 * time.Millisecond, MaxAttempts: 3},
			HandlerTimeout: 10 * time.Second, CloseTimeout: 10 * time.Second, CheckpointInterval: every, Logger: log.With("router", name),
		})
		require.NoError(t, err)
		redistest.Background(t, name, 20*time.Second, r.Run)
		require.Eventually(t, r.Running, 10*time.Second, 10*time.Millisecond, "router %s never started", name)
		return r, applier
	}
	a, _ := start("a", bf, ports.LiveGroupName([]string{"backfill"}, false), 0)
	start("b", other, ports.LiveGroupName([]string{"other"}, false), 3*time.Second)

	countOf := func(p string, version int) int64 {
		v, err := client.HGet(ctx, keys.ProjectionKey(p, version, "all", "stats"), "count").Int64()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		require.NoError(t, err)
		return v
	}
	// Both live groups went through everything up to now, and live:other's projector recorded it.
	require.Eventually(t, func() bool {
		a, err := client.HGet(ctx, keys.Projections(), "acked:live:other").Result()
		return err == nil && ops.CompareEntryIDs(a, recent) >= 0
	}, 15*time.Second, 5*time.Millisecond, "live:other checkpointed past the history")
	require.Equal(t, int64(fillers+2), countOf("backfill", 1), "v1: the copy 10 s later is a duplicate")
	require.Equal(t, int64(fillers+2), countOf("other", 1))

	// A rebuild of backfill: v2 joins live:backfill and backfills the history through its own group.
	added, _, err := a.SetTargets(ctx, []ops.ProjectionTarget{{Projection: bf, Version: 1}, {Projection: bf, Version: 2}})
	require.NoError(t, err)
	require.Contains(t, added, "backfill.v2")
	// User 1 checks in meanwhile: live:other's projector decides it (and prunes her registry).
	require.Eventually(t, func() bool { return bf.attempts("dup") >= 4 }, 10*time.Second, 2*time.Millisecond, "v2 reached the copy")
	at(0, ck("now-1", 1, time.Now().UnixMilli()))

	require.Eventually(t, func() bool {
		gs, err := client.XInfoGroups(ctx, keys.Stream()).Result()
		require.NoError(t, err)
		for _, g := range gs {
			if g.Name == "backfill.v2" {
				return g.Lag == 0 && g.Pending == 0 && g.EntriesRead >= fillers+2
			}
		}
		return false
	}, 15*time.Second, 20*time.Millisecond, "version 2 backfilled")
	require.Eventually(t, func() bool { return countOf("backfill", 1) == fillers+3 }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, countOf("backfill", 1), countOf("backfill", 2),
		"v2 (rebuilt while live:other's projector prunes) equals v1 (incremental): the copy 10 s later counted once")
}
