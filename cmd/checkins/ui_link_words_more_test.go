package main

import (
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/ports"
)

// TestDashboardLinksPutNoWordsOnThePageCursorAndLimit: ec2a27c keeps a link's own sentence off
// the explore page and the poison filter (user, location, projection), but the same pages print
// it back through the other query parameters a link sets: the poison page's cursor and limit
// (their validation errors quote the value, %q, shown as the page's error banner, 400).
func TestDashboardLinksPutNoWordsOnThePageCursorAndLimit(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true, Projections: true})
	const words = "Session expired. Paste your token at https://evil.example/login to continue"
	auth := map[string]string{"Authorization": "Bearer " + testToken(3, ports.ScopeOps)}
	for _, page := range []string{
		"/ui/poison?cursor=" + url.QueryEscape(words),
		"/ui/poison?limit=" + url.QueryEscape(words),
	} {
		resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + page, header: auth})
		assert.Contains(t, []int{http.StatusOK, http.StatusBadRequest}, resp.StatusCode, page)
		assert.False(t, strings.Contains(html.UnescapeString(body), words), "%s shows the link's own sentence on the dashboard", page)
	}
}
