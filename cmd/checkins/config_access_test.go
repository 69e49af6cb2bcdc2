package main

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/ports"
)

func parseEnv(env map[string]string) (Config, error) {
	cfg, _, err := parseConfig(flag.NewFlagSet("t", flag.ContinueOnError), nil, func(k string) string { return env[k] })
	return cfg, err
}

func TestConfigAccessDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := parseEnv(map[string]string{"HOME": "/home/u"})
	require.NoError(t, err)
	assert.Equal(t, AuthDev, cfg.AuthMode, "dev mode when nothing is configured")
	assert.Equal(t, "checkins", cfg.Issuer)
	assert.Equal(t, "checkins", cfg.Audience)
	assert.Equal(t, "/home/u/.local/state/checkins", cfg.StateDir)
	assert.Equal(t, "127.0.0.1:8081", cfg.OpsAddr)
	assert.Equal(t, 30*time.Second, cfg.ClockLeeway)
	assert.True(t, cfg.PublicReads)
	assert.Equal(t, command.RateLimit{Rate: 10, Period: time.Second, Burst: 20}, cfg.RateLimitUser)
	assert.Equal(t, command.RateLimit{Rate: 200, Period: time.Second, Burst: 400}, cfg.RateLimitIP)
	assert.Empty(t, cfg.TrustedProxies)

	cfg, err = parseEnv(map[string]string{"HOME": "/home/u", "XDG_STATE_HOME": "/xdg"})
	require.NoError(t, err)
	assert.Equal(t, "/xdg/checkins", cfg.StateDir)
	cfg, err = parseEnv(map[string]string{"AUTH_HS256_SECRET": strings.Repeat("s", 32)})
	require.NoError(t, err)
	assert.Equal(t, AuthHS256, cfg.AuthMode, "a secret alone means hs256")
	cfg, err = parseEnv(map[string]string{"AUTH_JWKS_URL": "https://idp.example/jwks", "AUTH_ISSUER": "https://idp.example"})
	require.NoError(t, err)
	assert.Equal(t, AuthJWKS, cfg.AuthMode, "a JWKS URL alone means jwks")
	cfg, err = parseEnv(map[string]string{"RATE_LIMIT_USER": "off", "RATE_LIMIT_IP": "50/m", "TRUSTED_PROXIES": "10.0.0.0/8,192.168.0.1", "AUTH_PUBLIC_READS": "false"})
	require.NoError(t, err)
	assert.True(t, cfg.RateLimitUser.Off())
	assert.Equal(t, command.RateLimit{Rate: 50, Period: time.Minute, Burst: 50}, cfg.RateLimitIP)
	assert.Len(t, cfg.TrustedProxies, 2)
	assert.False(t, cfg.PublicReads)

	file := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(file, []byte(strings.Repeat("f", 40)+"\n"), 0o600))
	cfg, err = parseEnv(map[string]string{"AUTH_MODE": "hs256", "AUTH_HS256_SECRET_FILE": file})
	require.NoError(t, err)
	assert.Equal(t, []byte(strings.Repeat("f", 40)), cfg.HS256Secret, "the trailing newline is not part of the secret")
}

