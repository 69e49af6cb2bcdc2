package ports_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPausedRouterKeepsItsMarkers: once its groups are quiet a router sweeps the markers of
// its last batches. While paused for a partition migration it did too, and a migration run with
// --force, or resumed, can deliver entries again on the new partitions, which their markers
// are there to catch: swept, an entry applied and acknowledged on an old partition after the
// groups were positioned counted twice (found by a review). A paused router keeps them, and
// sweeps once the pause is over.
func TestPausedRouterKeepsItsMarkers(t *testing.T) {
	t.Parallel()
	var paused atomic.Bool
	p := newFaulty("faulty", func(_ context.Context, id string, _ int) error {
		if id == "e19" {
			paused.Store(true) // the migration's quiesce, as the last batch is applied
		}
		return nil
	})
	h := startHarness(t, p, harnessOptions{paused: paused.Load})
	for i := range 20 {
		h.add("e"+strconv.Itoa(i), 1)
	}
	require.Eventually(t, func() bool { return h.count() == 20 && h.pending() == 0 }, 10*time.Second, 10*time.Millisecond)
	ctx := context.Background()
	markers := func() int {
		ks, err := h.client.Keys(ctx, h.keys.MarkerPrefix(testGroup)+"*").Result()
		require.NoError(t, err)
		n := 0
		for _, k := range ks {
			c, err := h.client.ZCard(ctx, k).Result()
			require.NoError(t, err)
			n += int(c)
		}
		return n
	}
	before := markers()
	require.Positive(t, before)
	time.Sleep(1500 * time.Millisecond) // six checkpoints, every group quiet
	assert.Equal(t, before, markers(), "a paused router sweeps no markers")
	paused.Store(false)
	assert.Eventually(t, func() bool { return markers() < before }, 10*time.Second, 50*time.Millisecond, "once the pause is over it does")
}
