package projection_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// projTest is one test's projection store and reader on a real Redis under its own prefix.
type projTest struct {
	client redis.UniversalClient
	keys   adapters.KeySpace
}

func newProjTest(t *testing.T) projTest {
	t.Helper()
	env := redistest.Open(t)
	return projTest{client: redistest.Client(t, env.URL), keys: adapters.KeySpace{Prefix: env.Prefix}}
}

// newClusterProjTest is projTest on the shared 3-master test cluster.
func newClusterProjTest(t *testing.T) projTest {
	t.Helper()
	env := redistest.OpenCluster(t)
	return projTest{client: redistest.ClusterClient(t, env.URL), keys: adapters.KeySpace{Prefix: env.Prefix}}
}

func (p projTest) reader(name string) projection.Reader {
	return adapters.NewProjectionReader(p.client, p.keys, name)
}

// applyAll delivers every event, a third of them twice, in random order from 8 goroutines: the
// at-least-once, out-of-order delivery the router gives.
func (p projTest) applyAll(t *testing.T, h interface {
	projection.Projection
	projection.CheckinRecordedHandler
}, events []domain.CheckinRecorded, seed uint64) {
	t.Helper()
	applier, err := adapters.NewProjectionApplier(p.client, p.keys, 0)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(seed, 7))
	deliveries := append([]domain.CheckinRecorded{}, events...)
	for _, e := range events {
		if rng.IntN(3) == 0 {
			deliveries = append(deliveries, e)
		}
	}
	rng.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })
	work := make(chan domain.CheckinRecorded)
	var wg sync.WaitGroup
	errs := make(chan error, len(deliveries))
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range work {
				if e.RecordedAt == 0 {
					e.RecordedAt = e.Timestamp // the clock of the dedupe window, without a stream
				}
				if _, err := applier.ApplyEvent(context.Background(), "test", h, 1, e, ""); err != nil {
					errs <- err
				}
			}
		}()
	}
	for _, e := range deliveries {
		work <- e
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// history generates n distinct check-ins of a few users at a few locations over ~10 days, with
// repeated timestamps so ties are exercised.
func history(n int, seed uint64) []domain.CheckinRecorded {
	rng := rand.New(rand.NewPCG(seed, 1))
	base := int64(1_700_000_000_000)
	out := make([]domain.CheckinRecorded, n)
	for i := range out {
		ts := base + rng.Int64N(10*24*3600*1000)
		if i > 0 && rng.IntN(10) == 0 {
			ts = out[rng.IntN(i)].Timestamp
		}
		out[i] = domain.CheckinRecorded{Checkin: domain.Checkin{ID: fmt.Sprintf("c-%d-%d", seed, i), UserID: 1 + rng.Int64N(12),
			LocationID: 1 + rng.Int64N(9), StarRating: rng.IntN(6), Timestamp: ts}, RecordedAt: base}
	}
	return out
}

func TestLeaderboardsMatchIndependentCount(t *testing.T) {
	t.Parallel()
	p := newProjTest(t)
	const minCheckins = 25
	lb := projection.Leaderboards{MinCheckins: minCheckins}
	events := history(600, 11)
	p.applyAll(t, lb, events, 1)

	type agg struct{ n, stars int64 }
	locs, users := map[int64]*agg{}, map[int64]int64{}
	for _, e := range events {
		if locs[e.LocationID] == nil {
			locs[e.LocationID] = &agg{}
		}
		locs[e.LocationID].n++
		locs[e.LocationID].stars += int64(e.StarRating)
		users[e.UserID]++
	}
	ctx := context.Background()
	r := p.reader(lb.Name())

	byCount, err := lb.TopLocations(ctx, r, projection.ByCheckins, 100)
	require.NoError(t, err)
	require.Len(t, byCount, len(locs))
	for i, row := range byCount {
		assert.Equal(t, i+1, row.Rank)
		assert.Equal(t, locs[row.LocationID].n, row.NumCheckins, "location %d", row.LocationID)
		assert.InDelta(t, float64(locs[row.LocationID].stars)/float64(locs[row.LocationID].n), row.AverageRating, 1e-12)
		if i > 0 {
			assert.GreaterOrEqual(t, byCount[i-1].NumCheckins, row.NumCheckins, "ordered by check-ins")
		}
	}

	byRating, err := lb.TopLocations(ctx, r, projection.ByRating, 100)
	require.NoError(t, err)
	qualified := 0
	for _, a := range locs {
		if a.n >= minCheckins {
			qualified++
		}
	}
	require.Len(t, byRating, qualified, "only locations with at least %d check-ins", minCheckins)
	for i, row := range byRating {
		a := locs[row.LocationID]
		assert.GreaterOrEqual(t, a.n, int64(minCheckins))
		assert.InDelta(t, float64(a.stars)/float64(a.n), row.AverageRating, 1e-12, "exact average, not rounded")
		if i > 0 {
			assert.GreaterOrEqual(t, byRating[i-1].AverageRating, row.AverageRating-1e-12, "ordered by rating")
		}
	}

	top3, err := lb.TopUsers(ctx, r, 3)
	require.NoError(t, err)
	require.Len(t, top3, 3)
	counts := make([]int64, 0, len(users))
	for _, n := range users {
		counts = append(counts, n)
	}
	sort.Slice(counts, func(i, j int) bool { return counts[i] > counts[j] })
	for i, row := range top3 {
		assert.Equal(t, users[row.UserID], row.NumCheckins, "user %d", row.UserID)
		assert.Equal(t, counts[i], row.NumCheckins, "rank %d", i+1)
	}
}

func TestLeaderboardsRejectBadInput(t *testing.T) {
	t.Parallel()
	p := newProjTest(t)
	lb := projection.Leaderboards{MinCheckins: 1}
	r := p.reader(lb.Name())
	ctx := context.Background()
	for _, tc := range []struct {
		by    string
		limit int
		field string
	}{
		{"stars", 10, "by"},
		{projection.ByRating, -1, "limit"},
		{projection.ByCheckins, projection.MaxLeaderboardLimit + 1, "limit"},
	} {
		t.Run(tc.by+"/"+strconv.Itoa(tc.limit), func(t *testing.T) {
			_, err := lb.TopLocations(ctx, r, tc.by, tc.limit)
			var ve *domain.ValidationError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, tc.field, ve.Field)
		})
	}
	rows, err := lb.TopUsers(ctx, r, 0)
	require.NoError(t, err)
	assert.Empty(t, rows, "no check-ins yet: an empty board, not an error")
}

