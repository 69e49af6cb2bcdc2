package ports_test

// Security review: a JWK Set URL that carries credentials (https://user:password@idp/...; some
// gateways in front of an identity provider want them) has them written to the log in clear by
// every failed fetch ("JWKS fetch failed", field url), while REDIS_URL's password is redacted
// everywhere it is logged.

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/ports"
)

func TestJWKSFetchFailureDoesNotLogTheURLPassword(t *testing.T) {
	t.Parallel()
	idp := newJWKSServer(t)
	k1 := newRSAKID(t, "k1")
	idp.serve(k1)
	idp.mu.Lock()
	idp.body = append(idp.body[:len(idp.body)-2], []byte(`,{"kty":"oct","kid":"pad","k":"`+strings.Repeat("A", ports.MaxJWKSBytes)+`"}]}`)...)
	idp.mu.Unlock()
	const password = "s3cr3t-jwks-pw"
	url := strings.Replace(idp.URL, "http://", "http://gateway:"+password+"@", 1)
	var logs syncBuffer
	v := newJWKSVerifier(t, url, time.Hour, time.Hour, slog.New(slog.NewTextHandler(&logs, nil)))
	_, err := v.Verify(context.Background(), k1.sign(t, idpClaims("3")))
	require.ErrorIs(t, err, ports.ErrTokenUnknownKey)
	require.Positive(t, logs.count("JWKS fetch failed"), "the failed fetch is logged")
	assert.Zero(t, logs.count(password), "the JWKS URL's password is in the log")
}
