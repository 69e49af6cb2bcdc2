package main

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/ports"
)

var untilField = regexp.MustCompile(`(?s)id="purge-all-form">.*?name="until" value="([^"]*)"`)

// TestDashboardPurgeAllStopsAtWhatThePageShowed: the poison page's "replay all" and "purge all"
// ran to the newest entry when clicked, so an entry parked after the operator loaded the page
// was purged unseen. The forms now carry the newest entry of when the page was made, and the
// runs stop there. And a run that Redis stops answering says what it did and that it stopped,
// where the dashboard showed a bare error page.
func TestDashboardPurgeAllStopsAtWhatThePageShowed(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rdb := redistest.Env{URL: srv.URL(), Prefix: "bound"}
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true, Projections: true})
	auth := map[string]string{"Authorization": "Bearer " + testToken(1, ports.ScopeOps)}
	seen := parkGarbage(t, rdb)

	resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/poison", header: auth})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	m := untilField.FindStringSubmatch(body)
	require.NotNil(t, m, "the purge-all form carries the page's bound: %s", body)
	assert.Equal(t, seen, m[1])
	unseen := parkGarbage(t, rdb) // parked after the page was made

	resp, body = uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + "/ui/poison/purge-all", header: auth,
		form: url.Values{"confirm": {"all"}, "until": {m[1]}}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	assert.Contains(t, resp.Header.Get("Location"), "msg=purged-all")
	client := redistest.Client(t, rdb.URL)
	left, err := client.XRange(context.Background(), adapters.KeySpace{Prefix: rdb.Prefix}.PoisonStream(), "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, left, 1, "only what the page showed is purged")
	assert.Equal(t, unseen, left[0].ID)

	// Redis stops answering: the banner says what was done and that the run stopped.
	srv.Kill()
	resp, body = uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + "/ui/poison/purge-all", header: auth,
		form: url.Values{"confirm": {"all"}, "until": {unseen}}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	loc, err := url.Parse(resp.Header.Get("Location"))
	require.NoError(t, err)
	assert.Equal(t, "purged-all", loc.Query().Get("err"), "%s", loc)
	assert.Equal(t, "1", loc.Query().Get("outage"), "%s", loc)
}
