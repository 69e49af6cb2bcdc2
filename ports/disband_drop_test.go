package ports_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// TestDroppedVersionRunAgainCountsOnce: users.v1 applied 50 check-ins, an hour apart, through
// "live", which is disbanded; no set runs users any more while 30 more are recorded, and users.v1
// is dropped. A projector that runs users again later feeds it the whole stream, from the start:
// with its read model dropped too, each check-in is counted once (had only its group and moved
// record gone, the 50 would count twice: most of them lie beyond the dedupe window of the rest).
func TestDroppedVersionRunAgainCountsOnce(t *testing.T) {
	t.Parallel()
	h := newDisbandHarness(t)
	client, keys, ctx := h.client, h.keys, context.Background()
	users := []ops.ProjectionTarget{{Projection: projection.UserStats{}, Version: 1}}
	addHourly := func(n int) {
		for range n {
			h.n++
			e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "c" + strconv.Itoa(h.n), UserID: 7, LocationID: 1, StarRating: 2,
				Timestamp: int64(h.n) * time.Hour.Milliseconds()}}
			values := map[string]any{}
			for k, v := range e.Fields() {
				values[k] = v
			}
			require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: values}).Err())
		}
	}
	_, stop := h.start("live", users)
	addHourly(50)
	require.Eventually(t, func() bool { return h.count() == 50 }, 20*time.Second, 20*time.Millisecond)
	stop()
	time.Sleep(50 * time.Millisecond)
	b := adapters.NewOpsBackend(client, keys)
	d, err := command.NewDisbandLiveGroup(b, 20*time.Millisecond)
	require.NoError(t, err)
	_, err = d.Run(ctx, "live", false)
	require.NoError(t, err)
	addHourly(30) // no set runs users meanwhile

	drop, err := command.NewDropMovedVersion(b, 20*time.Millisecond)
	require.NoError(t, err)
	rep, err := drop.Run(ctx, "users.v1", false)
	require.NoError(t, err)
	require.True(t, rep.Done)
	require.Equal(t, int64(0), h.count(), "its read model went with it")

	_, stop = h.start("live:users", users)
	defer stop()
	require.Eventually(t, func() bool { return h.count() == 80 }, 20*time.Second, 20*time.Millisecond)
	time.Sleep(1500 * time.Millisecond)
	require.Equal(t, int64(80), h.count(), "each check-in counted once")
}
