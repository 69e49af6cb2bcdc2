package adapters_test

import (
	"context"
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/projection"
)

func TestRatioScaleIsTheScripts(t *testing.T) {
	t.Parallel()
	assert.Equal(t, strconv.Itoa(projection.RatioScale), adapters.RatioScaleLua)
}

// TestApplyScaledRatio: zscaledratioatmin sets floor(num / den * RatioScale), num a hash field
// and den a sorted-set member's score, once den reaches min: from the results of the increments
// before it in the same update, and from what Redis holds when its update has none. The score is
// an integer, so a small sorted set keeps it as one (no text to parse on each insert), and the
// order is that of the exact ratios.
func TestApplyScaledRatio(t *testing.T) {
	t.Parallel()
	eachEnv(t, testApplyScaledRatio)
}

func testApplyScaledRatio(t *testing.T, env projEnv) {
	ctx := context.Background()
	a := env.applier(t, env.client)
	type agg struct{ n, stars int64 }
	want := map[string]*agg{}
	const minCount = 3
	seq := 0
	apply := func(u *projection.Update) {
		t.Helper()
		seq++
		ev := recorded("r-"+strconv.Itoa(seq), 1, 1, 0, int64(seq))
		_, err := a.Apply(ctx, []projection.Work{{Group: "g", Projection: "ratios", Version: 1,
			Event: projection.RefOf(ev, entry(1_700_000_000_000+int64(seq))), Updates: []*projection.Update{u}}}, nil)
		require.NoError(t, err)
	}
	// Locations 1..6 with ratings whose exact order differs from a rounding of them (2/3 and
	// 5/7, 7/3 and 12/5...); location 6 stays below minCount.
	stars := map[string][]int64{"1": {0, 1, 1}, "2": {1, 1, 1, 0, 1, 1, 0}, "3": {5, 2, 0}, "4": {5, 5, 2, 0, 0}, "5": {5, 5, 5, 5}, "6": {5, 5}}
	for loc, ss := range stars {
		for _, s := range ss {
			apply(projection.NewUpdate("board").
				ZIncrBy("counts", 1, loc).
				HIncrBy("stars", loc, s).
				ZScaledRatioAtMin("rating", loc, "stars", loc, "counts", loc, minCount))
			if want[loc] == nil {
				want[loc] = &agg{}
			}
			want[loc].n++
			want[loc].stars += s
		}
	}
	// An update with the ratio alone reads both numbers from Redis (HGET, ZSCORE).
	apply(projection.NewUpdate("board").HIncrBy("stars", "3", 1))
	want["3"].stars++
	apply(projection.NewUpdate("board").ZScaledRatioAtMin("rating", "3", "stars", "3", "counts", "3", minCount))

	key := env.keys.ProjectionKey("ratios", 1, "board", "rating")
	zs, err := env.client.ZRevRangeWithScores(ctx, key, 0, -1).Result()
	require.NoError(t, err)
	var got []string
	for _, z := range zs {
		loc := z.Member.(string)
		got = append(got, loc)
		w := want[loc]
		require.GreaterOrEqual(t, w.n, int64(minCount), "location %s is below the minimum", loc)
		assert.Equal(t, math.Floor(float64(w.stars)/float64(w.n)*projection.RatioScale), z.Score, "location %s", loc)
		assert.Equal(t, z.Score, math.Trunc(z.Score), "location %s: an integer score", loc)
		assert.Less(t, z.Score, float64(1<<52), "location %s: below 2^52, where Redis prints a score as an integer", loc)
	}
	assert.Equal(t, []string{"5", "3", "4", "2", "1"}, got, "in the order of the exact ratios: 5, 8/3, 12/5, 5/7, 2/3")
	enc, err := env.client.ObjectEncoding(ctx, key).Result()
	require.NoError(t, err)
	assert.Equal(t, "listpack", enc, "a small sorted set, whose integer scores are kept as integers")
}
