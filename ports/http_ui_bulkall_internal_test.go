package ports

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app/command"
)

// TestBulkAllKeepsTheRunsReserve: a bulk call keeps a reserve before its deadline
// (deadlineReserve, or a quarter of what it has) "to stop cleanly and answer rather than be cut
// off mid-entry". bulkAll calls again and again on the same request, and each call computed the
// reserve as a quarter of what was left: the reserve shrank call after call and the loop went on
// until the request's deadline cut a Redis command (found by a review, with 30,000 parked
// entries and budgets of 20-60ms). The calls now run against a deadline bulkReserve (or a
// quarter of the request's time) before the request's, whatever how many there are.
func TestBulkAllKeepsTheRunsReserve(t *testing.T) {
	t.Parallel()
	for _, budget := range []time.Duration{40 * time.Millisecond, 10 * time.Second} {
		rctx, cancel := context.WithTimeout(context.Background(), budget)
		requestDeadline, _ := rctx.Deadline()
		var deadlines []time.Time
		calls := 0
		run := func(ctx context.Context, r command.BulkRequest) (command.BulkResult, error) {
			d, ok := ctx.Deadline()
			require.True(t, ok, "every call has a deadline")
			deadlines = append(deadlines, d)
			calls++
			if calls == 5 {
				return command.BulkResult{Purged: 1}, nil // complete
			}
			// Each call handled its Max and stopped, with more to come.
			return command.BulkResult{Purged: 1, Next: "1-" + strconv.Itoa(calls), Until: "9-0"}, nil
		}
		res, err := bulkAll(rctx, command.BulkRequest{Projection: "users", Max: DefaultHTTPBulkLimit}, run)
		cancel()
		require.NoError(t, err)
		assert.Equal(t, int64(5), res.Purged, "the calls' counts add up")
		assert.Empty(t, res.Next, "the run is complete")
		require.Len(t, deadlines, 5)
		reserve := min(bulkReserve, budget/4) * 9 / 10 // a quarter of what is left when it starts
		for i, d := range deadlines {
			assert.False(t, d.After(requestDeadline.Add(-reserve)),
				"budget %s: call %d runs until %s before the request's deadline; the run keeps %s", budget, i+1, requestDeadline.Sub(d), reserve)
		}
	}
}

// bulkAll goes on from where each call stopped, with the bound the first one fixed, and stops at
// a call that made no progress.
func TestBulkAllContinuesAndStopsWithoutProgress(t *testing.T) {
	t.Parallel()
	var got []command.BulkRequest
	run := func(_ context.Context, r command.BulkRequest) (command.BulkResult, error) {
		got = append(got, r)
		if len(got) == 3 {
			return command.BulkResult{Next: r.After, Until: "9-0"}, nil // no progress: time is short
		}
		return command.BulkResult{Replayed: 2, Next: "1-" + strconv.Itoa(len(got)), Until: "9-0"}, nil
	}
	res, err := bulkAll(context.Background(), command.BulkRequest{Max: DefaultHTTPBulkLimit}, run)
	require.NoError(t, err)
	require.Len(t, got, 3)
	assert.Equal(t, []string{"", "1-1", "1-2"}, []string{got[0].After, got[1].After, got[2].After})
	assert.Equal(t, []string{"", "9-0", "9-0"}, []string{got[0].Until, got[1].Until, got[2].Until})
	assert.Equal(t, 4, res.Replayed)
	assert.Equal(t, "1-2", res.Next, "more to do: the banner says so")
}
