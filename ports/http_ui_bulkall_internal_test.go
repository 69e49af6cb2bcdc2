package ports

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
)

// TestBulkAllKeepsTheRunsReserve: a bulk call keeps a reserve before its deadline
// (deadlineReserve, or a quarter of what it has, withReserve) "to stop cleanly and answer
// rather than be cut off mid-entry". bulkAll calls again and again on the same request
// context, and each call recomputes the reserve as a quarter of what is left: the reserve
// shrinks geometrically and the loop goes on until a Redis call is cut by the deadline. Its
// comment says a call "then stops by itself" and the loop ends on a call without progress.
func TestBulkAllKeepsTheRunsReserve(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	q := adapters.NewPoisonQueue(client, keys)
	ctx := context.Background()
	const n = 30000
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				if _, err := q.Park(ctx, ops.PoisonEntry{Stream: keys.Stream(), EntryID: fmt.Sprintf("1-%d", i), Projection: "locations",
					Group: "live", Version: 1, Error: "bug", Attempts: 1, FailedAt: time.Now(), Fields: map[string]string{"x": "y"}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	require.NoError(t, <-errs)
	until, err := q.LastID(ctx)
	require.NoError(t, err)
	purge, err := command.NewPurgePoisoned(q, slog.New(slog.NewTextHandler(io.Discard, nil)), []projection.Projection{projection.UserStats{}, projection.LocationStats{}})
	require.NoError(t, err)

	for _, budget := range []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 60 * time.Millisecond} {
		rctx, cancel := context.WithTimeout(ctx, budget)
		start := time.Now()
		res, err := bulkAll(rctx, command.BulkRequest{Projection: "users", Until: until, Max: DefaultHTTPBulkLimit}, purge.PurgeAll)
		took := time.Since(start)
		ctxErr := rctx.Err()
		cancel()
		t.Logf("budget %s: took %s, next %q, err %v, ctx %v", budget, took, res.Next, err, ctxErr)
		require.NotEmpty(t, res.Next, "budget %s: the walk is longer than the budget", budget)
		// One call alone keeps a quarter of its time (withReserve); the loop keeps none.
		assert.Less(t, took, budget*9/10, "budget %s: answered with time to spare (err %v, ctx %v)", budget, err, ctxErr)
	}
}
