package ports_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/ports"
)

// TestCORSPreflightIsLimitedPerAddress: RATE_LIMIT_IP limits "every route per client address".
// With CORS_ALLOWED_ORIGINS set, the CORS middleware was installed before the per-address
// limiter and answers every OPTIONS itself (204, without calling next), so a client over its
// budget still got every preflight answered (found by a review). Now a preflight is counted
// before it, and refused (429) like any request; any other request is counted after it, so that
// its 429 carries the CORS headers a browser needs to read it.
func TestCORSPreflightIsLimitedPerAddress(t *testing.T) {
	t.Parallel()
	limit := mustLimit(t, "1/h,burst=2")
	preflight := func(e *apiEnv) apiResponse {
		return e.do(t, http.MethodOptions, "/checkins", "", nil, map[string]string{"Origin": "https://app.example.com",
			"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type,authorization"})
	}
	for _, tc := range []struct {
		name string
		cors []string
	}{{"CORS off", nil}, {"CORS on", []string{"https://app.example.com"}}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newAPIEnvWith(t, apiOptions{cors: tc.cors, http: ports.HTTPConfig{IPLimit: limit}})
			for range 2 {
				require.Equal(t, http.StatusOK, e.get(t, "/healthz").status)
			}
			require.Equal(t, http.StatusTooManyRequests, e.get(t, "/healthz").status, "the budget is spent")
			for i := range 5 {
				resp := preflight(e)
				assert.Equal(t, http.StatusTooManyRequests, resp.status,
					"preflight %d from an address over its limit is answered %d (Access-Control-Allow-Origin %q, RateLimit %q)",
					i, resp.status, resp.header.Get("Access-Control-Allow-Origin"), resp.header.Get("RateLimit"))
			}
			if tc.cors != nil {
				resp := e.do(t, http.MethodGet, "/healthz", "", nil, map[string]string{"Origin": "https://app.example.com"})
				assert.Equal(t, http.StatusTooManyRequests, resp.status)
				assert.Equal(t, "https://app.example.com", resp.header.Get("Access-Control-Allow-Origin"), "a browser can read the 429")
			}
		})
	}
}

// TestCORSOriginsABrowserNeverSends: an origin listed with its scheme's default port or a
// trailing dot was accepted and never matched what a browser sends, so CORS was off for it
// without a word (found by a review). Now the start refuses it, saying how to write it.
func TestCORSOriginsABrowserNeverSends(t *testing.T) {
	t.Parallel()
	for bad, want := range map[string]string{
		"https://app.example.com:443": "list it as https://app.example.com",
		"http://app.example.com:80":   "list it as http://app.example.com",
		"https://app.example.com.":    "ends its host with a dot",
	} {
		_, err := ports.ParseCORSOrigins(bad)
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), want, bad)
	}
	got, err := ports.ParseCORSOrigins("https://app.example.com:8443")
	require.NoError(t, err)
	assert.Equal(t, []string{"https://app.example.com:8443"}, got, "another port is the origin's own")
}
