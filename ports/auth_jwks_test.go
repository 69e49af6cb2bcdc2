package ports_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/ports"
)

// jwksServer is an identity provider's JWK Set endpoint the test controls.
type jwksServer struct {
	*httptest.Server
	mu      sync.Mutex
	body    []byte
	chunked bool          // send without Content-Length
	hang    chan struct{} // while set, fetches block until it is closed
	fetches atomic.Int64
}

func newJWKSServer(t *testing.T) *jwksServer {
	s := &jwksServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fetches.Add(1)
		s.mu.Lock()
		body, chunked, hang := s.body, s.chunked, s.hang
		s.mu.Unlock()
		if hang != nil {
			select {
			case <-hang:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		if chunked {
			w.(http.Flusher).Flush() // headers out first: no Content-Length
		}
		_, _ = w.Write(body)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) serve(keys ...*rsaKID) {
	var set struct {
		Keys []map[string]string `json:"keys"`
	}
	for _, k := range keys {
		set.Keys = append(set.Keys, map[string]string{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": k.kid,
			"n": base64.RawURLEncoding.EncodeToString(k.key.N.Bytes()),
			"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(k.key.E)).Bytes())})
	}
	b, _ := json.Marshal(set)
	s.mu.Lock()
	s.body = b
	s.mu.Unlock()
}

type rsaKID struct {
	kid string
	key *rsa.PrivateKey
}

func newRSAKID(t *testing.T, kid string) *rsaKID {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	return &rsaKID{kid: kid, key: k}
}

func (k *rsaKID) sign(t *testing.T, c claims) string {
	tok := jwt.NewWithClaims(jwt.SigningMethodRS256, jwt.MapClaims(c))
	tok.Header["kid"] = k.kid
	s, err := tok.SignedString(k.key)
	require.NoError(t, err)
	return s
}

func idpClaims(user string) claims { return validClaims(user).with("iss", "https://idp.example") }

func newJWKSVerifier(t *testing.T, url string, refresh, minRefresh time.Duration, log *slog.Logger) *ports.Verifier {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	v, err := ports.NewJWKSVerifier(ctx, ports.JWKSConfig{URL: url,
		VerifierConfig:  ports.VerifierConfig{Issuer: "https://idp.example", Audience: "checkins"},
		RefreshInterval: refresh, MinRefreshInterval: minRefresh, FetchTimeout: 2 * time.Second, Logger: log})
	require.NoError(t, err)
	return v
}

// TestJWKSKeyRotation: a token signed with a key the set gained since the last fetch is
// accepted (an unknown kid fetches the set again); a key the set dropped is no longer accepted.
func TestJWKSKeyRotation(t *testing.T) {
	t.Parallel()
	idp := newJWKSServer(t)
	k1, k2 := newRSAKID(t, "k1"), newRSAKID(t, "k2")
	idp.serve(k1)
	v := newJWKSVerifier(t, idp.URL, time.Hour, 50*time.Millisecond, nil)
	ctx := context.Background()

	p, err := v.Verify(ctx, k1.sign(t, idpClaims("3")))
	require.NoError(t, err)
	assert.Equal(t, int64(3), p.UserID)

	idp.serve(k2) // rotation: k1 retired, k2 in
	require.Eventually(t, func() bool {
		_, err := v.Verify(ctx, k2.sign(t, idpClaims("3")))
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "a token of the new key is accepted without a restart")
	_, err = v.Verify(ctx, k1.sign(t, idpClaims("3")))
	assert.ErrorIs(t, err, ports.ErrTokenUnknownKey, "the retired key is gone")

	// Asymmetric configuration, HS256 token made with the public key as secret: refused by
	// algorithm before any key is looked at.
	pub := []byte(fmt.Sprint(k2.key.PublicKey.N))
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims(idpClaims("3")))
	hs.Header["kid"] = "k2"
	tok, err := hs.SignedString(pub)
	require.NoError(t, err)
	_, err = v.Verify(ctx, tok)
	assert.ErrorIs(t, err, ports.ErrTokenAlgorithm)
}

// TestJWKSPeriodicRefresh: the set is fetched again on its own, without any unknown kid.
func TestJWKSPeriodicRefresh(t *testing.T) {
	t.Parallel()
	idp := newJWKSServer(t)
	idp.serve(newRSAKID(t, "k1"))
	newJWKSVerifier(t, idp.URL, 100*time.Millisecond, time.Hour, nil)
	assert.Eventually(t, func() bool { return idp.fetches.Load() >= 3 }, 10*time.Second, 20*time.Millisecond)
}

// TestJWKSFloodOfUnknownKids: many tokens with random kids cost at most one fetch per
// MinRefreshInterval, and each is refused (not left waiting); a fetch that hangs holds a
// request no longer than its own deadline.
func TestJWKSFloodOfUnknownKids(t *testing.T) {
	t.Parallel()
	idp := newJWKSServer(t)
	k1 := newRSAKID(t, "k1")
	idp.serve(k1)
	v := newJWKSVerifier(t, idp.URL, time.Hour, time.Hour, nil)
	before := idp.fetches.Load()

	var wg sync.WaitGroup
	var refused atomic.Int64
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stranger := &rsaKID{kid: fmt.Sprintf("random-%d", i), key: k1.key}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := v.Verify(ctx, stranger.sign(t, idpClaims("3"))); err != nil {
				assert.ErrorIs(t, err, ports.ErrTokenUnknownKey)
				refused.Add(1)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(300), refused.Load())
	assert.LessOrEqual(t, idp.fetches.Load()-before, int64(1), "one refresh for the whole flood")
	_, err := v.Verify(context.Background(), k1.sign(t, idpClaims("3")))
	assert.NoError(t, err, "known keys keep working during and after the flood")

	// The identity provider hangs: a request with a new kid gives up at its own deadline.
	idp2 := newJWKSServer(t)
	idp2.serve(k1)
	v2 := newJWKSVerifier(t, idp2.URL, time.Hour, 10*time.Millisecond, nil)
	idp2.mu.Lock()
	idp2.hang = make(chan struct{})
	idp2.mu.Unlock()
	t.Cleanup(func() { close(idp2.hang) })
	time.Sleep(20 * time.Millisecond) // past the min refresh interval: a refresh is allowed
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := v2.Verify(ctx, (&rsaKID{kid: "new", key: k1.key}).sign(t, idpClaims("3")))
		done <- err
	}()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ports.ErrTokenUnknownKey)
	case <-time.After(30 * time.Second):
		t.Fatal("a request waited for a hanging JWKS fetch past its deadline")
	}
}

// TestJWKSOversizedKeySet: a key set larger than the cap is refused (with and without a
// Content-Length), logged, and no key of it is trusted.
func TestJWKSOversizedKeySet(t *testing.T) {
	t.Parallel()
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			t.Parallel()
			idp := newJWKSServer(t)
			k1 := newRSAKID(t, "k1")
			idp.serve(k1)
			idp.mu.Lock()
			// The real key first, then padding: a reader that stopped at the cap would have it.
			idp.body = append(idp.body[:len(idp.body)-2], []byte(`,{"kty":"oct","kid":"pad","k":"`+strings.Repeat("A", ports.MaxJWKSBytes)+`"}]}`)...)
			idp.chunked = chunked
			idp.mu.Unlock()
			var logs syncBuffer
			v := newJWKSVerifier(t, idp.URL, time.Hour, time.Hour, slog.New(slog.NewTextHandler(&logs, nil)))
			_, err := v.Verify(context.Background(), k1.sign(t, idpClaims("3")))
			assert.ErrorIs(t, err, ports.ErrTokenUnknownKey)
			assert.Positive(t, logs.count("larger than"), "the refused fetch is logged")
		})
	}
}

