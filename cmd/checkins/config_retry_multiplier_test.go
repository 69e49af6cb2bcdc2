package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// TestConfigRetryMultiplierRefusesNonFiniteValues: RETRY_MULTIPLIER is checked with
// `f < 1`, which NaN passes (every comparison with NaN is false) and +Inf or 1e300 pass too.
// ports.retryMiddleware then computes the next wait as
// time.Duration(float64(delay)*multiplier): for NaN, Inf or any product past ~9.2e18 ns that
// conversion yields a negative Duration, min(negative, RETRY_MAX_INTERVAL) keeps it, and the
// next retry's rand.N(delay) panics.
func TestConfigRetryMultiplierRefusesNonFiniteValues(t *testing.T) {
	t.Parallel()
	// (A finite multiplier whose product overflows, 1e12 and up with the default 100ms, crashes
	// the same way; refusing it or clamping in float before the conversion are both fixes.)
	for _, v := range []string{"NaN", "nan", "Inf", "+Inf"} {
		cfg, err := parseEnv(map[string]string{"RETRY_MULTIPLIER": v, "HOME": "/home/u"})
		if assert.Error(t, err, "RETRY_MULTIPLIER=%s is accepted (parsed as %v): the second retry's wait is %v",
			v, cfg.RetryMultiplier, min(time.Duration(float64(100*time.Millisecond)*cfg.RetryMultiplier), 5*time.Second)) {
			assert.Contains(t, err.Error(), "RETRY_MULTIPLIER")
		}
	}
}

// TestConfigRetryMultiplierLargeGoesStraightToTheMaxInterval: end to end, with a finite but
// large RETRY_MULTIPLIER (1e12, accepted), one event whose apply fails for one projection (a key
// of another type under `users`). The wait times the multiplier overflowed time.Duration to a
// negative wait, rand.N of it panicked in the retry middleware (outside the recoverer), and
// Watermill nacked the whole batch for ever: no projection counted the check-in and nothing was
// parked. The wait is now computed in float and capped at RETRY_MAX_INTERVAL first: the other
// projections count it and `users` parks it. (NaN and Inf are refused at start, above.)
func TestConfigRetryMultiplierLargeGoesStraightToTheMaxInterval(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	require.NoError(t, client.Set(ctx, rdb.Prefix+":p:users:v1:{user:42}:stats", "not a hash", 0).Err())

	env := withTestAuth(map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "HTTP_ADDR": "127.0.0.1:0",
		"RETRY_MULTIPLIER": "1e12", "RETRY_MAX_INTERVAL": "200ms", "LOG_LEVEL": "info"})
	logs := startBinary(t, env, "serve")
	require.Eventually(t, func() bool {
		_, up := logs.find("http listening")
		return up
	}, 30*time.Second, 20*time.Millisecond, "stderr:\n%s", logs)
	base := apiBase(t, logs)
	code, _, err := testPostCheckin(base, `{"userId": 42, "locationId": 7, "starRating": 4}`, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, code)

	require.Eventually(t, func() bool {
		st, m, err := testGetStats(base, "/locations/7")
		return err == nil && st == http.StatusOK && m["numCheckins"] == 1
	}, 20*time.Second, 100*time.Millisecond, "locations counts the check-in; stderr:\n%s", logs)
	require.Eventually(t, func() bool {
		n, err := client.XLen(ctx, rdb.Prefix+":events:poison").Result()
		return err == nil && n == 1
	}, 20*time.Second, 100*time.Millisecond, "users parks it; stderr:\n%s", logs)
	assert.NotContains(t, logs.String(), "Panic recovered in handler")
}
