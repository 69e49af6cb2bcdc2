package ports_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/ports"
)

func mustLimit(t testing.TB, s string) command.RateLimit {
	t.Helper()
	l, err := command.ParseRateLimit(s)
	require.NoError(t, err)
	return l
}

// TestRateLimitPerUser: a burst is taken, the next request is 429 with Retry-After, the draft's
// RateLimit-Policy and RateLimit fields and code rate_limited, and writes nothing; the budget
// comes back; other users have their own.
func TestRateLimitPerUser(t *testing.T) {
	t.Parallel()
	for _, oneStep := range []bool{false, true} {
		t.Run(stepName(oneStep), func(t *testing.T) {
			t.Parallel()
			rateLimitPerUser(t, newAPIEnvWith(t, apiOptions{http: ports.HTTPConfig{Auth: hs256Policy(t, 0)},
				userLimit: mustLimit(t, "1/s,burst=3"), oneStep: oneStep}))
		})
	}
}

func rateLimitPerUser(t *testing.T, e *apiEnv) {
	tok := bearer(signHS(t, validClaims("4"), []byte(testSecret)))
	for i := range 3 {
		resp := e.post(t, fmt.Sprintf(`{"locationId":1,"starRating":1,"checkinId":"b-%d"}`, i), tok)
		require.Equal(t, http.StatusAccepted, resp.status, "request %d of the burst: %s", i, resp.body)
		assert.Equal(t, `"user";q=3;w=3`, resp.header.Get("RateLimit-Policy"))
		assert.Regexp(t, `^"user";r=\d+;t=\d+$`, resp.header.Get("RateLimit"))
	}
	events, reserved := e.xlen(t), len(e.idemKeys(t))
	resp := e.post(t, `{"locationId":1,"starRating":1,"checkinId":"over"}`, tok)
	require.Equal(t, http.StatusTooManyRequests, resp.status, "%s", resp.body)
	assert.Equal(t, ports.CodeRateLimited, resp.apiError(t).Code)
	retry, err := strconv.Atoi(resp.header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After is whole seconds")
	assert.GreaterOrEqual(t, retry, 1)
	assert.Equal(t, `"user";q=3;w=3`, resp.header.Get("RateLimit-Policy"))
	assert.Regexp(t, `^"user";r=0;t=[1-3]$`, resp.header.Get("RateLimit"))
	assert.Equal(t, events, e.xlen(t), "a refused request writes nothing")
	assert.Len(t, e.idemKeys(t), reserved, "and reserves nothing")

	other := bearer(signHS(t, validClaims("5"), []byte(testSecret)))
	assert.Equal(t, http.StatusAccepted, e.post(t, `{"locationId":1,"starRating":1}`, other).status, "user 5 has a budget of its own")

	require.Eventually(t, func() bool {
		return e.post(t, `{"locationId":1,"starRating":1,"checkinId":"over"}`, tok).status == http.StatusAccepted
	}, 10*time.Second, 100*time.Millisecond, "the budget comes back")
}

// TestRateLimitCountsRefusedBodies: every request of the user counts, one whose body is refused
// too (the limit is counted with the reservation, after the body is read), and over the limit
// the answer is 429 whatever the body.
func TestRateLimitCountsRefusedBodies(t *testing.T) {
	t.Parallel()
	e := newAPIEnvWith(t, apiOptions{http: ports.HTTPConfig{Auth: hs256Policy(t, 0)}, userLimit: mustLimit(t, "1/m,burst=3"), oneStep: true})
	tok := bearer(signHS(t, validClaims("6"), []byte(testSecret)))
	resp := e.post(t, `{"locationId":1,`, tok)
	require.Equal(t, http.StatusBadRequest, resp.status, "%s", resp.body)
	assert.Regexp(t, `^"user";r=2;t=6[01]$`, resp.header.Get("RateLimit"), "an unreadable body counts")
	resp = e.post(t, `{"locationId":1,"starRating":9}`, tok)
	require.Equal(t, http.StatusBadRequest, resp.status, "%s", resp.body)
	assert.Regexp(t, `^"user";r=1;t=1[12][0-9]$`, resp.header.Get("RateLimit"), "an invalid check-in counts")
	resp = e.post(t, `{"locationId":1,"starRating":1,"checkinId":"c-1"}`, tok)
	require.Equal(t, http.StatusAccepted, resp.status, "%s", resp.body)
	assert.Regexp(t, `^"user";r=0;t=1[78][0-9]$`, resp.header.Get("RateLimit"))
	events := e.xlen(t)
	for _, body := range []string{`{"locationId":1,`, `{"locationId":1,"starRating":1,"checkinId":"c-1"}`, `{"locationId":1,"starRating":1}`} {
		resp = e.post(t, body, tok)
		assert.Equal(t, http.StatusTooManyRequests, resp.status, "over the limit, %s: %s", body, resp.body)
	}
	assert.Equal(t, events, e.xlen(t))
}

// TestRateLimitSharedByInstances: two API instances on one Redis share each user's budget.
func TestRateLimitSharedByInstances(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	limit := mustLimit(t, "1/m,burst=4")
	a := newAPIEnvWith(t, apiOptions{redis: srv, http: ports.HTTPConfig{Auth: hs256Policy(t, 0)}, userLimit: limit})
	// b records in one step, as serve does on a single Redis; a in two: one budget all the same.
	b := newAPIEnvWith(t, apiOptions{redis: srv, http: ports.HTTPConfig{Auth: hs256Policy(t, 0)}, userLimit: limit, oneStep: true})
	tok := bearer(signHS(t, validClaims("8"), []byte(testSecret)))
	codes := map[int]int{}
	for i := range 8 {
		e := a
		if i%2 == 1 {
			e = b
		}
		codes[e.post(t, fmt.Sprintf(`{"locationId":1,"starRating":1,"checkinId":"s-%d"}`, i), tok).status]++
	}
	assert.Equal(t, map[int]int{http.StatusAccepted: 4, http.StatusTooManyRequests: 4}, codes, "one budget of 4 across both instances")
	assert.Equal(t, int64(4), a.xlen(t))
}

// TestRateLimitPerIP: every route is limited per client address; a spoofed X-Forwarded-For or
// X-Real-IP from an untrusted peer changes nothing, while a trusted proxy's X-Forwarded-For
// names the client.
func TestRateLimitPerIP(t *testing.T) {
	t.Parallel()
	limit := mustLimit(t, "1/m,burst=3")
	direct := newAPIEnvWith(t, apiOptions{http: ports.HTTPConfig{IPLimit: limit}})
	codes := map[int]int{}
	for i := range 6 {
		resp := direct.do(t, http.MethodGet, "/users/1", "", nil, map[string]string{
			"X-Forwarded-For": fmt.Sprintf("203.0.113.%d", i), "X-Real-IP": fmt.Sprintf("198.51.100.%d", i)})
		codes[resp.status]++
		if resp.status == http.StatusTooManyRequests {
			assert.Equal(t, `"ip";q=3;w=180`, resp.header.Get("RateLimit-Policy"))
			assert.NotEmpty(t, resp.header.Get("Retry-After"))
			assert.Equal(t, ports.CodeRateLimited, resp.apiError(t).Code)
		}
	}
	assert.Equal(t, map[int]int{http.StatusNotFound: 3, http.StatusTooManyRequests: 3}, codes, "spoofed headers do not buy a new budget")
	assert.Equal(t, http.StatusTooManyRequests, direct.do(t, http.MethodPost, "/checkins", "application/json", nil, nil).status, "every route")

	trusted, err := ports.ParseTrustedProxies("127.0.0.1")
	require.NoError(t, err)
	proxied := newAPIEnvWith(t, apiOptions{http: ports.HTTPConfig{IPLimit: limit, IPExtractor: ports.IPExtractor(trusted)}})
	for i := range 6 {
		resp := proxied.do(t, http.MethodGet, "/users/1", "", nil, map[string]string{"X-Forwarded-For": fmt.Sprintf("203.0.113.%d", i)})
		assert.Equal(t, http.StatusNotFound, resp.status, "client %d behind the trusted proxy has its own budget", i)
	}
	for range 3 {
		proxied.do(t, http.MethodGet, "/users/1", "", nil, map[string]string{"X-Forwarded-For": "192.0.2.1, 203.0.113.50"})
	}
	resp := proxied.do(t, http.MethodGet, "/users/1", "", nil, map[string]string{"X-Forwarded-For": "10.9.9.9, 203.0.113.50"})
	assert.Equal(t, http.StatusTooManyRequests, resp.status, "the rightmost untrusted hop is the client, whatever it prepends")
}

func TestParseRateLimit(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]command.RateLimit{
		"off":               {},
		"10/s,burst=20":     {Rate: 10, Period: time.Second, Burst: 20},
		"600/m":             {Rate: 600, Period: time.Minute, Burst: 600},
		" 5/h , burst=1 ":   {Rate: 5, Period: time.Hour, Burst: 1},
		"200/s,burst=400":   {Rate: 200, Period: time.Second, Burst: 400},
		"1/s,burst=1":       {Rate: 1, Period: time.Second, Burst: 1},
		"100000/s,burst=10": {Rate: 100000, Period: time.Second, Burst: 10},
	} {
		got, err := command.ParseRateLimit(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "10", "10/d", "0/s", "-1/s", "10/s,burst=0", "10/s,bust=3", "ten/s", "10/s,burst=x"} {
		_, err := command.ParseRateLimit(in)
		assert.ErrorContains(t, err, "like 10/s,burst=20", "%q", in)
	}
	_, err := ports.ParseTrustedProxies("10.0.0.0/8, 192.168.1.7,::1")
	require.NoError(t, err)
	_, err = ports.ParseTrustedProxies("10.0.0.0/33")
	assert.ErrorContains(t, err, "neither an IP address nor a CIDR range")
	_, err = ports.ParseTrustedProxies("proxy.internal")
	assert.Error(t, err)
}

// TestRateLimitHeadersNameEveryLimit: with both limits on, a check-in's answer carries one item
// per limit in each field, the address's and the user's, as the draft's lists do (the user's
// item was written over the address's: the two were merged under a key Header.Get never finds).
func TestRateLimitHeadersNameEveryLimit(t *testing.T) {
	t.Parallel()
	for _, oneStep := range []bool{false, true} {
		t.Run(stepName(oneStep), func(t *testing.T) {
			t.Parallel()
			// Slow policies: t, the seconds until a quota is back, is k intervals less the time
			// since the first request, so it is checked within a minute of that.
			e := newAPIEnvWith(t, apiOptions{http: ports.HTTPConfig{Auth: hs256Policy(t, 0), IPLimit: mustLimit(t, "1/h,burst=5")},
				userLimit: mustLimit(t, "1/m,burst=3"), oneStep: oneStep})
			tok := bearer(signHS(t, validClaims("4"), []byte(testSecret)))
			items := regexp.MustCompile(`^"ip";r=(\d+);t=(\d+), "user";r=(\d+);t=(\d+)$`)
			check := func(resp apiResponse, ipR, ipT, userR, userT int) {
				t.Helper()
				assert.Equal(t, []string{`"ip";q=5;w=18000, "user";q=3;w=180`}, resp.header.Values("RateLimit-Policy"))
				v := resp.header.Values("RateLimit")
				require.Len(t, v, 1)
				m := items.FindStringSubmatch(v[0])
				require.NotNil(t, m, "RateLimit: %s", v[0])
				n := func(s string) int { x, err := strconv.Atoi(s); require.NoError(t, err); return x }
				assert.Equal(t, ipR, n(m[1]), "the address's remaining")
				assert.InDelta(t, ipT, n(m[2]), 60, "the address's reset")
				assert.Equal(t, userR, n(m[3]), "the user's remaining")
				assert.InDelta(t, userT, n(m[4]), 60, "the user's reset")
			}
			for i := range 3 {
				resp := e.post(t, fmt.Sprintf(`{"locationId":1,"starRating":1,"checkinId":"h-%d"}`, i), tok)
				require.Equal(t, http.StatusAccepted, resp.status, "%s", resp.body)
				check(resp, 4-i, 3600*(i+1), 2-i, 60*(i+1))
			}
			resp := e.post(t, `{"locationId":1,"starRating":1,"checkinId":"h-over"}`, tok)
			require.Equal(t, http.StatusTooManyRequests, resp.status, "%s", resp.body)
			check(resp, 1, 14400, 0, 180) // the address's quota counted this request too; the user's is spent
		})
	}
}
