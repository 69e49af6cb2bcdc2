package ports_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
)

// TestMovedVersionWhoseGroupIsLostCountsOnce: users.v1 applied 50 check-ins
// through "live", which is disbanded; its own group (the moved record says where it starts) is
// then lost before a projector of "live:users" joins it. The join takes users.v1 for a first
// start and feeds it the whole stream again through the new live group.
func TestMovedVersionWhoseGroupIsLostCountsOnce(t *testing.T) {
	t.Parallel()
	h := newDisbandHarness(t)
	client, keys, ctx := h.client, h.keys, context.Background()
	users := []ops.ProjectionTarget{{Projection: projection.UserStats{}, Version: 1}}
	start := func(group string) func() { _, stop := h.start(group, users); return stop }
	add, count := h.add, h.count
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
