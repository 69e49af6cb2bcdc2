package ports_test

import (
	"context"
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
