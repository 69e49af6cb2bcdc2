package ports_test

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/ports"
)

const testSecret = "ports-test-hs256-secret-0123456789abcdef"

// claims is a token's claims as the tests write them.
type claims map[string]any

func validClaims(user string) claims {
	now := time.Now()
	return claims{"iss": "checkins", "aud": []string{"checkins"}, "sub": user,
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
}

func (c claims) with(kv ...any) claims {
	out := claims{}
	for k, v := range c {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(out, kv[i].(string))
			continue
		}
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

func signHS(t testing.TB, c claims, secret []byte) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims(c)).SignedString(secret)
	require.NoError(t, err)
	return s
}

func hs256Policy(t testing.TB, leeway time.Duration) *ports.AuthPolicy {
	t.Helper()
	v, err := ports.NewHS256Verifier([]byte(testSecret), ports.VerifierConfig{Issuer: "checkins", Audience: "checkins", Leeway: leeway})
	require.NoError(t, err)
	return &ports.AuthPolicy{Verifier: v, PublicReads: true}
}

func bearer(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }

// challengeOf is the WWW-Authenticate value an invalid token gets for cause.
func challengeOf(cause error) string {
	return `Bearer realm="checkins", error="invalid_token", error_description="` + cause.Error() + `"`
}

// TestAuthTokens: every class of bad token gets exactly its status and WWW-Authenticate, never
// echoes the token, and writes nothing; a valid one checks in as its subject.
func TestAuthTokens(t *testing.T) {
	t.Parallel()
	e := newAPIEnvWith(t, apiOptions{http: ports.HTTPConfig{Auth: hs256Policy(t, 30*time.Second)}})
	secret := []byte(testSecret)
	good := validClaims("7")
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	pubDER, err := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	require.NoError(t, err)
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	noneTok, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims(good)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	require.NoError(t, err)
	rsTok, err := jwt.NewWithClaims(jwt.SigningMethodRS256, jwt.MapClaims(good)).SignedString(rsaKey)
	require.NoError(t, err)
	unauth := `Bearer realm="checkins"`
	body := `{"locationId":3,"starRating":4}`

	for _, tc := range []struct {
		name      string
		header    map[string]string
		query     string
		status    int
		code      string
		challenge string
	}{
		{"valid", bearer(signHS(t, good, secret)), "", http.StatusAccepted, "", ""},
		{"valid within the clock leeway", bearer(signHS(t, good.with("exp", time.Now().Add(-10*time.Second).Unix()), secret)), "", http.StatusAccepted, "", ""},
		{"lower-case scheme", map[string]string{"Authorization": "bearer " + signHS(t, good, secret)}, "", http.StatusAccepted, "", ""},
		{"none", nil, "", http.StatusUnauthorized, ports.CodeUnauthenticated, unauth},
		{"alg none", bearer(noneTok), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenAlgorithm)},
		{"RS256 where HS256 is configured", bearer(rsTok), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenAlgorithm)},
		{"HS256 signed with an RSA public key", bearer(signHS(t, good, pubPEM)), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenBadSignature)},
		{"expired", bearer(signHS(t, good.with("exp", time.Now().Add(-time.Minute).Unix()), secret)), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenExpired)},
		{"not yet valid", bearer(signHS(t, good.with("nbf", time.Now().Add(time.Minute).Unix()), secret)), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenNotYetValid)},
		{"wrong iss", bearer(signHS(t, good.with("iss", "checkins.evil"), secret)), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenWrongIssuer)},
		{"no iss", bearer(signHS(t, good.with("iss", nil), secret)), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenWrongIssuer)},
		{"wrong aud", bearer(signHS(t, good.with("aud", []string{"billing"}), secret)), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenWrongAudience)},
		{"no aud", bearer(signHS(t, good.with("aud", nil), secret)), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenWrongAudience)},
		{"aud containing ours", bearer(signHS(t, good.with("aud", []string{"billing", "checkins"}), secret)), "", http.StatusAccepted, "", ""},
		{"missing exp", bearer(signHS(t, good.with("exp", nil), secret)), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenNoExpiry)},
		{"bad signature", bearer(signHS(t, good, []byte("another-secret-of-at-least-32-bytes!!"))), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenBadSignature)},
		{"tampered payload", bearer(tamper(signHS(t, good, secret))), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenBadSignature)},
		{"non-numeric sub", bearer(signHS(t, good.with("sub", "alice"), secret)), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenBadSubject)},
		{"sub 0", bearer(signHS(t, good.with("sub", "0"), secret)), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenBadSubject)},
		{"sub with a leading zero", bearer(signHS(t, good.with("sub", "07"), secret)), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenBadSubject)},
		{"no sub", bearer(signHS(t, good.with("sub", nil), secret)), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenBadSubject)},
		{"token in the query string", nil, "?access_token=" + signHS(t, good, secret), http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenInQuery)},
		{"oversized token", bearer(strings.Repeat("a", ports.MaxTokenBytes+1)), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenTooLarge)},
		{"Basic scheme", map[string]string{"Authorization": "Basic dXNlcjpwYXNz"}, "", http.StatusUnauthorized, ports.CodeUnauthenticated, unauth},
		{"Bearer without a token", map[string]string{"Authorization": "Bearer "}, "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenMalformed)},
		{"garbage", bearer("not.a.jwt"), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenMalformed)},
		{"a comma in the token", bearer("abc,def"), "", http.StatusUnauthorized, ports.CodeInvalidToken, challengeOf(ports.ErrTokenMalformed)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events, reserved := e.xlen(t), len(e.idemKeys(t))
			resp := e.do(t, http.MethodPost, "/checkins"+tc.query, "application/json", strings.NewReader(body), tc.header)
			require.Equal(t, tc.status, resp.status, "%s", resp.body)
			assert.Equal(t, tc.challenge, resp.header.Get("WWW-Authenticate"))
			if tc.status == http.StatusAccepted {
				assert.Equal(t, "7", fmt.Sprint(resp.json(t)["userId"]), "the check-in is the token subject's")
				return
			}
			ae := resp.apiError(t)
			assert.Equal(t, tc.code, ae.Code)
			if tok := tc.header["Authorization"]; len(tok) > 20 {
				assert.NotContains(t, string(resp.body), tok[len(tok)-20:], "the token is never echoed")
			}
			assert.Equal(t, events, e.xlen(t), "a refused request writes nothing")
			assert.Len(t, e.idemKeys(t), reserved, "a refused request reserves nothing")
		})
	}
}

