package ports_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/batchsub"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// TestRebuildDrivenByTheProjectorLoop runs the projector's registry watcher (ProjectionOps.Watch)
// next to a running router, with each subscriber implementation, and rebuilds a projection
// while events arrive: the watcher starts v2 next to v1, switches reads once v2 caught up, stops
// v1 and removes its keys and group, all without restarting the router.
func TestRebuildDrivenByTheProjectorLoop(t *testing.T) {
	t.Parallel()
	for _, sub := range []string{"batched", "watermill"} {
		t.Run(sub, func(t *testing.T) {
			t.Parallel()
			env := redistest.Open(t)
			client := redistest.Client(t, env.URL)
			keys := adapters.KeySpace{Prefix: env.Prefix}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			ctx := context.Background()
			projs := []projection.Projection{projection.UserStats{}}
			ops, err := ports.NewProjectionOps(ports.ProjectionOpsConfig{Redis: client, Keys: keys, Projections: projs,
				RetireGrace: 300 * time.Millisecond, Logger: log})
			require.NoError(t, err)

			router, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
				Keys: keys, Targets: []ports.ProjectionTarget{{Projection: projection.UserStats{}, Version: 1}}, Redis: client,
				Logger: log, CloseTimeout: 10 * time.Second, Retry: ports.DefaultRetryPolicy(),
				NewSubscriber: func(group string, start func(context.Context) (string, error)) (message.Subscriber, error) {
					c := redistest.Client(t, env.URL)
					if sub == "watermill" {
						stock, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{Client: c, Unmarshaller: adapters.FlatMarshaller{},
							Consumer: "c1", ConsumerGroup: group, OldestId: "0", BlockTime: 50 * time.Millisecond,
							DisableIndefiniteInitialBlock: true}, watermill.NopLogger{})
						if err != nil {
							return nil, err
						}
						return adapters.NewDrainingSubscriber(adapters.DrainingSubscriberConfig{Inner: stock, Client: redistest.Client(t, env.URL),
							ConsumerGroup: group, Consumer: "c1", Unmarshaller: adapters.FlatMarshaller{}, DrainTimeout: 5 * time.Second})
					}
					return batchsub.NewSubscriber(batchsub.Config{Client: c, ConsumerGroup: group, Consumer: "c1", StartID: start,
						Unmarshaller: adapters.FlatMarshaller{}, BlockTime: 50 * time.Millisecond, DrainTimeout: 5 * time.Second,
						Logger: watermill.NopLogger{}})
				},
			})
			require.NoError(t, err)
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan error, 2)
			go func() { done <- router.Run(runCtx) }()
			go func() { done <- ops.Watch(runCtx, router, projs, 50*time.Millisecond) }()
			t.Cleanup(func() {
				cancel()
				for range 2 {
					select {
					case err := <-done:
						assert.NoError(t, err, "a clean stop")
					case <-time.After(20 * time.Second):
						t.Error("router or watcher did not stop")
					}
				}
			})
			require.Eventually(t, router.Running, 10*time.Second, 10*time.Millisecond)

			n := 0
			add := func(count int) {
				for range count {
					n++
					e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "rb" + strconv.Itoa(n), UserID: 7, LocationID: 1, StarRating: 2, Timestamp: int64(n)}}
					values := map[string]any{}
					for k, v := range e.Fields() {
						values[k] = v
					}
					require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: values}).Err())
				}
			}
			count := func() int64 {
				v, err := projection.UserStats{}.Get(ctx, adapters.NewProjectionReader(client, keys, "users"), 7)
				if errors.Is(err, domain.ErrNotFound) {
					return 0
				}
				require.NoError(t, err)
				return v.NumCheckins
			}
			add(100)
			require.Eventually(t, func() bool { return count() == 100 }, 10*time.Second, 20*time.Millisecond)

			// Over HTTP, as an operator would: 202, then progress in GET /ops/projections.
			// On the service's ops listener, with its middleware (the correlation ID the spec promises).
			srv := ports.NewHTTPServer(app.Application{}, nil, ports.HTTPConfig{}, slog.New(slog.DiscardHandler))
			ports.RegisterProjectionOpsRoutes(srv.OpsEcho(), ops)
			hs := httptest.NewServer(srv.OpsHandler())
			t.Cleanup(hs.Close)
			resp, err := contractClient.Post(hs.URL+"/ops/projections/users/rebuild", "", nil)
			require.NoError(t, err)
			_ = resp.Body.Close()
			require.Equal(t, http.StatusAccepted, resp.StatusCode)
			add(100) // events keep arriving during the rebuild

			versions := adapters.NewProjectionVersions(client, keys)
			require.Eventually(t, func() bool {
				st, err := versions.State(ctx, "users")
				require.NoError(t, err)
				return st.Serving == 2 && st.Building == 0 && st.Retiring == 0
			}, 20*time.Second, 20*time.Millisecond, "the rebuild never finished")
			// v2 backfilled through its own group while the live group fed v1 and v2; once the
			// backfill is over, the live group alone feeds v2.
			assert.Eventually(t, func() bool { return slices.Equal([]string{"live"}, router.Groups()) }, 10*time.Second, 20*time.Millisecond,
				"the backfill handler stopped: %v", router.Groups())
			assert.True(t, router.Running())
			add(50)
			require.Eventually(t, func() bool { return count() == 250 }, 10*time.Second, 20*time.Millisecond, "reads come from v2, which stays current")

			assert.Eventually(t, func() bool {
				groups, err := client.XInfoGroups(ctx, keys.Stream()).Result()
				require.NoError(t, err)
				return len(groups) == 1 && groups[0].Name == "live"
			}, 10*time.Second, 20*time.Millisecond, "the backfill group is removed after the grace period")
			ms, err := adapters.NewLiveGroups(client, keys).Read(ctx, "live")
			require.NoError(t, err)
			assert.Equal(t, []string{"users.v2"}, slices.Sorted(maps.Keys(ms.Members)), "v1 left the live group")
			left, err := client.Keys(ctx, keys.ProjectionPrefix("users", 1)+"*").Result()
			require.NoError(t, err)
			assert.Empty(t, left, "v1 keys removed")
			rebuilds, err := ops.Rebuilds(ctx)
			require.NoError(t, err)
			require.Len(t, rebuilds, 1)
			assert.Equal(t, ports.RebuildDone, rebuilds[0].State)
		})
	}
}
