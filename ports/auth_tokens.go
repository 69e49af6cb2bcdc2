package ports

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"
)

// Scopes a token may carry (claim "scope", space-separated, or "scp").
const (
	// ScopeOps allows every /ops route.
	ScopeOps = "checkins:ops"
	// ScopeOpsRead allows the GET routes of /ops.
	ScopeOpsRead = "checkins:ops:read"
)

// KnownScopes are the scopes this service gives a meaning to.
var KnownScopes = []string{ScopeOps, ScopeOpsRead}

// MaxTokenBytes bounds the bearer token read from a request: larger is refused unparsed.
const MaxTokenBytes = 8 << 10

// Principal is who a valid token speaks for.
type Principal struct {
	UserID int64 // the token's subject
	Scopes []string
}

// HasScope reports whether the token carries scope s.
func (p Principal) HasScope(s string) bool { return slices.Contains(p.Scopes, s) }

// Why a token was refused. Each cause has one fixed message: nothing of the token is echoed.
var (
	ErrTokenExpired       = errors.New("token is expired")
	ErrTokenNotYetValid   = errors.New("token is not valid yet")
	ErrTokenBadSignature  = errors.New("token signature is invalid")
	ErrTokenWrongIssuer   = errors.New("token issuer is not accepted")
	ErrTokenWrongAudience = errors.New("token audience is not accepted")
	ErrTokenMalformed     = errors.New("token is malformed")
	ErrTokenUnknownKey    = errors.New("token is signed with an unknown key")
	ErrTokenBadSubject    = errors.New("token subject is not a user id")
	ErrTokenNoExpiry      = errors.New("token has no expiration time")
	ErrTokenAlgorithm     = errors.New("token signing algorithm is not accepted")
	ErrTokenTooLarge      = errors.New("token is too large")
	ErrTokenInQuery       = errors.New("tokens are accepted only in the Authorization header")
)

// HS256Algorithms and AsymmetricAlgorithms are the two algorithm sets; one verifier never mixes
// them, so a public key can never be taken for an HMAC secret.
var (
	HS256Algorithms      = []string{"HS256"}
	AsymmetricAlgorithms = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)

// MinHS256SecretBytes is the shortest HS256 secret accepted (RFC 7518: at least the hash size).
const MinHS256SecretBytes = 32

// VerifierConfig is what every token must match.
type VerifierConfig struct {
	Issuer   string        // exact "iss"
	Audience string        // must be one of "aud"
	Leeway   time.Duration // clock skew allowed on exp and nbf
	Now      func() time.Time
}

// keySource gives the key that verifies a token, given the request's context.
type keySource func(ctx context.Context) jwt.Keyfunc

// Verifier checks bearer tokens: signature with pinned algorithms, exp required, exact iss, aud
// containing ours, a subject that is a user id.
type Verifier struct {
	parser *jwt.Parser
	keys   keySource
	cfg    VerifierConfig
	cache  *verifiedTokens // nil: every token is verified in full
}

// Verified tokens are remembered for a while, so a client that sends the same token with every
// request pays for its signature and JSON once: verifying an HS256 token took about 8% of the
// API's CPU under load, more than the check-in's own Redis work. An entry is the exact token
// text, so a hit is the same verdict the parser would give, except for time and keys: it ends at
// the token's exp (plus the leeway, as the parser allows) and at most verifiedTokenTTL after the
// check. Only verifiers with a fixed key remember (HS256: dev and hs256 modes): a JWK Set can
// drop a key at any refresh, and its tokens must stop counting then. Failed verifications are
// never remembered.
const (
	verifiedTokenTTL     = time.Minute
	maxVerifiedTokens    = 1 << 14 // at MaxTokenBytes each, at most 128 MiB; typical tokens are ~200 bytes
	verifiedTokensToDrop = maxVerifiedTokens / 4
)

type verifiedToken struct {
	p     Principal
	until time.Time
}

type verifiedTokens struct {
	mu sync.RWMutex
	m  map[string]verifiedToken
}

