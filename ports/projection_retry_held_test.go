package ports_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app/ops"
)

// TestAUnitBeganFailingLateGetsItsAttempts: one entry, two projections of one live group.
// "a" fails on it every time; "b"'s unit of it is held (an entry is applied whole) and run again
// with every retry of "a". "b" fails once, on the last attempt of the round. It was parked at
// once with attempts 1, though RETRY_MAX_ATTEMPTS (3) attempts were owed it and it would have
// succeeded on its second (found by a review). Now only "a" is parked, and "b" counts the event.
func TestAUnitBeganFailingLateGetsItsAttempts(t *testing.T) {
	t.Parallel()
	a := newFaulty("a", func(_ context.Context, id string, _ int) error {
		if id == "bad" {
			return errors.New("a is broken on this event")
		}
		return nil
	})
	b := newFaulty("b", func(_ context.Context, id string, n int) error {
		if id == "bad" && n == 3 { // its first failure: the third try of the round
			return errors.New("b failed once (intermittent)")
		}
		return nil
	})
	h := startHarness(t, a, harnessOptions{targets: []ops.ProjectionTarget{{Projection: a, Version: 1}, {Projection: b, Version: 1}}})
	h.add("bad", 1)
	h.add("good", 1)
	require.Eventually(t, func() bool { return h.count() == 1 && h.pending() == 0 }, 15*time.Second, 20*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	var parkedB []ops.PoisonEntry
	for _, e := range h.poison() {
		t.Logf("parked: projection=%s attempts=%d error=%q", e.Projection, e.Attempts, e.Error)
		if e.Projection == "b" {
			parkedB = append(parkedB, e)
		}
	}
	t.Logf("b handled \"bad\" %d times", b.attempts("bad"))
	assert.Empty(t, parkedB, "b failed once and was owed 2 more attempts (RETRY_MAX_ATTEMPTS=3)")
	assert.Len(t, h.poison(), 1, "a's unit is parked")
	n, err := h.client.HGet(context.Background(), h.keys.ProjectionKey("b", 1, "all", "stats"), "count").Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(2), n, "b counted both events")
}
