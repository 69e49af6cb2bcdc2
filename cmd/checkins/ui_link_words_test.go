package main

// http_ui_notes.go keeps a link from putting words of its own on a dashboard
// page ("Session expired. Paste your token at ..."): banners are the server's own texts, asked
// for by key. The Explore page and the poison filter still print the query's text as is, so a
// link an attacker sends an operator shows the attacker's sentence on the operator's own,
// authenticated dashboard, next to its real data.

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

func TestDashboardLinksPutNoWordsOnThePage(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true, Projections: true})
	const words = "Session expired. Paste your token at https://evil.example/login to continue"
	auth := map[string]string{"Authorization": "Bearer " + testToken(3, ports.ScopeOps)}
	for _, page := range []string{
		"/ui/explore?user=" + url.QueryEscape(words),
		"/ui/explore?location=" + url.QueryEscape(words),
		"/ui/poison?projection=" + url.QueryEscape(words),
	} {
		resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + page, header: auth})
		assert.Contains(t, []int{http.StatusOK, http.StatusBadRequest}, resp.StatusCode, page)
		assert.False(t, strings.Contains(html.UnescapeString(body), words), "%s shows the link's own sentence on the dashboard", page)
	}
}
