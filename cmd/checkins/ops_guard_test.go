package main

// The ops listener against browsers and greedy clients: cross-site requests, DNS rebinding with
// AUTH_MODE=off, and bodies larger than any of its routes takes.

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// rawRequest sends one request with headers set exactly (Host included) and no redirects
// followed; it returns the status and the Location header and body.
func rawRequest(t *testing.T, method, u string, hdr map[string]string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	require.NoError(t, err)
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, resp.Header.Get("Location") + " " + string(b)
}

// TestOpsWithAuthOffRefusesOtherSites: with AUTH_MODE=off (loopback only) a page of another
// site that the operator's browser shows can neither post to /ops (cross-site, refused 403) nor
// reach the service under a name of its own that resolves to 127.0.0.1 (DNS rebinding: refused
// 421 on both listeners), while requests addressed to loopback work as before.
func TestOpsWithAuthOffRefusesOtherSites(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "AUTH_MODE": "off", "OPS_ADDR": "127.0.0.1:0"}, Mode{API: true})
	form := map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site", "Content-Type": "application/x-www-form-urlencoded"}
	for _, path := range []string{"/ops/projections/users/rebuild", "/ops/poison/replay", "/ui/poison/purge-all"} {
		st, body := rawRequest(t, http.MethodPost, svc.ops+path, form, strings.NewReader("projection=&confirm=all"))
		assert.Equal(t, http.StatusForbidden, st, "cross-site POST %s: %s", path, body)
		assert.Contains(t, body, "cross_origin", path)
	}

	ops, err := url.Parse(svc.ops)
	require.NoError(t, err)
	api, err := url.Parse(svc.base)
	require.NoError(t, err)
	for _, tc := range []struct{ method, base, path, host string }{
		{http.MethodPost, svc.ops, "/ui/poison/purge-all", "rebind.evil.example:" + ops.Port()},
		{http.MethodPost, svc.ops, "/ops/projections/users/rebuild", "rebind.evil.example:" + ops.Port()},
		{http.MethodGet, svc.ops, "/ops/status", "rebind.evil.example"},
		{http.MethodGet, svc.base, "/users/1", "rebind.evil.example:" + api.Port()},
	} {
		h := map[string]string{"Host": tc.host, "Origin": "http://" + tc.host, "Sec-Fetch-Site": "same-origin", "Content-Type": "application/x-www-form-urlencoded"}
		st, body := rawRequest(t, tc.method, tc.base+tc.path, h, strings.NewReader("projection=&confirm=all"))
		assert.Equal(t, http.StatusMisdirectedRequest, st, "%s %s for Host %s: %s", tc.method, tc.path, tc.host, body)
		assert.Contains(t, body, "misdirected_request", tc.path)
	}

	for _, host := range []string{"127.0.0.1:" + ops.Port(), "localhost:" + ops.Port(), "LOCALHOST", "[::1]:" + ops.Port()} {
		st, body := rawRequest(t, http.MethodGet, svc.ops+"/ops/status", map[string]string{"Host": host}, nil)
		assert.Equal(t, http.StatusOK, st, "Host %s: %s", host, body)
	}
	st, body := rawRequest(t, http.MethodPost, svc.ops+"/ui/poison/purge-all", map[string]string{"Host": "localhost:" + ops.Port(),
		"Origin": "http://localhost:" + ops.Port(), "Sec-Fetch-Site": "same-origin", "Content-Type": "application/x-www-form-urlencoded"}, strings.NewReader("projection=&confirm=all"))
	assert.Equal(t, http.StatusSeeOther, st, "the dashboard's own page still acts: %s", body)
}

// TestOpsListenerRefusesGreedyBodies: a body larger than any route of the ops listener takes
// (the dashboard's login form needs no token) is refused, not read into memory.
func TestOpsListenerRefusesGreedyBodies(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}, Mode{API: true})
	big := "token=" + strings.Repeat("a", 8<<20)
	st, body := rawRequest(t, http.MethodPost, svc.ops+"/ui/login", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, strings.NewReader(big))
	assert.Equal(t, http.StatusRequestEntityTooLarge, st, body)
	assert.Contains(t, body, "body_too_large")

	// Without a declared length (chunked) the body is cut where the limit is: no session.
	st, body = rawRequest(t, http.MethodPost, svc.ops+"/ui/login", map[string]string{"Content-Type": "application/x-www-form-urlencoded"},
		io.MultiReader(strings.NewReader(big))) // not a *strings.Reader: no ContentLength
	assert.GreaterOrEqual(t, st, 400, body)
	assert.Less(t, st, 500, body)

	// A login form of ordinary size is read as before (a wrong token: 401, not 413).
	st, body = rawRequest(t, http.MethodPost, svc.ops+"/ui/login", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, strings.NewReader("token=not-a-token"))
	assert.Equal(t, http.StatusUnauthorized, st, body)
}
