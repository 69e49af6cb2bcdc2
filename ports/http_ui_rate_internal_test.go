package ports

import (
	"context"
	"strings"
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
	c, keys, status := dashboardStatus(t)
	ctx := context.Background()
	add := func(n int) {
		for range n {
			require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: map[string]any{"k": "v"}}).Err())
		}
	}
	add(1000)
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

// TestDashboardFirstSampleHasNoRate: the first good sample after the start, or after an outage,
// has no previous one to measure a rate from. The overview said "0.0 check-ins/s" for it, and
// the chart drew a 0 there; both now show no figure (the chart a gap), then the measured one.
func TestDashboardFirstSampleHasNoRate(t *testing.T) {
	t.Parallel()
	c, keys, status := dashboardStatus(t)
	ctx := context.Background()
	require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: map[string]any{"k": "v"}}).Err())
	st, err := status.Status(ctx)
	require.NoError(t, err)
	t0 := time.Now()
	h := &uiHub{history: []uiSample{deriveSample(t0, st, nil)}}
	h.history = append(h.history, deriveSample(t0.Add(time.Second), st, &h.history[0]))
	h.history = append(h.history, uiSample{At: t0.Add(2 * time.Second), Err: "redis down"})
	h.history = append(h.history, deriveSample(t0.Add(3*time.Second), st, nil)) // the first after it
	cd := h.chart()
	require.Len(t, cd.Rate, 4)
	assert.Nil(t, cd.Rate[0], "the first sample has no rate")
	require.NotNil(t, cd.Rate[1])
	assert.Zero(t, *cd.Rate[1], "nothing arrived: a measured 0")
	assert.Nil(t, cd.Rate[2], "the outage")
	assert.Nil(t, cd.Rate[3], "the first sample after the outage has no rate")

	var page strings.Builder
	tmpl, err := parseUITemplates()
	require.NoError(t, err)
	require.NoError(t, tmpl.ExecuteTemplate(&page, "overview_live", map[string]any{"Sample": h.history[3]}))
	assert.Contains(t, page.String(), `id="ingest-rate">-<`, "the overview shows no made-up 0.0")
}

// dashboardStatus is a keyspace on a real Redis and the status query the dashboard samples.
func dashboardStatus(t *testing.T) (*redis.Client, adapters.KeySpace, *query.Status) {
	t.Helper()
	env := redistest.Open(t)
	c := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	status, err := query.NewStatus(adapters.NewOpsBackend(c, keys), nil, 0)
	require.NoError(t, err)
	return c, keys, status
}