// tamper makes a signed token speak for user 1 instead, keeping its signature.
func tamper(tok string) string {
	parts := strings.Split(tok, ".")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		panic(err)
	}
	payload = bytes.Replace(payload, []byte(`"sub":"7"`), []byte(`"sub":"1"`), 1)
	parts[1] = base64.RawURLEncoding.EncodeToString(payload)
	return strings.Join(parts, ".")
}

// TestAuthChecksInOnlyAsYourself: the body's userId may be left out (it is the token's), and
// naming another user is 403 with field userId, before anything is reserved or written.
func TestAuthChecksInOnlyAsYourself(t *testing.T) {
	t.Parallel()
	e := newAPIEnvWith(t, apiOptions{http: ports.HTTPConfig{Auth: hs256Policy(t, 0)}})
	tok := bearer(signHS(t, validClaims("5"), []byte(testSecret)))

	resp := e.post(t, `{"userId":6,"locationId":1,"starRating":2,"checkinId":"mine"}`, tok)
	require.Equal(t, http.StatusForbidden, resp.status, "%s", resp.body)
	ae := resp.apiError(t)
	assert.Equal(t, ports.CodeForbidden, ae.Code)
	assert.Equal(t, "userId", ae.Field)
	assert.Empty(t, resp.header.Get("WWW-Authenticate"), "a valid token: nothing to challenge")
	assert.Zero(t, e.xlen(t))
	assert.Empty(t, e.idemKeys(t), "refused before the idempotency reservation")

	resp = e.post(t, `{"userId":0,"locationId":1,"starRating":2}`, tok)
	require.Equal(t, http.StatusBadRequest, resp.status, "nobody's id is a validation error")
	assert.Equal(t, "userId", resp.apiError(t).Field)

	resp = e.post(t, `{"locationId":1,"starRating":2,"checkinId":"mine"}`, tok)
	require.Equal(t, http.StatusAccepted, resp.status, "%s", resp.body)
	assert.Equal(t, "5", fmt.Sprint(resp.json(t)["userId"]))
	resp = e.post(t, `{"userId":5,"locationId":1,"starRating":2,"checkinId":"mine"}`, tok)
	require.Equal(t, http.StatusAccepted, resp.status, "naming yourself is the same request as leaving userId out")
	assert.Equal(t, "true", resp.header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(1), e.xlen(t))

	// Another user may use the same checkinId: it is theirs, neither a replay nor a conflict.
	other := bearer(signHS(t, validClaims("6"), []byte(testSecret)))
	resp = e.post(t, `{"locationId":9,"starRating":1,"checkinId":"mine"}`, other)
	require.Equal(t, http.StatusAccepted, resp.status, "%s", resp.body)
	assert.Empty(t, resp.header.Get("Idempotent-Replayed"))
	assert.Equal(t, "6", fmt.Sprint(resp.json(t)["userId"]))
	assert.Equal(t, int64(2), e.xlen(t))
}

