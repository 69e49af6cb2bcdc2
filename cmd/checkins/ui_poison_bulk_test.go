package main

// The dashboard: its poison queue page's bulk actions and its error states.

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/ports"
)

// TestPurgeAllOfAProjectionReachesPastTheFirstThousand: "Purge all" of one projection
// on the poison page handles at most DefaultHTTPBulkLimit (1000) entries per click, counted over
// every entry it walks (other projections' too), and the dashboard drops the run's next/until and
// starts again from the head of the queue on the next click. With 1000 entries of another
// projection parked first, the projection's own entries are never reached: every click says
// "purged 0 entries; stopped after 1000, purge again for the rest", for ever.
func TestPurgeAllOfAProjectionReachesPastTheFirstThousand(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	q := adapters.NewPoisonQueue(client, keys)
	park := func(projection string, i int) string {
		id, err := q.Park(ctx, ops.PoisonEntry{Stream: keys.Stream(), EntryID: fmt.Sprintf("1-%d", i), Projection: projection,
			Group: "live", Version: 1, Error: "bug", Attempts: 1, FailedAt: time.Now(), Fields: map[string]string{"x": "y"}})
		require.NoError(t, err)
		return id
	}
	for i := range ports.DefaultHTTPBulkLimit {
		park("locations", i)
	}
	users := park("users", ports.DefaultHTTPBulkLimit)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	auth := map[string]string{"Authorization": "Bearer " + testToken(1, ports.ScopeOps)}

	until := regexp.MustCompile(`(?s)id="purge-all-form">.*?name="until" value="([^"]*)"`)
	var banner string
	for click := range 3 { // as the banner says: "purge again for the rest"
		resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/poison?projection=users", header: auth})
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		m := until.FindStringSubmatch(body)
		require.NotNil(t, m, body)
		resp, body = uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + "/ui/poison/purge-all", header: auth,
			form: url.Values{"projection": {"users"}, "confirm": {"users"}, "until": {m[1]}}})
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
		loc, err := url.Parse(resp.Header.Get("Location"))
		require.NoError(t, err)
		_, page := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + loc.String(), header: auth})
		if b := regexp.MustCompile(`<p class="(?:flash|error)"[^>]*>([^<]*)</p>`).FindStringSubmatch(page); b != nil {
			banner = b[1]
		}
		t.Logf("click %d: %s", click+1, banner)
		if n, err := client.XRange(ctx, keys.PoisonStream(), users, users).Result(); err == nil && len(n) == 0 {
			return // purged
		}
	}
	left, err := client.XRange(ctx, keys.PoisonStream(), users, users).Result()
	require.NoError(t, err)
	assert.Empty(t, left, "after three clicks of \"Purge all of users\" the one users entry is still parked (last banner: %q)", banner)
}

// TestPoisonPageWithABadLimitKeepsItsFilterAndBound: a poison page whose link has a bad
// limit (or cursor) keeps its projection filter (the select shows it, and "Replay all of users"
// and "Purge all" act on it), but the live table it refreshes every second asks for
// /ui/poison/table without the filter, so it lists every projection's entries under a filter of
// "users"; and the bulk forms carry until="" (the bound was never read), so "purge all" runs to
// whatever is newest when clicked, entries parked after the page was made included.
func TestPoisonPageWithABadLimitKeepsItsFilterAndBound(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	q := adapters.NewPoisonQueue(client, keys)
	for i, p := range []string{"users", "locations"} {
		_, err := q.Park(ctx, ops.PoisonEntry{Stream: keys.Stream(), EntryID: fmt.Sprintf("1-%d", i), Projection: p,
			Group: "live", Version: 1, Error: "bug", Attempts: 1, FailedAt: time.Now(), Fields: map[string]string{"x": "y"}})
		require.NoError(t, err)
	}
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	auth := map[string]string{"Authorization": "Bearer " + testToken(1, ports.ScopeOps)}

	resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/poison?projection=users&limit=0", header: auth})
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	require.Contains(t, body, `<option value="users" selected>`, "the page keeps the filter")
	live := regexp.MustCompile(`id="poison-live" hx-get="([^"]*)"`).FindStringSubmatch(body)
	require.NotNil(t, live, body)
	t.Logf("live table: %s", live[1])
	bound := regexp.MustCompile(`(?s)id="purge-all-form">.*?name="until" value="([^"]*)"`).FindStringSubmatch(body)
	require.NotNil(t, bound, body)
	t.Logf("purge-all until=%q", bound[1])
	assert.Contains(t, live[1], "projection=users", "the live table of a page filtered by users lists every projection")
	assert.NotEmpty(t, bound[1], "purge all is bounded by nothing: it runs to what is parked when it is clicked")
}
