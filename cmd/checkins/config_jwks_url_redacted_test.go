package main

import (
	"flag"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestJWKSURLPasswordNotInTheStartError: 1697faf redacts AUTH_JWKS_URL's password in the
// fetch log and "in the start error", but the setting's own checks (and NewJWKSVerifier's) quote
// the URL whole with %q: a URL with user info refused for plain http off loopback, or for a
// scheme typo, prints the password in the start error (stderr, the deploy's log).
func TestJWKSURLPasswordNotInTheStartError(t *testing.T) {
	t.Parallel()
	const password = "s3cr3t-jwks-pw"
	for _, u := range []string{
		"http://gateway:" + password + "@idp.example/.well-known/jwks.json",
		"htps://gateway:" + password + "@idp.example/.well-known/jwks.json",
	} {
		env := map[string]string{"AUTH_JWKS_URL": u, "AUTH_ISSUER": "https://idp.example/"}
		_, _, err := parseConfig(flag.NewFlagSet("jwks", flag.ContinueOnError), nil, func(k string) string { return env[k] })
		require.Error(t, err, u)
		assert.NotContains(t, err.Error(), password, "the start error: %v", err)
	}
}
