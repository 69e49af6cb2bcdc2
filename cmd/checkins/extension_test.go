package main

// The extension point, proven with the example of README.md ("Adding a projection"): the projection
// below is that example (the same text, with the projection package's names qualified because
// this file is in package main), run through the real machinery (ports.ProjectionRouter with
// the batched subscriber, the Redis projection store, the ProjectionVersions query for status) on
// a private redis-server whose stream already holds history.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/app/query"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// example:begin

// RatingsHistogram counts, per location, how many check-ins gave each star rating.
type RatingsHistogram struct{}

// Name names the consumer group and the keys: never change it once shipped.
func (RatingsHistogram) Name() string { return "ratings_histogram" }

// OnCheckinRecorded counts the check-in's rating at its location.
func (RatingsHistogram) OnCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, s projection.Store) error {
	return s.Apply(ctx, projection.NewUpdate("location:"+strconv.FormatInt(e.LocationID, 10)).
		HIncrBy("histogram", strconv.Itoa(e.StarRating), 1))
}

// Get reads a location's histogram: index i is the number of check-ins with i stars.
func (RatingsHistogram) Get(ctx context.Context, r projection.Reader, locationID int64) ([6]int64, error) {
	var out [6]int64
	h, err := r.HGetAll(ctx, "location:"+strconv.FormatInt(locationID, 10), "histogram")
	if err != nil {
		return out, err
	}
	for stars, n := range h {
		i, err := strconv.Atoi(stars)
		if err != nil || i < 0 || i >= len(out) {
			return out, fmt.Errorf("location %d: unexpected rating field %q", locationID, stars)
		}
		if out[i], err = projection.ParseInt(n); err != nil {
			return out, fmt.Errorf("location %d rating %d: %w", locationID, i, err)
		}
	}
	return out, nil
}

// example:end

func TestExampleProjectionIsTheDocumentedOne(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("extension_test.go")
	require.NoError(t, err)
	_, body, _ := strings.Cut(string(src), "// example:begin\n")
	body, _, _ = strings.Cut(body, "// example:end")
	doc, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, block, ok := strings.Cut(string(doc), "<!-- example:ratings_histogram -->\n```go\n")
	require.True(t, ok, "README.md lost its example marker")
	block, _, _ = strings.Cut(block, "```")
	// The documented file is package projection: drop its header up to the end of the imports.
	_, block, ok = strings.Cut(block, "\n)\n")
	require.True(t, ok, "the documented example has no import block")
	assert.Equal(t, strings.TrimSpace(block), strings.TrimSpace(strings.ReplaceAll(body, "projection.", "")),
		"the README example and the tested projection must be the same code")
}

// testOps is the application's operational use cases on Redis (client, keys) for projs, as the
// service builds them.
func testOps(t *testing.T, client redis.UniversalClient, keys adapters.KeySpace, projs []projection.Projection, cfg Config) app.Application {
	t.Helper()
	var a app.Application
	closeOps, err := addOps(&a, client, keys, cfg, projs, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() { _ = closeOps() })
	return a
}

// testProjector runs a ProjectionRouter like the service does (batched subscriber, retry, poison
// queue) for targets, until the test ends.
func testProjector(t *testing.T, url string, keys adapters.KeySpace, targets []ops.ProjectionTarget) *ports.ProjectionRouter {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	client := redistest.Client(t, url)
	applier, err := adapters.NewProjectionApplier(client, keys, 0)
	require.NoError(t, err)
	r, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
		Targets: targets, Backend: adapters.NewProjectorBackend(client, keys), Applier: applier, Logger: log, CloseTimeout: 20 * time.Second,
		HandlerTimeout: 10 * time.Second, Retry: ports.DefaultRetryPolicy(),
		NewSubscriber: adapters.Subscribers{NewClient: func() (redis.UniversalClient, error) { return redistest.Client(t, url), nil },
			Consumer: "test-projector", BatchSize: 100, MaxInFlight: 200, BlockTime: 50 * time.Millisecond,
			DrainTimeout: 10 * time.Second, Logger: watermill.NopLogger{}}.New,
	})
	require.NoError(t, err)
	redistest.Background(t, "projector", 30*time.Second, r.Run)
	require.Eventually(t, r.Running, 10*time.Second, 10*time.Millisecond, "projector never started")
	return r
}

