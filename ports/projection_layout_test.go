package ports_test

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// TestRouterFeedsEachVersionInItsLayout: while leaderboards v2 is built in layout 3, v1, which
// serves reads, is written in layout 2 (each location's count beside its stars, the rating a
// fraction), as the registry records it; v2 in layout 3 (the count on the board, the rating a
// scaled integer). Fed both from one live group, each version gets the updates of its own
// layout.
func TestRouterFeedsEachVersionInItsLayout(t *testing.T) {
	t.Parallel()
	v1, err := projection.Leaderboards{MinCheckins: 2}.AtLayout(projection.LeaderboardsSharded)
	require.NoError(t, err)
	v2, err := projection.Leaderboards{MinCheckins: 2}.AtLayout(projection.LeaderboardsBoardCounts)
	require.NoError(t, err)
	h := startHarness(t, nil, harnessOptions{subscriber: "batched",
		targets: []ops.ProjectionTarget{{Projection: v1, Version: 1}, {Projection: v2, Version: 2}}})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	stars := []int{5, 4, 4}
	for i, s := range stars {
		e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "lay-" + strconv.Itoa(i), UserID: 9, LocationID: 7, StarRating: s, Timestamp: now},
			RecordedAt: now}
		h.xadd(h.values(e, "corr"))
	}
	slot := projection.LeaderboardShardSlots(projection.LeaderboardsSharded)[projection.ShardOf(7, projection.LeaderboardShards)]
	key := func(version int, name string) string {
		return h.keys.ProjectionKey("leaderboards", version, slot, name)
	}
	require.Eventually(t, func() bool {
		n1, _ := h.client.ZScore(ctx, key(1, "locations_by_checkins"), "7").Result()
		n2, _ := h.client.ZScore(ctx, key(2, "locations_by_checkins"), "7").Result()
		return n1 == 3 && n2 == 3
	}, 15*time.Second, 20*time.Millisecond, "both versions count the three check-ins")

	counts1, err := h.client.HGetAll(ctx, key(1, "location_counts")).Result()
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"7:n": "3", "7:stars": "13"}, counts1, "v1 in layout 2")
	r1, err := h.client.ZScore(ctx, key(1, "locations_by_rating"), "7").Result()
	require.NoError(t, err)
	assert.Equal(t, 13.0/3, r1, "v1's rating is the fraction")

	counts2, err := h.client.HGetAll(ctx, key(2, "location_counts")).Result()
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"7:stars": "13"}, counts2, "v2 in layout 3")
	r2, err := h.client.ZScore(ctx, key(2, "locations_by_rating"), "7").Result()
	require.NoError(t, err)
	assert.Equal(t, math.Floor(13.0/3*projection.RatioScale), r2, "v2's rating is the scaled integer")
}
