package main

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTokenJSONExpiryIsTheTokens: `checkins token --ttl 1500ms --json` reports an
// expiresAt half a second after the token's own exp claim (exp is whole seconds, truncated):
// the JSON says the token is valid when the service already refuses it as expired.
func TestTokenJSONExpiryIsTheTokens(t *testing.T) {
	t.Parallel()
	code, out, stderr := runCLI(t, map[string]string{"AUTH_MODE": "hs256", "AUTH_HS256_SECRET": testAuthSecret}, "token", "--user", "3", "--ttl", "1500ms", "--json")
	require.Equal(t, 0, code, stderr)
	var tok struct {
		Token     string    `json:"token"`
		ExpiresAt time.Time `json:"expiresAt"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &tok), out)
	parts := strings.Split(tok.Token, ".")
	require.Len(t, parts, 3)
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	var claims struct {
		Exp int64 `json:"exp"`
	}
	require.NoError(t, json.Unmarshal(raw, &claims))
	assert.Equal(t, time.Unix(claims.Exp, 0).UTC(), tok.ExpiresAt.UTC(), "expiresAt in --json is the token's exp")
}

// TestTokenTTLUnderASecondIsRefused: a ttl under a second would give a token expired at once.
func TestTokenTTLUnderASecondIsRefused(t *testing.T) {
	t.Parallel()
	code, out, stderr := runCLI(t, map[string]string{"AUTH_MODE": "hs256", "AUTH_HS256_SECRET": testAuthSecret}, "token", "--user", "3", "--ttl", "500ms")
	assert.NotEqual(t, 0, code, out)
	assert.Contains(t, stderr, "--ttl must be from 1s")
}