// TestLeaderboardRowIsReadAtOneMoment: a location's check-ins and stars are read together, so
// a row never mixes a count from before a check-in with stars from after it. Every check-in
// here has five stars while the boards are read over and over: each row must say exactly 5.
// (Read apart, the count from the board and the stars a round trip later, rows said 20 stars
// over 3 check-ins.)
func TestLeaderboardRowIsReadAtOneMoment(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"standalone", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			p := newProjTest(t)
			if kind == "cluster" {
				p = newClusterProjTest(t)
			}
			lb := projection.Leaderboards{MinCheckins: 1}
			applier, err := adapters.NewProjectionApplier(p.client, p.keys, 0)
			require.NoError(t, err)
			ctx := context.Background()
			done := make(chan error, 1)
			go func() {
				for i := range 1500 {
					e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "five-" + strconv.Itoa(i), UserID: 1 + int64(i%50), LocationID: 7,
						StarRating: 5, Timestamp: 1_700_000_000_000 + int64(i)}, RecordedAt: 1_700_000_000_000 + int64(i)}
					if _, err := applier.ApplyEvent(ctx, "test", lb, 1, e, ""); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			r := p.reader(lb.Name())
			reads := 0
			for {
				select {
				case err := <-done:
					require.NoError(t, err)
					t.Logf("%d reads while the check-ins were applied", reads)
					require.Greater(t, reads, 20)
					return
				default:
				}
				for _, by := range []string{projection.ByCheckins, projection.ByRating} {
					rows, err := lb.TopLocations(ctx, r, by, 1)
					require.NoError(t, err)
					for _, row := range rows {
						require.Equal(t, 5.0, row.AverageRating, "by %s after %d check-ins: a count and stars of different moments", by, row.NumCheckins)
					}
					reads++
				}
			}
		})
	}
}
