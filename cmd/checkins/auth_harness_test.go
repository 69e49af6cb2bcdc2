package main

// How the tests of this package get tokens: the services they start run with AUTH_MODE=hs256
// and testAuthSecret (unless a test chooses another mode), and clients made by authedClient add
// a token to requests that carry none and need one: for POST /checkins one of the body's userId
// (user 1 when it names none or an invalid one), for /ops and /metrics one with scope
// checkins:ops. Tests of authentication itself use plain clients.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/ports"
)

// testAuthSecret is the HS256 secret of the services tests start.
const testAuthSecret = "checkins-test-suite-hs256-secret-0123456789"

// testStateDir is the STATE_DIR of everything the tests run (set by TestMain), so no test reads
// or writes the state directory of the person running them.
var testStateDir = filepath.Join(os.TempDir(), "checkins-test-state")

// withTestAuth fills the access settings a test did not choose: hs256 with the test secret, the
// ops routes on the public port (HTTP_ADDR 127.0.0.1:0 is a fresh port per service), and no
// rate limits (the tests of limits set them).
func withTestAuth(env map[string]string) map[string]string {
	defaults := map[string]string{"AUTH_MODE": AuthHS256, "RATE_LIMIT_USER": "off", "RATE_LIMIT_IP": "off", "STATE_DIR": testStateDir}
	for k, v := range defaults {
		if _, ok := env[k]; !ok {
			env[k] = v
		}
	}
	if env["AUTH_MODE"] == AuthHS256 && env["AUTH_HS256_SECRET"] == "" && env["AUTH_HS256_SECRET_FILE"] == "" {
		env["AUTH_HS256_SECRET"] = testAuthSecret
	}
	if _, ok := env["OPS_ADDR"]; !ok {
		env["OPS_ADDR"] = env["HTTP_ADDR"]
	}
	return env
}

var (
	testIssuerOnce sync.Once
	testIssuer     *ports.TokenIssuer
	testTokens     sync.Map // "user scopes" -> token
)

// testToken is a token the test services accept, for user with scopes.
func testToken(user int64, scopes ...string) string {
	testIssuerOnce.Do(func() {
		var err error
		if testIssuer, err = ports.NewTokenIssuer([]byte(testAuthSecret), defaultIssuer, defaultIssuer); err != nil {
			panic(err)
		}
	})
	key := fmt.Sprint(user, scopes)
	if t, ok := testTokens.Load(key); ok {
		return t.(string)
	}
	t, err := testIssuer.Mint(user, scopes, 6*time.Hour)
	if err != nil {
		panic(err)
	}
	testTokens.Store(key, t.Token)
	return t.Token
}

// shortLivedToken is a token of the test secret for user that expires after ttl (not cached).
func shortLivedToken(t *testing.T, user int64, ttl time.Duration, scopes ...string) string {
	t.Helper()
	issuer, err := ports.NewTokenIssuer([]byte(testAuthSecret), defaultIssuer, defaultIssuer)
	require.NoError(t, err)
	tok, err := issuer.Mint(user, scopes, ttl)
	require.NoError(t, err)
	return tok.Token
}

// authTransport adds a token to requests without an Authorization header: an ops one to the ops
// routes and to /readyz (whose reasons are for operators), and to writes.
type authTransport struct{ next http.RoundTripper }

func (a authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	ops := r.URL.Path == "/metrics" || r.URL.Path == "/readyz" || strings.HasPrefix(r.URL.Path, "/ops")
	if r.Header.Get("Authorization") != "" || (!ops && r.Method == http.MethodGet) {
		return a.next.RoundTrip(r) // reads are public: they get no token they did not ask for
	}
	user := int64(1)
	if r.Method == http.MethodPost && r.URL.Path == "/checkins" && r.GetBody != nil {
		if body, err := r.GetBody(); err == nil {
			var in struct {
				UserID *int64 `json:"userId"`
			}
			b, _ := io.ReadAll(body)
			if json.NewDecoder(bytes.NewReader(b)).Decode(&in) == nil && in.UserID != nil && *in.UserID >= 1 {
				user = *in.UserID
			}
		}
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+testToken(user, ports.ScopeOps))
	return a.next.RoundTrip(r)
}

// authedClient is an HTTP client whose requests carry a test token unless they set their own.
func authedClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: contract.Transport(authTransport{next: http.DefaultTransport})}
}
