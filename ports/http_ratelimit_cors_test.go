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
