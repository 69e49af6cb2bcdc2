package main

import (
	"flag"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/ports"
)

// TestLoginRefusesATokenInTheQueryString: "tokens are accepted only in the Authorization header:
// a token in the query string is refused". The dashboard's login takes the pasted token from its
// form, but read it with FormValue, which also reads the URL's query: a POST /ui/login?token=<ops
// token> with no body logged in (303 and the session cookie), the token in the request line,
// where proxies and access logs keep it (found by a review). Now it is refused, and the form's
// body still logs in.
func TestLoginRefusesATokenInTheQueryString(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true, Projections: true})
	tok := testToken(4, ports.ScopeOps)
	resp, body := uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + "/ui/login?token=" + url.QueryEscape(tok), form: url.Values{}})
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "a token in the query string logged in: Location %q, Set-Cookie %q, body %.200s",
		resp.Header.Get("Location"), resp.Header.Values("Set-Cookie"), body)
	assert.Empty(t, resp.Cookies())
	assert.Contains(t, body, "the token goes in the form&#39;s body, never in the URL")
	resp, _ = uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + "/ui/login", form: url.Values{"token": {tok}}})
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode, "the form's body logs in")
}

// TestRateLimitRefusesAPolicyItCannotCount: the limiters count in nanoseconds. "1/h,burst=2600000"
// passed the configuration, and its burst's window (1h x 2,600,000) overflowed negative: every
// request of every address was refused, the first one included (found by a review); a rate above
// 10^9/s made one request's share 0, no limit at all. Both are now refused at start, naming the
// variable.
func TestRateLimitRefusesAPolicyItCannotCount(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]string{
		"1/h,burst=2600000": "burst must be at most 2562047 at 1/h",
		"2000000000/s":      "must be at most 1000000000/s",
	} {
		for _, name := range []string{"RATE_LIMIT_IP", "RATE_LIMIT_USER"} {
			_, _, err := parseConfig(flag.NewFlagSet("test", flag.ContinueOnError), nil, envWith(map[string]string{name: v}))
			require.Error(t, err, "%s=%s", name, v)
			assert.Contains(t, err.Error(), "invalid "+name, v)
			assert.Contains(t, err.Error(), want, v)
		}
	}
	_, _, err := parseConfig(flag.NewFlagSet("test", flag.ContinueOnError), nil, envWith(map[string]string{"RATE_LIMIT_IP": "1/h,burst=2562047"}))
	assert.NoError(t, err, "the largest burst that fits")
}