// TestJWKSURLMustBeHTTPS: plain http only to this machine.
func TestJWKSURLMustBeHTTPS(t *testing.T) {
	t.Parallel()
	_, err := ports.NewJWKSVerifier(context.Background(), ports.JWKSConfig{URL: "http://idp.example/jwks",
		VerifierConfig:  ports.VerifierConfig{Issuer: "https://idp.example", Audience: "checkins"},
		RefreshInterval: time.Hour, MinRefreshInterval: time.Minute, FetchTimeout: time.Second})
	assert.ErrorContains(t, err, "https")
}

// TestJWKSRefreshOutlivesARequestThatGaveUp: a request with an unknown kid whose client hangs up
// (or whose deadline ends) while the key set is being fetched gives up at once, but the fetch it
// started still completes: a key the identity provider has just published is then accepted,
// instead of refused until MinRefreshInterval allows another fetch.
func TestJWKSRefreshOutlivesARequestThatGaveUp(t *testing.T) {
	t.Parallel()
	idp := newJWKSServer(t)
	k1, k2, stranger := newRSAKID(t, "k1"), newRSAKID(t, "k2"), newRSAKID(t, "stranger")
	idp.serve(k1)
	v := newJWKSVerifier(t, idp.URL, time.Hour, 30*time.Second, nil)
	_, err := v.Verify(context.Background(), k1.sign(t, idpClaims("3")))
	require.NoError(t, err)

	idp.serve(k1, k2) // the identity provider publishes k2
	hang := make(chan struct{})
	idp.mu.Lock()
	idp.hang = hang // the fetch takes a while
	idp.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	start := time.Now()
	_, err = v.Verify(ctx, stranger.sign(t, idpClaims("9")))
	cancel()
	assert.ErrorIs(t, err, ports.ErrTokenUnknownKey)
	assert.Less(t, time.Since(start), time.Second, "the request gave up at its own deadline")
	idp.mu.Lock()
	idp.hang = nil
	idp.mu.Unlock()
	close(hang)

	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := v.Verify(context.Background(), k2.sign(t, idpClaims("3")))
		assert.NoError(c, err, "the refresh the first request started went on without it")
	}, 10*time.Second, 20*time.Millisecond)
}
