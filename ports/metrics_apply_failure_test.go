package ports_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/ports"
)

func review5Scrape(t *testing.T, reg prometheus.Gatherer) string {
	t.Helper()
	rec := httptest.NewRecorder()
	ports.MetricsHandler(reg).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

// TestApplyFailureCountsAsFailedAttempts: checkins_projection_events_total{outcome="failed"} is
// "one attempt; it may be retried". An event whose updates Redis refuses (a key of another type
// under the projection) is tried RETRY_MAX_ATTEMPTS times and parked: each of those attempts
// failed, yet only handler errors are counted, so the parked event shows no failed attempt.
func TestApplyFailureCountsAsFailedAttempts(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := ports.NewMetrics(reg)
	require.NoError(t, err)
	p := newFaulty("faulty", nil)
	h := startHarness(t, p, harnessOptions{observer: m, before: func(h *harness) {
		// The projection's hash is a string: HINCRBY fails with WRONGTYPE for every event.
		require.NoError(t, h.client.Set(context.Background(), h.keys.ProjectionKey("faulty", 1, "all", "stats"), "x", 0).Err())
	}})
	h.add("a", 1)
	require.Eventually(t, func() bool { return len(h.poison()) == 1 }, 15*time.Second, 20*time.Millisecond)
	require.Equal(t, 3, h.poison()[0].Attempts, "parked after RETRY_MAX_ATTEMPTS attempts")
	body := review5Scrape(t, reg)
	poisoned, _ := metricValue(body, `checkins_projection_events_total{outcome="poisoned",projection="faulty"}`)
	require.Equal(t, 1.0, poisoned, "parked once")
	failed, _ := metricValue(body, `checkins_projection_events_total{outcome="failed",projection="faulty"}`)
	assert.Equal(t, 3.0, failed, "RETRY_MAX_ATTEMPTS (3) failed attempts before it was parked; the metrics:\n%s", grepLines(body, "checkins_projection_events_total"))
}

func grepLines(body, prefix string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