func (c *verifiedTokens) get(raw string, now time.Time) (Principal, bool) {
	c.mu.RLock()
	e, ok := c.m[raw]
	c.mu.RUnlock()
	if !ok || !now.Before(e.until) {
		return Principal{}, false
	}
	return e.p, true
}

func (c *verifiedTokens) put(raw string, e verifiedToken, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]verifiedToken)
	}
	if len(c.m) >= maxVerifiedTokens {
		for k, old := range c.m {
			if !now.Before(old.until) {
				delete(c.m, k)
			}
		}
		for k := range c.m { // still full: forget a quarter (map order is arbitrary enough)
			if len(c.m) <= maxVerifiedTokens-verifiedTokensToDrop {
				break
			}
			delete(c.m, k)
		}
	}
	c.m[raw] = e
}

func newVerifier(cfg VerifierConfig, algs []string, keys keySource, cache *verifiedTokens) (*Verifier, error) {
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("ports: a token verifier needs an issuer and an audience")
	}
	if cfg.Leeway < 0 {
		return nil, fmt.Errorf("ports: negative clock leeway %s", cfg.Leeway)
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(algs), jwt.WithExpirationRequired(), jwt.WithIssuer(cfg.Issuer),
		jwt.WithAudience(cfg.Audience), jwt.WithLeeway(cfg.Leeway), jwt.WithStrictDecoding()}
	if cfg.Now != nil {
		opts = append(opts, jwt.WithTimeFunc(cfg.Now))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Verifier{parser: jwt.NewParser(opts...), keys: keys, cfg: cfg, cache: cache}, nil
}

// NewHS256Verifier verifies tokens signed with HS256 and secret.
func NewHS256Verifier(secret []byte, cfg VerifierConfig) (*Verifier, error) {
	if len(secret) < MinHS256SecretBytes {
		return nil, fmt.Errorf("ports: HS256 secret must be at least %d bytes, got %d", MinHS256SecretBytes, len(secret))
	}
	key := slices.Clone(secret)
	return newVerifier(cfg, HS256Algorithms, func(context.Context) jwt.Keyfunc {
		return func(t *jwt.Token) (any, error) {
			if t.Method != jwt.SigningMethodHS256 {
				return nil, ErrTokenAlgorithm
			}
			return key, nil
		}
	}, &verifiedTokens{})
}

// tokenClaims are the claims read from a token.
type tokenClaims struct {
	jwt.RegisteredClaims
	Scope scopeList `json:"scope,omitempty"`
	Scp   scopeList `json:"scp,omitempty"`
}

// scopeList reads a space-separated string (RFC 8693 "scope") or an array of strings ("scp").
type scopeList []string

func (s *scopeList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = strings.Fields(one)
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("scope must be a string or an array of strings")
	}
	*s = many
	return nil
}

// Verify checks raw (a compact JWS) and returns its principal, or one of the ErrToken* causes.
func (v *Verifier) Verify(ctx context.Context, raw string) (Principal, error) {
	if len(raw) > MaxTokenBytes {
		return Principal{}, ErrTokenTooLarge
	}
	now := v.cfg.Now()
	if v.cache != nil {
		if p, ok := v.cache.get(raw, now); ok {
			return p, nil
		}
	}
	var claims tokenClaims
	_, err := v.parser.ParseWithClaims(raw, &claims, v.keys(ctx))
	if err != nil {
		return Principal{}, v.cause(err, &claims)
	}
	id, err := strconv.ParseInt(claims.Subject, 10, 64)
	if err != nil || id < 1 || strconv.FormatInt(id, 10) != claims.Subject {
		return Principal{}, ErrTokenBadSubject
	}
	// The scopes are shared by every hit of the entry: a Principal's Scopes are read, never changed.
	p := Principal{UserID: id, Scopes: append(claims.Scope, claims.Scp...)}
	if v.cache == nil {
		return p, nil
	}
	until := now.Add(verifiedTokenTTL)
	if exp := claims.ExpiresAt.Add(v.cfg.Leeway); exp.Before(until) {
		until = exp
	}
	v.cache.put(raw, verifiedToken{p: p, until: until}, now)
	return p, nil
}

