package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRedisURLWithAnImpossiblePortIsRefused: README, Configuration: "an invalid value stops the
// process with a message naming the variable". A REDIS_URL whose port is out of range (99999,
// 0; a seed's too) could never be dialled, yet passed: `api` started, listened and answered 503
// for good, logging go-redis's "invalid port". The start is refused now, naming REDIS_URL.
func TestRedisURLWithAnImpossiblePortIsRefused(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"redis://127.0.0.1:99999/0", "redis://127.0.0.1:0/0", "redis://127.0.0.1:x/0",
		"redis://127.0.0.1:7000?addr=127.0.0.1:70000"} {
		_, err := parseEnv(map[string]string{"REDIS_URL": url})
		if assert.Error(t, err, url) {
			assert.Contains(t, err.Error(), "REDIS_URL", url)
		}
	}
	for _, url := range []string{"redis://127.0.0.1/0", "redis://127.0.0.1:6379/0", "redis://[::1]:6379", "redis://127.0.0.1:7000?addr=127.0.0.1:7001"} {
		_, err := parseEnv(map[string]string{"REDIS_URL": url})
		assert.NoError(t, err, url)
	}
	code, _, stderr := runCLI(t, withTestAuth(map[string]string{"HTTP_ADDR": "127.0.0.1:0", "REDIS_URL": "redis://127.0.0.1:99999/0"}), "api")
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "invalid REDIS_URL: port must be 1-65535")
}

// TestClaimIdleBelowItsFloorIsRefused: CLAIM_IDLE=1ms was accepted, and the batched subscriber's
// lease (CLAIM_IDLE less a fifth, in whole ms) was 0: every batch's hold had run out before it
// was applied, and an accepted check-in was never projected. Below 100ms it is refused.
func TestClaimIdleBelowItsFloorIsRefused(t *testing.T) {
	t.Parallel()
	_, err := parseEnv(map[string]string{"CLAIM_IDLE": "1ms"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CLAIM_IDLE")
	cfg, err := parseEnv(map[string]string{"CLAIM_IDLE": "100ms"})
	require.NoError(t, err)
	assert.Equal(t, 100*time.Millisecond, cfg.ClaimIdle)
}

// TestProjectionsListIsCheckedAtParse: PROJECTIONS="," ran every projection, a name twice failed
// only after the process had written to Redis ("projection users listed twice", naming no
// variable), and `api` took unknown names silently. Each is refused at parse, naming PROJECTIONS.
func TestProjectionsListIsCheckedAtParse(t *testing.T) {
	t.Parallel()
	for v, says := range map[string]string{
		",":                "an empty item",
		"users,,locations": "an empty item",
		"users, users":     `projection "users" listed twice`,
		"users,nope":       `unknown projection "nope"`,
		"Users":            `unknown projection "Users"`,
	} {
		_, err := parseEnv(map[string]string{"PROJECTIONS": v})
		if assert.Error(t, err, v) {
			assert.Contains(t, err.Error(), "invalid PROJECTIONS", v)
			assert.Contains(t, err.Error(), says, v)
		}
	}
	for _, v := range []string{"", " ", "users", " users , locations "} {
		_, err := parseEnv(map[string]string{"PROJECTIONS": v})
		assert.NoError(t, err, v)
	}
	code, _, stderr := runCLI(t, withTestAuth(map[string]string{"HTTP_ADDR": "127.0.0.1:0", "REDIS_URL": "redis://127.0.0.1:1/0", "PROJECTIONS": "nope"}), "api")
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, `invalid PROJECTIONS: unknown projection "nope"`)
}