// testPublisher records events through the service's Watermill publisher.
func testPublisher(t *testing.T, url string, keys adapters.KeySpace) *adapters.EventPublisher {
	t.Helper()
	opt, err := redis.ParseURL(url)
	require.NoError(t, err)
	pub, err := adapters.NewEventPublisher(redis.NewClient(opt), keys, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// genCheckins makes n distinct check-ins with timestamps in random order over ~20 days.
func genCheckins(rng *rand.Rand, prefix string, n int) []domain.CheckinRecorded {
	base := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	out := make([]domain.CheckinRecorded, n)
	for i := range out {
		out[i] = domain.CheckinRecorded{Checkin: domain.Checkin{ID: fmt.Sprintf("%s-%d", prefix, i), UserID: 1 + rng.Int64N(15),
			LocationID: 1 + rng.Int64N(8), StarRating: rng.IntN(6), Timestamp: base + rng.Int64N(20*24*3600*1000)},
			RecordedAt: base + 30*24*3600*1000}
	}
	return out
}

// publishWithDuplicates publishes every event, about a quarter of them a second time (a client
// retry that reached the stream twice), from workers goroutines.
func publishWithDuplicates(t *testing.T, pub *adapters.EventPublisher, rng *rand.Rand, events []domain.CheckinRecorded, workers int) {
	t.Helper()
	all := append([]domain.CheckinRecorded{}, events...)
	for _, e := range events {
		if rng.IntN(4) == 0 {
			all = append(all, e)
		}
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	work := make(chan domain.CheckinRecorded)
	errs := make(chan error, len(all))
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range work {
				if err := pub.PublishCheckinRecorded(context.Background(), e, "corr-"+e.ID); err != nil {
					errs <- err
				}
			}
		}()
	}
	for _, e := range all {
		work <- e
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// caughtUp reads the projection's versions through the ProjectionVersions query, as
// `checkins projections list` does, and says whether the serving one has nothing undelivered and
// nothing pending.
func caughtUp(t *testing.T, versions *query.ProjectionVersions, name string) bool {
	t.Helper()
	rep, err := versions.List(context.Background())
	require.NoError(t, err)
	for _, v := range rep.Versions {
		if v.Projection == name && v.Role == "serving" {
			return v.GroupExists && v.Lag != nil && *v.Lag == 0 && v.Pending == 0
		}
	}
	return false
}

func TestExampleProjectionBackfillsThenStaysExact(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	keys := adapters.KeySpace{Prefix: "ext"}
	client := redistest.Client(t, srv.URL())
	pub := testPublisher(t, srv.URL(), keys)
	rng := rand.New(rand.NewPCG(4, 2))
	ctx := context.Background()

	// History first: the projection does not exist yet when these are recorded.
	history := genCheckins(rng, "old", 400)
	publishWithDuplicates(t, pub, rng, history, 4)

	p := RatingsHistogram{}
	versions := testOps(t, client, keys, []projection.Projection{p}, Config{}).Queries.ProjectionVersions
	testProjector(t, srv.URL(), keys, []ops.ProjectionTarget{{Projection: p, Version: 1}})

	want := func(events []domain.CheckinRecorded) map[int64][6]int64 {
		out := map[int64][6]int64{}
		for _, e := range events {
			h := out[e.LocationID]
			h[e.StarRating]++
			out[e.LocationID] = h
		}
		return out
	}
	reader := adapters.NewProjectionReader(client, keys, p.Name())
	exact := func(events []domain.CheckinRecorded) {
		t.Helper()
		for loc, h := range want(events) {
			got, err := p.Get(ctx, reader, loc)
			require.NoError(t, err)
			assert.Equal(t, h, got, "location %d", loc)
		}
	}

	require.Eventually(t, func() bool { return caughtUp(t, versions, p.Name()) }, 30*time.Second, 20*time.Millisecond,
		"the new projection never reported caught up")
	exact(history) // backfilled all of history, each check-in once

	// Then it stays current: more check-ins, duplicates included, while it runs.
	live := genCheckins(rng, "new", 400)
	publishWithDuplicates(t, pub, rng, live, 4)
	require.Eventually(t, func() bool { return caughtUp(t, versions, p.Name()) }, 30*time.Second, 20*time.Millisecond)
	exact(append(history, live...))
}
