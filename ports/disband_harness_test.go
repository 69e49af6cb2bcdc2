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
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// disbandHarness runs real projection routers of chosen live groups on a private Redis, and
// adds check-ins of user 7 whose users count it reads.
type disbandHarness struct {
	t      *testing.T
	url    string
	client *redis.Client
	keys   adapters.KeySpace
	n      int
}

func newDisbandHarness(t *testing.T) *disbandHarness {
	env := redistest.Open(t)
	return &disbandHarness{t: t, url: env.URL, client: redistest.Client(t, env.URL), keys: adapters.KeySpace{Prefix: env.Prefix}}
}

// start runs a router feeding targets through live group group; the func it returns stops it.
func (h *disbandHarness) start(group string, targets []ops.ProjectionTarget) (*ports.ProjectionRouter, func()) {
	t := h.t
	var projs []projection.Projection
	for _, tg := range targets {
		projs = append(projs, tg.Projection)
	}
	r, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
		Targets: targets, Projections: projs, LiveGroup: group,
		Backend: adapters.NewProjectorBackend(h.client, h.keys), Applier: testApplier(t, h.client, h.keys),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CloseTimeout: 10 * time.Second, Retry: ports.DefaultRetryPolicy(), HandlerTimeout: 30 * time.Second,
		NewSubscriber: adapters.Subscribers{Kind: "batched", NewClient: func() (redis.UniversalClient, error) { return redistest.Client(t, h.url), nil },
			Consumer: "c-" + group, BatchSize: 10, MaxInFlight: 10, BlockTime: 50 * time.Millisecond, DrainTimeout: 5 * time.Second, Logger: watermill.NopLogger{}}.New,
	})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	require.Eventually(t, r.Running, 10*time.Second, 10*time.Millisecond)
	return r, func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatal("router did not stop")
		}
	}
}

// add XADDs count check-ins of user 7.
func (h *disbandHarness) add(count int) {
	for range count {
		h.n++
		e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "c" + strconv.Itoa(h.n), UserID: 7, LocationID: 1, StarRating: 2, Timestamp: int64(h.n)}}
		values := map[string]any{}
		for k, v := range e.Fields() {
			values[k] = v
		}
		require.NoError(h.t, h.client.XAdd(context.Background(), &redis.XAddArgs{Stream: h.keys.Stream(), Values: values}).Err())
	}
}

// count is user 7's check-ins as the users projection counts them.
func (h *disbandHarness) count() int64 {
	v, err := projection.UserStats{}.Get(context.Background(), adapters.NewProjectionReader(h.client, h.keys, "users"), 7)
	if errors.Is(err, domain.ErrNotFound) {
		return 0
	}
	require.NoError(h.t, err)
	return v.NumCheckins
}
