package ports_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// TestMovedVersionWhoseGroupIsLostCountsOnce: users.v1 applied 50 check-ins
// through "live", which is disbanded; its own group (the moved record says where it starts) is
// then lost before a projector of "live:users" joins it. The join takes users.v1 for a first
// start and feeds it the whole stream again through the new live group.
func TestMovedVersionWhoseGroupIsLostCountsOnce(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	users := projection.UserStats{}
	start := func(group string) func() {
		targets := []ops.ProjectionTarget{{Projection: users, Version: 1}}
		r, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
			Targets: targets, Projections: []projection.Projection{users}, LiveGroup: group,
			Backend: adapters.NewProjectorBackend(client, keys), Applier: testApplier(t, client, keys),
			Logger: log, CloseTimeout: 10 * time.Second, Retry: ports.DefaultRetryPolicy(), HandlerTimeout: 30 * time.Second,
			NewSubscriber: adapters.Subscribers{Kind: "batched", NewClient: func() (redis.UniversalClient, error) { return redistest.Client(t, env.URL), nil },
				Consumer: "c-" + group, BatchSize: 10, MaxInFlight: 10, BlockTime: 50 * time.Millisecond, DrainTimeout: 5 * time.Second, Logger: watermill.NopLogger{}}.New,
		})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		require.Eventually(t, r.Running, 10*time.Second, 10*time.Millisecond)
		return func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(20 * time.Second):
				t.Fatal("router did not stop")
			}
		}
	}
	n := 0
	add := func(count int) {
		for range count {
			n++
			e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "c" + strconv.Itoa(n), UserID: 7, LocationID: 1, StarRating: 2, Timestamp: int64(n)}}
			values := map[string]any{}
			for k, v := range e.Fields() {
				values[k] = v
			}
			require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: values}).Err())
		}
	}
	count := func() int64 {
		v, err := users.Get(ctx, adapters.NewProjectionReader(client, keys, "users"), 7)
		if errors.Is(err, domain.ErrNotFound) {
			return 0
		}
		require.NoError(t, err)
		return v.NumCheckins
	}

	stop := start("live")
	add(50)
	require.Eventually(t, func() bool { return count() == 50 }, 20*time.Second, 20*time.Millisecond)
	stop()
	time.Sleep(50 * time.Millisecond)
	d, err := command.NewDisbandLiveGroup(adapters.NewOpsBackend(client, keys), 20*time.Millisecond)
	require.NoError(t, err)
	_, err = d.Run(ctx, "live", false)
	require.NoError(t, err)
	require.NoError(t, client.XGroupDestroy(ctx, keys.Stream(), "users.v1").Err()) // lost before the join

	stop = start("live:users")
	defer stop()
	time.Sleep(1500 * time.Millisecond)
	require.Equal(t, int64(50), count(), "each check-in counted once")
}
