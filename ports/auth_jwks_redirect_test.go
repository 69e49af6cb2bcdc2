package ports_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/ports"
)

// nonLoopbackIP is an address of this machine that is not loopback ("" when it has none).
func nonLoopbackIP(t *testing.T) string {
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

// TestJWKSRedirectToPlainHTTPIsRefused: AUTH_JWKS_URL must be https (plain http only on
// loopback), so that nobody on the network can substitute the signing keys. That was checked on
// the configured URL only: the fetch followed redirects, to plain http on another machine too,
// and trusted the keys it found there, so whoever could answer that plain-http request (anyone on
// the path) signed tokens the API accepted: here a check-in as user 1 with scope checkins:ops
// (found by a review). A redirect is now held to the URL's rule.
func TestJWKSRedirectToPlainHTTPIsRefused(t *testing.T) {
	t.Parallel()
	ip := nonLoopbackIP(t)
	if ip == "" {
		t.Skip("no non-loopback address to serve plain http on")
	}
	attacker := newRSAKID(t, "evil")
	plain := &jwksServer{}
	plain.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plain.fetches.Add(1)
		plain.mu.Lock()
		body := plain.body
		plain.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	ln, err := net.Listen("tcp", ip+":0")
	require.NoError(t, err)
	plain.Listener = ln
	plain.Start()
	t.Cleanup(plain.Close)
	plain.serve(attacker)
	require.False(t, strings.HasPrefix(plain.URL, "http://127."), "the plain server is not on loopback: %s", plain.URL)

	idp := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plain.URL+"/jwks", http.StatusFound)
	}))
	t.Cleanup(idp.Close)

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	v, err := ports.NewJWKSVerifier(ctx, ports.JWKSConfig{URL: idp.URL + "/.well-known/jwks.json",
		VerifierConfig:  ports.VerifierConfig{Issuer: "https://idp.example", Audience: "checkins"},
		RefreshInterval: time.Hour, MinRefreshInterval: time.Hour, FetchTimeout: 2 * time.Second,
		Client: idp.Client()})
	require.NoError(t, err, "an https AUTH_JWKS_URL is accepted")

	tok := attacker.sign(t, idpClaims("1").with("scope", ports.ScopeOps))
	_, verr := v.Verify(context.Background(), tok)

	e := newAPIEnvWith(t, apiOptions{http: ports.HTTPConfig{Auth: &ports.AuthPolicy{Verifier: v, PublicReads: true}}})
	resp := e.post(t, `{"locationId":3,"starRating":4}`, bearer(tok))

	assert.Error(t, verr, "keys fetched over plain http from %s (after a redirect) are trusted; fetches there: %d",
		plain.URL, plain.fetches.Load())
	assert.Equal(t, http.StatusUnauthorized, resp.status, "a token signed with a key served over plain http checks in: %s", resp.body)
}

// TestJWKSKeyForEncryptionDoesNotVerify: a key the provider publishes for encryption ("use":
// "enc") is not one it signs with (RFC 7517, section 4.2); it verified tokens all the same
// (suspected by a review). Now only keys for signatures, or keys that say nothing of their use,
// verify a token.
func TestJWKSKeyForEncryptionDoesNotVerify(t *testing.T) {
	t.Parallel()
	idp := newJWKSServer(t)
	enc, none, sig := newRSAKID(t, "enc1"), newRSAKID(t, "none1"), newRSAKID(t, "sig1")
	jwk := func(k *rsaKID, use string) map[string]string {
		m := map[string]string{"kty": "RSA", "alg": "RS256", "kid": k.kid,
			"n": base64.RawURLEncoding.EncodeToString(k.key.N.Bytes()),
			"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(k.key.E)).Bytes())}
		if use != "" {
			m["use"] = use
		}
		return m
	}
	body, err := json.Marshal(map[string]any{"keys": []map[string]string{jwk(enc, "enc"), jwk(none, ""), jwk(sig, "sig")}})
	require.NoError(t, err)
	idp.mu.Lock()
	idp.body = body
	idp.mu.Unlock()
	v := newJWKSVerifier(t, idp.URL, time.Hour, time.Hour, nil)
	ctx := context.Background()
	_, err = v.Verify(ctx, enc.sign(t, idpClaims("1")))
	assert.Error(t, err, "a key for encryption verifies no token")
	_, err = v.Verify(ctx, none.sign(t, idpClaims("1")))
	assert.NoError(t, err, "a key that says nothing of its use does")
	_, err = v.Verify(ctx, sig.sign(t, idpClaims("1")))
	assert.NoError(t, err, "a key for signatures does")
}