// cause maps the jwt library's error to our fixed causes. Claims are checked only once the
// signature is good, so an expired or foreign token with a bad signature is a bad signature.
func (v *Verifier) cause(err error, c *tokenClaims) error {
	switch {
	case errors.Is(err, ErrTokenAlgorithm):
		return ErrTokenAlgorithm
	case errors.Is(err, jwkset.ErrKeyNotFound):
		return ErrTokenUnknownKey
	case errors.Is(err, jwt.ErrTokenMalformed):
		return ErrTokenMalformed
	case errors.Is(err, jwt.ErrTokenSignatureInvalid) && strings.Contains(err.Error(), "signing method"):
		return ErrTokenAlgorithm // not among the pinned algorithms (none included)
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return ErrTokenBadSignature
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return ErrTokenUnknownKey // no key could be found for it
	case errors.Is(err, jwt.ErrTokenExpired):
		return ErrTokenExpired
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return ErrTokenNotYetValid
	case c.ExpiresAt == nil:
		return ErrTokenNoExpiry
	case errors.Is(err, jwt.ErrTokenInvalidIssuer), c.Issuer != v.cfg.Issuer:
		return ErrTokenWrongIssuer
	case errors.Is(err, jwt.ErrTokenInvalidAudience), !slices.Contains(c.Audience, v.cfg.Audience):
		return ErrTokenWrongAudience
	}
	return ErrTokenMalformed
}

// TokenIssuer mints HS256 tokens that a Verifier of the same secret, issuer and audience accepts
// (dev mode and `checkins token`).
type TokenIssuer struct {
	secret           []byte
	issuer, audience string
	now              func() time.Time
}

// NewTokenIssuer mints with secret for issuer and audience.
func NewTokenIssuer(secret []byte, issuer, audience string) (*TokenIssuer, error) {
	if len(secret) < MinHS256SecretBytes {
		return nil, fmt.Errorf("ports: HS256 secret must be at least %d bytes, got %d", MinHS256SecretBytes, len(secret))
	}
	if issuer == "" || audience == "" {
		return nil, errors.New("ports: a token issuer needs an issuer and an audience")
	}
	return &TokenIssuer{secret: slices.Clone(secret), issuer: issuer, audience: audience, now: time.Now}, nil
}

// Token is a minted token and what it says.
type Token struct {
	Token     string    `json:"token"`
	UserID    int64     `json:"userId"`
	Scopes    []string  `json:"scopes"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// Mint signs a token for user with scopes, valid for ttl.
func (i *TokenIssuer) Mint(user int64, scopes []string, ttl time.Duration) (Token, error) {
	if user < 1 {
		return Token{}, fmt.Errorf("user must be an integer >= 1, got %d", user)
	}
	if ttl < time.Second {
		return Token{}, fmt.Errorf("ttl must be at least 1s (a token's expiry is in whole seconds), got %s", ttl)
	}
	// exp is whole seconds (RFC 7519's NumericDate as the JWT library writes it): ExpiresAt is
	// the token's own, never a fraction of a second after it.
	now := i.now().Truncate(time.Second)
	exp := now.Add(ttl).Truncate(time.Second)
	claims := tokenClaims{RegisteredClaims: jwt.RegisteredClaims{Issuer: i.issuer, Subject: strconv.FormatInt(user, 10),
		Audience: jwt.ClaimStrings{i.audience}, IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(exp)}}
	if len(scopes) > 0 {
		claims.Scope = scopes
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, mintClaims{claims}).SignedString(i.secret)
	if err != nil {
		return Token{}, err
	}
	return Token{Token: s, UserID: user, Scopes: append([]string{}, scopes...), ExpiresAt: exp}, nil
}

// mintClaims writes scope as the space-separated string of RFC 8693.
type mintClaims struct{ tokenClaims }

func (m mintClaims) MarshalJSON() ([]byte, error) {
	type out struct {
		jwt.RegisteredClaims
		Scope string `json:"scope,omitempty"`
	}
	return json.Marshal(out{m.RegisteredClaims, strings.Join(m.Scope, " ")})
}