// TestAuthReads: with public reads, GET query routes need no token, but a token sent must be
// valid; without them, every read needs a valid token. Health checks never need one.
func TestAuthReads(t *testing.T) {
	t.Parallel()
	public := newAPIEnvWith(t, apiOptions{http: ports.HTTPConfig{Auth: hs256Policy(t, 0)}})
	closed := hs256Policy(t, 0)
	closed.PublicReads = false
	private := newAPIEnvWith(t, apiOptions{http: ports.HTTPConfig{Auth: closed}})
	good := bearer(signHS(t, validClaims("1"), []byte(testSecret)))
	expired := bearer(signHS(t, validClaims("1").with("exp", time.Now().Add(-time.Hour).Unix()), []byte(testSecret)))
	for _, path := range []string{"/users/1", "/locations/1", "/checkins/latest", "/checkins"} {
		assert.NotEqual(t, http.StatusUnauthorized, public.get(t, path).status, "public read %s", path)
		assert.Equal(t, http.StatusUnauthorized, public.do(t, http.MethodGet, path, "", nil, expired).status, "public read %s with an expired token", path)
		resp := private.get(t, path)
		assert.Equal(t, http.StatusUnauthorized, resp.status, "private read %s", path)
		assert.Equal(t, `Bearer realm="checkins"`, resp.header.Get("WWW-Authenticate"))
		assert.NotEqual(t, http.StatusUnauthorized, private.do(t, http.MethodGet, path, "", nil, good).status, "private read %s with a token", path)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		assert.Equal(t, http.StatusOK, private.get(t, path).status, path)
	}
	// No route, and the methods of a route, are the contract's answers whatever the token.
	assert.Equal(t, http.StatusNotFound, private.do(t, http.MethodPut, "/nope", "", nil, nil).status, "no route: 404, not 401")
	assert.Equal(t, http.StatusNotFound, private.get(t, "/no/such/route").status)
	resp := private.do(t, http.MethodOptions, "/checkins", "", nil, nil)
	assert.Equal(t, http.StatusNoContent, resp.status, "OPTIONS without a token: %s", resp.body)
	assert.Contains(t, resp.header.Get("Allow"), "POST")
	resp = private.do(t, http.MethodDelete, "/checkins", "", nil, nil)
	assert.Equal(t, http.StatusMethodNotAllowed, resp.status, "a method the route does not have, without a token: %s", resp.body)
	assert.Contains(t, resp.header.Get("Allow"), "POST")
	assert.Equal(t, http.StatusMethodNotAllowed, private.do(t, http.MethodPatch, "/users/1", "", nil, nil).status)
	assert.Equal(t, http.StatusUnauthorized, private.do(t, http.MethodPost, "/checkins", "application/json",
		strings.NewReader(`{"locationId":1,"starRating":1}`), nil).status, "the route itself still needs one")
}

// TestVerifiedTokensEndAtTheirExpiry: a verified token is remembered (verified once), but never
// past its exp plus the leeway, however recently it was checked.
func TestVerifiedTokensEndAtTheirExpiry(t *testing.T) {
	t.Parallel()
	now := time.Now()
	clock := func() time.Time { return now }
	v, err := ports.NewHS256Verifier([]byte(testSecret),
		ports.VerifierConfig{Issuer: "checkins", Audience: "checkins", Leeway: 2 * time.Second, Now: clock})
	require.NoError(t, err)
	tok := signHS(t, validClaims("7").with("exp", now.Add(10*time.Second).Unix()), []byte(testSecret))
	ctx := t.Context()

	p, err := v.Verify(ctx, tok)
	require.NoError(t, err)
	assert.Equal(t, int64(7), p.UserID)
	now = now.Add(11 * time.Second) // past exp, within the leeway
	p, err = v.Verify(ctx, tok)
	require.NoError(t, err)
	assert.Equal(t, int64(7), p.UserID)
	now = now.Add(2 * time.Second) // past exp + leeway: refused although verified 13 s ago
	_, err = v.Verify(ctx, tok)
	assert.ErrorIs(t, err, ports.ErrTokenExpired)

	// A refused token is not remembered as good, and a good one with another signature is not
	// taken for it.
	bad := tok[:len(tok)-2] + "AA"
	_, err = v.Verify(ctx, bad)
	assert.ErrorIs(t, err, ports.ErrTokenBadSignature)
}

// TestReadyzReasonsAreForOperators: a service that is not ready says why (Redis's address, a
// stalled group) only to a caller with an ops scope on the public listener; anyone else gets
// the 503 and where to look. It told any anonymous caller.
func TestReadyzReasonsAreForOperators(t *testing.T) {
	t.Parallel()
	e := newAPIEnvWith(t, apiOptions{http: ports.HTTPConfig{Auth: hs256Policy(t, 0)}})
	e.redis.Kill()
	reason := func(header map[string]string) string {
		t.Helper()
		resp := e.do(t, http.MethodGet, "/readyz", "", nil, header)
		require.Equal(t, http.StatusServiceUnavailable, resp.status, "%s", resp.body)
		return fmt.Sprint(resp.json(t)["reason"])
	}
	assert.Equal(t, ports.ReadyReasonWithheld, reason(nil), "anonymous")
	assert.Equal(t, ports.ReadyReasonWithheld, reason(bearer(signHS(t, validClaims("1"), []byte(testSecret)))), "a user's token")
	assert.Equal(t, ports.ReadyReasonWithheld, reason(map[string]string{"Authorization": "Bearer nonsense"}), "a bad token: no 401 for a probe")
	ops := reason(bearer(signHS(t, validClaims("1").with("scope", ports.ScopeOpsRead), []byte(testSecret))))
	assert.NotEqual(t, ports.ReadyReasonWithheld, ops, "an operator's token")
	assert.NotEmpty(t, ops)
}
