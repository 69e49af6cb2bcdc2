package ports_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/ports"
)

// TestPoisonBulkRunsWithAShortRequestTimeout: with REQUEST_TIMEOUT at or below
// the bulk runs' deadline reserve (500 ms; the setting accepts anything from 1 ms), a bulk
// replay or purge over HTTP stops before it handles anything, and walkPoison sets Next to the
// run's "after", which is "" on a first call: the answer is 200 without "next", which is how
// a complete run answers. The operator (and the dashboard's replay-all/purge-all) is told the
// run is done while every entry is still in the queue.
func TestPoisonBulkRunsWithAShortRequestTimeout(t *testing.T) {
	t.Parallel()
	h := startHarness(t, newFaulty("faulty", nil), harnessOptions{})
	const n = 5
	for i := range n {
		h.park("short-"+strconv.Itoa(i), 1)
	}
	a := opsApp(t, h.client, h.keys, []projection.Projection{h.proj}, app.OpsConfig{})
	srv := ports.NewHTTPServer(app.Application{}, nil, ports.HTTPConfig{RequestTimeout: 400 * time.Millisecond}, slog.New(slog.DiscardHandler))
	require.NoError(t, ports.RegisterOpsRoutes(srv.Echo(), a))
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)

	for _, c := range []struct{ method, path string }{{"POST", "/ops/poison/replay"}, {"DELETE", "/ops/poison"}} {
		var res command.BulkResult
		status := call(t, c.method, ts.URL+c.path, &res)
		left := len(h.poison())
		if status == http.StatusOK && res.Next == "" {
			assert.Zero(t, left, "%s %s answered 200 without next (a complete run: %+v) but %d of %d entries are still parked",
				c.method, c.path, res, left, n)
		}
	}
	// And the runs get somewhere: the reserve before the deadline is at most a quarter of it.
	assert.Empty(t, h.poison(), "a replay and a purge with REQUEST_TIMEOUT 400ms left entries parked")

	// A run whose time is up before its first entry says where to go on from.
	for i := range n {
		h.park("late-"+strconv.Itoa(i), 1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	res, err := a.Commands.PurgePoisoned.PurgeAll(ctx, command.BulkRequest{Until: "99999999999999-0"})
	require.NoError(t, err)
	assert.Equal(t, "0-0", res.Next, "%+v", res)
	assert.Len(t, h.poison(), n)
}
