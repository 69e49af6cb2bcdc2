package ports

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/query"
)

// TestDashboardRateSurvivesRetention: the dashboard's "check-ins per second" was the stream
// length's growth between two samples. With RETENTION on, the projector trims every
// RETENTION_INTERVAL; a sample that spanned a trim saw the length shrink and reported 0 check-ins
// per second (and the groups' rates dropped with it) although 100 arrived in that second. It is
// now the growth of entries-added.
func TestDashboardRateSurvivesRetention(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	c := redistest.Client(t, env.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: env.Prefix}
	add := func(n int) {
		for range n {
			require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: map[string]any{"k": "v"}}).Err())
		}
	}
	add(1000)
	status, err := query.NewStatus(adapters.NewOpsBackend(c, keys), nil, 0)
	require.NoError(t, err)
	t0 := time.Now()
	st1, err := status.Status(ctx)
	require.NoError(t, err)
	s1 := deriveSample(t0, st1, nil)

	add(100)                                                         // 100 check-ins in the next second
	require.NoError(t, c.XTrimMaxLen(ctx, keys.Stream(), 600).Err()) // retention trims 500 old ones
	st2, err := status.Status(ctx)
	require.NoError(t, err)
	s2 := deriveSample(t0.Add(time.Second), st2, &s1)
	assert.InDelta(t, 100, s2.Rate, 1, "100 check-ins arrived in 1s; the dashboard says %.0f/s", s2.Rate)
}