// Bad access settings stop the process with a message naming the variable, and never echo the
// secret.
func TestConfigAccessRejectsBadSettings(t *testing.T) {
	t.Parallel()
	short := "short-secret-" + strings.Repeat("x", 10)
	file := filepath.Join(t.TempDir(), "short")
	require.NoError(t, os.WriteFile(file, []byte("tiny"), 0o600))
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"AUTH_MODE": "saml"}, `invalid AUTH_MODE: must be jwks, hs256, dev or off, got "saml"`},
		{map[string]string{"AUTH_MODE": "hs256"}, "invalid AUTH_HS256_SECRET: AUTH_MODE=hs256 needs AUTH_HS256_SECRET or AUTH_HS256_SECRET_FILE"},
		{map[string]string{"AUTH_MODE": "hs256", "AUTH_HS256_SECRET": short}, "invalid AUTH_HS256_SECRET: the secret must be at least 32 bytes, got 23"},
		{map[string]string{"AUTH_MODE": "hs256", "AUTH_HS256_SECRET_FILE": file}, "invalid AUTH_HS256_SECRET_FILE: the secret must be at least 32 bytes, got 4"},
		{map[string]string{"AUTH_HS256_SECRET_FILE": "/no/such/file"}, "invalid AUTH_HS256_SECRET_FILE: open /no/such/file"},
		{map[string]string{"AUTH_HS256_SECRET": strings.Repeat("s", 32), "AUTH_HS256_SECRET_FILE": file}, "set either AUTH_HS256_SECRET or AUTH_HS256_SECRET_FILE, not both"},
		{map[string]string{"AUTH_MODE": "jwks"}, "invalid AUTH_JWKS_URL: AUTH_MODE=jwks needs"},
		{map[string]string{"AUTH_JWKS_URL": "https://idp.example/jwks"}, "invalid AUTH_ISSUER: AUTH_MODE=jwks needs the exact issuer"},
		{map[string]string{"AUTH_JWKS_URL": "https://idp.example/jwks", "AUTH_ISSUER": "x", "AUTH_HS256_SECRET": strings.Repeat("s", 32)}, "would mix symmetric and asymmetric algorithms"},
		{map[string]string{"AUTH_JWKS_URL": "ftp://idp.example/jwks"}, `invalid AUTH_JWKS_URL: must be an https:// URL, got "ftp://idp.example/jwks"`},
		{map[string]string{"AUTH_MODE": "dev", "AUTH_JWKS_URL": "https://idp.example/jwks"}, "invalid AUTH_JWKS_URL: it is used only with AUTH_MODE=jwks"},
		{map[string]string{"AUTH_MODE": "dev", "AUTH_HS256_SECRET": strings.Repeat("s", 32)}, "invalid AUTH_HS256_SECRET: it is used only with AUTH_MODE=hs256"},
		{map[string]string{"AUTH_CLOCK_LEEWAY": "1h"}, "invalid AUTH_CLOCK_LEEWAY: must be from 0s to 5m0s, got 1h0m0s"},
		{map[string]string{"AUTH_PUBLIC_READS": "maybe"}, `invalid AUTH_PUBLIC_READS: must be true or false, got "maybe"`},
		{map[string]string{"AUTH_JWKS_REFRESH": "0s"}, "invalid AUTH_JWKS_REFRESH: must be from 1s to 24h0m0s"},
		{map[string]string{"AUTH_JWKS_MIN_REFRESH": "1ms"}, "invalid AUTH_JWKS_MIN_REFRESH: must be from 100ms to 1h0m0s"},
		{map[string]string{"OPS_ADDR": "8081"}, `invalid OPS_ADDR: must be host:port or :port, got "8081"`},
		{map[string]string{"HTTP_ADDR": "127.0.0.1:"}, `invalid HTTP_ADDR: must be host:port or :port, got "127.0.0.1:"`},
		{map[string]string{"AUTH_JWKS_URL": "http://idp.example.com/jwks", "AUTH_ISSUER": "x"}, `invalid AUTH_JWKS_URL: must use https (plain http only on loopback), got "http://idp.example.com/jwks"`},
		{map[string]string{"AUTH_JWKS_URL": "http://127.0.0.1:9/jwks", "AUTH_ISSUER": "x"}, ""},
		{map[string]string{"RATE_LIMIT_USER": "10 per second"}, `invalid RATE_LIMIT_USER: must be off or like 10/s,burst=20`},
		{map[string]string{"RATE_LIMIT_IP": "0/s"}, `invalid RATE_LIMIT_IP: must be off or like 10/s,burst=20`},
		{map[string]string{"TRUSTED_PROXIES": "10.0.0.0/8,proxy"}, `invalid TRUSTED_PROXIES: "proxy" is neither an IP address nor a CIDR range`},
	} {
		_, err := parseEnv(tc.env)
		if tc.want == "" {
			assert.NoError(t, err, "%v", tc.env)
			continue
		}
		require.Error(t, err, "%v", tc.env)
		assert.Contains(t, err.Error(), tc.want, "%v", tc.env)
		assert.NotContains(t, err.Error(), short, "the secret is never echoed")
	}
}

