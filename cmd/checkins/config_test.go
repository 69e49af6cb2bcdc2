package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// A REDIS_URL that is refused names the problem and never echoes its password, even when the
// password itself is what breaks the URL (an unescaped '%', '#' or '?').
func TestConfigRedisURLNeverEchoesItsPassword(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, secret, want string }{
		{"redis://:s3cr%zz@127.0.0.1:6379/0", "s3cr", `got "redis://xxxxx@127.0.0.1:6379/0"`},
		{"redis://:pa#ss3cret@127.0.0.1:6379", "ss3cret", `got "redis://xxxxx@127.0.0.1:6379"`},
		{"redis://app:pa?ss3cret@127.0.0.1:6379", "ss3cret", `got "redis://xxxxx@127.0.0.1:6379"`},
		{"http://:hunter2pw@127.0.0.1:6379", "hunter2pw", `got "http://:xxxxx@127.0.0.1:6379"`},
		{"redis://default:6379/Zk9s3cret@redis.internal:6379", "Zk9s3cret", `got "redis://xxxxx@redis.internal:6379"`},
		{"redis://user:12345#s3cret@h:6379", "s3cret", `got "redis://xxxxx@h:6379"`},
		{"redis://127.0.0.1:6379/x", "", `database must be a number, got "x"`},
	} {
		_, err := parseEnv(map[string]string{"REDIS_URL": tc.url})
		require.Error(t, err, tc.url)
		assert.Contains(t, err.Error(), "invalid REDIS_URL: ", tc.url)
		assert.Contains(t, err.Error(), tc.want, tc.url)
		if tc.secret != "" {
			assert.NotContains(t, err.Error(), tc.secret, "the password is never echoed: %s", tc.url)
		}
	}
	assert.Equal(t, "redis://:xxxxx@h:1/0", redact("redis://:pw@h:1/0"))
	assert.Equal(t, "redis://h:1/0", redact("redis://h:1/0"), "nothing to hide")
}

// TestServiceRefusesADatabaseTheServerLacks: a REDIS_URL naming a database the server does not
// have (db 99999 of the default 16) stops the start with a message naming REDIS_URL; it started
// and stayed not ready for good, since no waiting heals it.
func TestServiceRefusesADatabaseTheServerLacks(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	env := withTestAuth(map[string]string{"REDIS_URL": strings.TrimSuffix(srv.URL(), "/0") + "/99999", "HTTP_ADDR": "127.0.0.1:0"})
	code, _, stderr := runCLI(t, env, "api")
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "invalid REDIS_URL")
	assert.Contains(t, stderr, "DB index is out of range")
}
