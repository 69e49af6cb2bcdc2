package ports

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"
)

// MaxJWKSBytes caps a JWKS response: a key set is a few KiB; anything far larger is refused
// rather than read into memory.
const MaxJWKSBytes = 256 << 10

// JWKSConfig configures verification against a JWK Set URL.
type JWKSConfig struct {
	URL string
	VerifierConfig
	// RefreshInterval: the key set is fetched again this often (rotation without restarts).
	RefreshInterval time.Duration
	// MinRefreshInterval: a token with an unknown kid fetches the set again at most this often,
	// so a flood of random kids costs at most one fetch per interval.
	MinRefreshInterval time.Duration
	// FetchTimeout bounds one fetch (and how long a request with an unknown kid may wait for it;
	// its own deadline bounds that too).
	FetchTimeout time.Duration
	MaxBytes     int64        // 0: MaxJWKSBytes
	Client       *http.Client // nil: a client of its own
	Logger       *slog.Logger
}

// maxJWKSRedirects bounds the redirects a JWKS fetch follows (net/http's own default).
const maxJWKSRedirects = 10

// NewJWKSVerifier verifies tokens signed with asymmetric keys from cfg.URL. It fetches the set
// once (a failure is logged, not fatal: tokens are refused as signed with an unknown key until a
// fetch succeeds), then refreshes it in the background until ctx ends.
func NewJWKSVerifier(ctx context.Context, cfg JWKSConfig) (*Verifier, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("JWKS URL must be an https:// URL, got %q", redactedURL(cfg.URL))
	}
	if u.Scheme == "http" && !isLoopbackHost(u.Hostname()) {
		return nil, fmt.Errorf("JWKS URL must use https (plain http only on loopback), got %q", u.Redacted())
	}
	if cfg.RefreshInterval <= 0 || cfg.MinRefreshInterval <= 0 || cfg.FetchTimeout <= 0 {
		return nil, errors.New("ports: JWKS refresh intervals and fetch timeout must be positive")
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = MaxJWKSBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	client := cfg.Client
	if client == nil {
		client = &http.Client{}
	}
	capped := *client
	capped.Timeout = cfg.FetchTimeout
	base := capped.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	capped.Transport = cappedTransport{next: base, max: cfg.MaxBytes}
	// A redirect must keep to the rule the URL is held to: followed to plain http on another
	// machine, whoever answers it serves the keys tokens are checked with (found by a review).
	capped.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= maxJWKSRedirects {
			return fmt.Errorf("JWKS fetch: more than %d redirects", maxJWKSRedirects)
		}
		if req.URL.Scheme != "https" && !(req.URL.Scheme == "http" && isLoopbackHost(req.URL.Hostname())) {
			return fmt.Errorf("JWKS fetch: refused a redirect to %q: keys come over https only (plain http only on loopback)", req.URL.Redacted())
		}
		if client.CheckRedirect != nil {
			return client.CheckRedirect(req, via)
		}
		return nil
	}
	noErrFirst := true
	kf, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{cfg.URL}, keyfunc.Override{
		Client:                    &capped,
		HTTPTimeout:               cfg.FetchTimeout,
		NoErrorReturnFirstHTTPReq: &noErrFirst,
		RefreshInterval:           cfg.RefreshInterval,
		RefreshUnknownKID:         rate.NewLimiter(rate.Every(cfg.MinRefreshInterval), 1),
		// jwkset bounds the limiter's wait and the refresh that follows together by this: room
		// for a wait of up to one fetch and a whole fetch after it (the client's Timeout bounds
		// the fetch itself). When the limiter has no fetch to give within it, the lookup fails at
		// once; a request never waits past its own deadline (below).
		RateLimitWaitMax: 2 * cfg.FetchTimeout,
		RefreshErrorHandlerFunc: func(u string) func(context.Context, error) {
			return func(ctx context.Context, err error) {
				cfg.Logger.WarnContext(ctx, "JWKS fetch failed", "url", redactedURL(u), "error", err)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("JWKS %s: %w", redactedURL(cfg.URL), err)
	}
	// Only keys for signatures ("use": "sig", or none given) verify a token: a key the provider
	// publishes for encryption is not one it signs with (RFC 7517, section 4.2).
	if kf, err = keyfunc.New(keyfunc.Options{Ctx: ctx, Storage: kf.Storage(), UseWhitelist: []jwkset.USE{jwkset.UseSig, ""}}); err != nil {
		return nil, fmt.Errorf("JWKS %s: %w", redactedURL(cfg.URL), err)
	}
	// The key lookup (and the refresh an unknown kid triggers) runs on a context of its own,
	// bounded by RateLimitWaitMax inside jwkset, and the request waits for it only as long as its
	// own context lasts. On the request's context, a client that hangs up mid-fetch (or a
	// request deadline shorter than the fetch) would cancel the refresh after it used up the
	// one MinRefreshInterval allows, and a key just published would be refused until then.
	lookupTimeout := 3 * cfg.FetchTimeout // beyond RateLimitWaitMax: jwkset's bound is the one that acts
	return newVerifier(cfg.VerifierConfig, AsymmetricAlgorithms, func(ctx context.Context) jwt.Keyfunc {
		return func(t *jwt.Token) (any, error) {
			if _, ok := t.Method.(*jwt.SigningMethodHMAC); ok {
				return nil, ErrTokenAlgorithm
			}
			type found struct {
				key any
				err error
			}
			done := make(chan found, 1)
			go func() {
				lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
				defer cancel()
				key, err := kf.KeyfuncCtx(lctx)(t)
				done <- found{key, err}
			}()
			select {
			case f := <-done:
				return f.key, f.err
			case <-ctx.Done():
				return nil, fmt.Errorf("%w: %w", ErrTokenUnknownKey, ctx.Err())
			}
		}
	}, nil)
}

// cappedTransport fails a response whose body is larger than max instead of reading it all.
type cappedTransport struct {
	next http.RoundTripper
	max  int64
}

func (c cappedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	if resp.ContentLength > c.max {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("JWKS response of %d bytes is larger than the %d allowed", resp.ContentLength, c.max)
	}
	resp.Body = &cappedBody{r: resp.Body, left: c.max, max: c.max}
	return resp, nil
}

type cappedBody struct {
	r         io.ReadCloser
	left, max int64
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		var one [1]byte
		if n, err := b.r.Read(one[:]); n == 0 && errors.Is(err, io.EOF) {
			return 0, io.EOF
		}
		return 0, fmt.Errorf("JWKS response is larger than the %d bytes allowed", b.max)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *cappedBody) Close() error { return b.r.Close() }

// isLoopbackHost reports whether host (a name or an IP, no port) is this machine.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// redactedURL is s without a password (the HTTP client sends a URL's user info as Basic auth,
// so AUTH_JWKS_URL may carry one), for logs and errors.
func redactedURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(a URL that does not parse)"
	}
	return u.Redacted()
}
