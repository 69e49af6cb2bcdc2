package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/ports"
)

// Every GET route answers HEAD as the GET would, without the body (RFC 9110 9.3.2: a server
// must support HEAD wherever it supports GET); a route without a GET still answers HEAD 405.
func TestHeadAnswersAsGetWithoutTheBody(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "127.0.0.1:0"}, Mode{API: true, Projections: true})
	status, _, body := plainDo(t, http.MethodPost, svc.base+"/checkins", testToken(42), `{"locationId":7,"starRating":4,"checkinId":"head-1"}`)
	require.Equal(t, http.StatusAccepted, status, body)
	require.Eventually(t, func() bool {
		s, _, _ := plainDo(t, http.MethodGet, svc.base+"/users/42", "", "")
		return s == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)

	ops := testToken(1, ports.ScopeOps)
	for _, c := range []struct{ url, token string }{
		{svc.base + "/users/42", ""},
		{svc.base + "/users/43", ""}, // 404
		{svc.base + "/users/x", ""},  // 400
		{svc.base + "/locations/7", ""},
		{svc.base + "/locations/7/daily", ""},
		{svc.base + "/users/42/checkins", ""},
		{svc.base + "/leaderboards/locations?by=checkins", ""},
		{svc.base + "/checkins/latest", ""},
		{svc.base + "/checkins?from=0&to=9999999999999", ""},
		{svc.base + "/openapi.json", ""},
		{svc.base + "/healthz", ""},
		{svc.ops + "/readyz", ""},
		{svc.ops + "/ops/status", ops},
		{svc.ops + "/ops/status", ""}, // 401
		{svc.ops + "/ops/poison", ops},
		{svc.ops + "/metrics", ops},
	} {
		getStatus, getHeader, _ := plainDo(t, http.MethodGet, c.url, c.token, "")
		headStatus, headHeader, headBody := plainDo(t, http.MethodHead, c.url, c.token, "")
		assert.Equal(t, getStatus, headStatus, "HEAD %s", c.url)
		assert.Equal(t, getHeader.Get("Content-Type"), headHeader.Get("Content-Type"), "HEAD %s", c.url)
		assert.NotEmpty(t, headHeader.Get(ports.HeaderCorrelationID), "HEAD %s", c.url)
		assert.Empty(t, headBody, "HEAD %s", c.url)
	}

	status, header, _ := plainDo(t, http.MethodHead, svc.ops+"/ops/projections/users/rebuild", ops, "")
	assert.Equal(t, http.StatusMethodNotAllowed, status)
	assert.Contains(t, header.Get("Allow"), http.MethodPost)
	_, header, _ = plainDo(t, http.MethodOptions, svc.base+"/users/42", "", "")
	assert.Contains(t, header.Get("Allow"), http.MethodHead, "OPTIONS lists HEAD beside GET")
}
