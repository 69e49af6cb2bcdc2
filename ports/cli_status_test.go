package ports_test

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/app/query"
	"github.com/checkins/checkins/ports"
)

// A projection whose group is behind the stream and does not move is flagged stalled by status
// (as /readyz judges it), and the flag clears once it makes progress.
func TestStatusFlagsAStalledProjection(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	ctx := context.Background()
	for i := range 5 {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: []any{"n", strconv.Itoa(i)}}).Err())
	}
	group := keys.Group("users", 1)
	require.NoError(t, client.XGroupCreate(ctx, keys.Stream(), group, "0").Err())

	status := opsApp(t, client, keys, []projection.Projection{projection.UserStats{}}, app.OpsConfig{StallAfter: 100 * time.Millisecond}).Queries.Status
	usersV1 := func(st query.StatusReport) query.ProjectionStatus {
		for _, p := range st.Projections {
			if p.Group == group {
				return p
			}
		}
		t.Fatalf("no status for %s in %+v", group, st)
		return query.ProjectionStatus{}
	}

	st, err := status.Status(ctx)
	require.NoError(t, err)
	assert.False(t, usersV1(st).Stalled, "not stalled before STALL_AFTER has passed")
	assert.Eventually(t, func() bool {
		st, err := status.Status(ctx)
		return err == nil && usersV1(st).Stalled
	}, 10*time.Second, 50*time.Millisecond, "behind with no progress for STALL_AFTER is stalled")
	st, err = status.Status(ctx)
	require.NoError(t, err)
	assert.Contains(t, usersV1(st).StallCause, group)
	var out bytes.Buffer
	require.NoError(t, ports.WriteStatusText(&out, st))
	assert.Contains(t, out.String(), "STALLED")

	// Progress: the group consumes and acknowledges everything.
	res, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c", Streams: []string{keys.Stream(), ">"}, Count: 10}).Result()
	require.NoError(t, err)
	for _, m := range res[0].Messages {
		require.NoError(t, client.XAck(ctx, keys.Stream(), group, m.ID).Err())
	}
	st, err = status.Status(ctx)
	require.NoError(t, err)
	assert.False(t, usersV1(st).Stalled, "caught up is never stalled")
}
