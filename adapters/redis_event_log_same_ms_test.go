package adapters_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestRangeListsACheckinRecordedAfterThePageOnAnotherPartition: with P = 2 partitions on one
// Redis, a client pages GET /checkins (EventLog.Range) with limit 1. Its first page ended at a
// check-in of partition 1 recorded at ms T (cursor "T-0.1"), and a check-in recorded right after
// that page on partition 0 in the same millisecond got ID T-0 there: it sorted before the cursor
// ((T,0,0) < (T,0,1)), so no later page listed it, although it was in the range and the client
// went on paging (found by a review; it happened within a few attempts). A page now ends before
// the servers' current millisecond, so every later XADD sorts after its cursor.
func TestRangeListsACheckinRecordedAfterThePageOnAnotherPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	paged := 0
	for attempt := range 200 {
		keys := adapters.KeySpace{Prefix: fmt.Sprintf("%s:a%d", env.Prefix, attempt)}
		parts, err := adapters.NewPartitions(keys, 2)
		require.NoError(t, err)
		log := adapters.NewPartitionedEventLog(client, parts)
		// Two check-ins on partition 1 (server-chosen IDs, as the API writes them).
		xadd(t, client, parts.Stream(1), "*", recorded(fmt.Sprintf("b1-%d", attempt), 2, 1, 1, 5).Fields())
		xadd(t, client, parts.Stream(1), "*", recorded(fmt.Sprintf("b2-%d", attempt), 2, 1, 1, 5).Fields())
		page, err := log.Range(ctx, 0, 1<<62, "", 1)
		require.NoError(t, err)
		if page.Next == "" {
			continue // the page ended before them (their millisecond was the current one)
		}
		// A check-in of another user, on partition 0, recorded after the page was answered.
		a := xadd(t, client, parts.Stream(0), "*", recorded(fmt.Sprintf("a-%d", attempt), 1, 1, 1, 5).Fields())
		paged++
		time.Sleep(2 * time.Millisecond) // the servers' clock passes its millisecond
		require.True(t, seenAfter(t, ctx, log, page.Next, a),
			"check-in %s (partition 0), recorded after the page with cursor %s, is listed by the pages after it", a, page.Next)
	}
	require.Positive(t, paged, "no attempt paged")
}

// seenAfter pages from cursor to the end and says whether it lists entry id.
func seenAfter(t *testing.T, ctx context.Context, log *adapters.EventLog, cursor, id string) bool {
	t.Helper()
	for cursor != "" {
		p, err := log.Range(ctx, 0, 1<<62, cursor, 1)
		require.NoError(t, err)
		for _, c := range p.Checkins {
			if c.EntryID == id {
				return true
			}
		}
		cursor = p.Next
	}
	return false
}