// TestCLIToken: checkins token mints what the service accepts, for the user and scopes asked,
// and refuses what it cannot do, saying why.
func TestCLIToken(t *testing.T) {
	t.Parallel()
	secret := strings.Repeat("k", 40)
	env := map[string]string{"AUTH_MODE": "hs256", "AUTH_HS256_SECRET": secret}
	code, out, stderr := runCLI(t, env, "token", "--user", "42", "--scope", "checkins:ops:read", "--ttl", "10m", "--json")
	require.Equal(t, 0, code, stderr)
	var tok ports.Token
	require.NoError(t, json.Unmarshal([]byte(out), &tok))
	assert.Equal(t, int64(42), tok.UserID)
	assert.Equal(t, []string{ports.ScopeOpsRead}, tok.Scopes)
	assert.WithinDuration(t, time.Now().Add(10*time.Minute), tok.ExpiresAt, time.Minute)
	assert.NotContains(t, stderr+out, secret, "the secret is never printed")
	v, err := ports.NewHS256Verifier([]byte(secret), ports.VerifierConfig{Issuer: "checkins", Audience: "checkins"})
	require.NoError(t, err)
	p, err := v.Verify(context.Background(), tok.Token)
	require.NoError(t, err)
	assert.Equal(t, ports.Principal{UserID: 42, Scopes: []string{ports.ScopeOpsRead}}, p)

	code, out, _ = runCLI(t, env, "token", "--user", "7")
	require.Equal(t, 0, code)
	assert.Regexp(t, `^[\w-]+\.[\w-]+\.[\w-]+\n$`, out, "the token alone, for $(...)")
	code, out, _ = runCLI(t, map[string]string{"AUTH_MODE": "hs256", "AUTH_HS256_SECRET": secret, "AUTH_ISSUER": "me", "AUTH_AUDIENCE": "you"}, "token", "--user", "7", "--json")
	require.Equal(t, 0, code)
	require.NoError(t, json.Unmarshal([]byte(out), &tok))
	_, err = v.Verify(context.Background(), tok.Token)
	assert.ErrorIs(t, err, ports.ErrTokenWrongIssuer, "minted for the configured issuer")

	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{env, []string{"token"}, "--user must be an integer >= 1, got 0"},
		{env, []string{"token", "--user", "-3"}, "--user must be an integer >= 1, got -3"},
		{env, []string{"token", "--user", "1", "--scope", "admin"}, `unknown scope "admin": use checkins:ops or checkins:ops:read`},
		{env, []string{"token", "--user", "1", "--ttl", "0s"}, "--ttl must be from 1s to 720h0m0s, got 0s"},
		{env, []string{"token", "--user", "1", "--ttl", "1000h"}, "--ttl must be from 1s to 720h0m0s"},
		{env, []string{"token", "--user", "1", "--ttl", "500ms"}, "--ttl must be from 1s to 720h0m0s, got 500ms"}, // exp == iat
		{env, []string{"token", "--user", "1", "extra"}, "unexpected arguments: [extra]"},
		{map[string]string{"AUTH_JWKS_URL": "https://idp.example/jwks", "AUTH_ISSUER": "https://idp.example"}, []string{"token", "--user", "1"},
			"AUTH_MODE=jwks: tokens come from your identity provider (issuer https://idp.example)"},
		{map[string]string{"AUTH_MODE": "off"}, []string{"token", "--user", "1"}, "AUTH_MODE=off: the service takes no tokens"},
	} {
		code, out, stderr := runCLI(t, tc.env, tc.args...)
		assert.Equal(t, 1, code, "%v", tc.args)
		assert.Empty(t, out, "%v", tc.args)
		assert.Contains(t, stderr, tc.want, "%v", tc.args)
	}
}
