package ports

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
)

// AuthPolicy is who may call what. A nil policy in HTTPConfig turns authentication off
// (AUTH_MODE=off): POST /checkins then takes the userId from the body.
type AuthPolicy struct {
	Verifier *Verifier
	// PublicReads lets GET query routes answer without a token (a token sent is still checked).
	PublicReads bool
	// OpsShared: the ops routes share the public listener, so /metrics needs an ops token there.
	OpsShared bool
}

// Realm names the protection space in WWW-Authenticate.
const Realm = "checkins"

// Error codes of refused requests, in the API's JSON error body.
const (
	CodeUnauthenticated   = "unauthenticated"
	CodeInvalidToken      = "invalid_token"
	CodeInsufficientScope = "insufficient_scope"
	CodeForbidden         = "forbidden"
)

var (
	// errNoBearer: the request carries no Bearer credentials (none at all, or another scheme).
	errNoBearer = errors.New("no bearer token")
)

// ParseBearer returns the token of an Authorization header value (RFC 6750 section 2.1:
// "Bearer" case-insensitively, one or more spaces, a token68). It returns errNoBearer for an
// empty value or another scheme (Basic...), ErrTokenTooLarge, or ErrTokenMalformed.
func ParseBearer(h string) (string, error) {
	h = strings.Trim(h, " \t")
	if h == "" {
		return "", errNoBearer
	}
	scheme, rest, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", errNoBearer
	}
	tok := strings.TrimLeft(rest, " ")
	if len(tok) > MaxTokenBytes {
		return "", ErrTokenTooLarge
	}
	if tok == "" {
		return "", ErrTokenMalformed
	}
	end := len(tok)
	for end > 0 && tok[end-1] == '=' {
		end--
	}
	if end == 0 {
		return "", ErrTokenMalformed
	}
	for i := 0; i < end; i++ {
		c := tok[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/'
		if !ok {
			return "", ErrTokenMalformed
		}
	}
	return tok, nil
}

const principalKey = "checkins.principal"

// tokenKey holds the verified token itself, for a long answer (the dashboard's event stream)
// that verifies it again as it goes.
const tokenKey = "checkins.token"

// principalOf is the verified token's principal of the request, if it sent one.
func principalOf(c echo.Context) (Principal, bool) {
	p, ok := c.Get(principalKey).(Principal)
	return p, ok
}

// challenge sets RFC 6750's WWW-Authenticate and returns the matching API error.
func challenge(c echo.Context, status int, code, msg, scope string) *APIError {
	v := `Bearer realm="` + Realm + `"`
	if code != CodeUnauthenticated {
		v += fmt.Sprintf(`, error=%q, error_description=%q`, code, msg)
	}
	if scope != "" {
		v += fmt.Sprintf(`, scope=%q`, scope)
	}
	c.Response().Header().Set(echo.HeaderWWWAuthenticate, v)
	return apiError(status, code, "", msg)
}

// authenticate verifies the request's token, if any, and stores its principal. It returns nil
// when no token was sent (the caller decides whether that is allowed).
func (s *HTTPServer) authenticate(c echo.Context) (bool, error) {
	r := c.Request()
	if r.URL.RawQuery != "" && r.URL.Query().Has("access_token") { // no query: nothing to parse
		return false, challenge(c, http.StatusUnauthorized, CodeInvalidToken, ErrTokenInQuery.Error(), "")
	}
	hs := r.Header.Values(echo.HeaderAuthorization)
	if len(hs) == 0 {
		return false, nil
	}
	if len(hs) > 1 {
		return false, challenge(c, http.StatusUnauthorized, CodeInvalidToken, ErrTokenMalformed.Error(), "")
	}
	raw, err := ParseBearer(hs[0])
	if errors.Is(err, errNoBearer) {
		return false, nil
	}
	if err != nil {
		return false, challenge(c, http.StatusUnauthorized, CodeInvalidToken, err.Error(), "")
	}
	p, err := s.cfg.Auth.Verifier.Verify(r.Context(), raw)
	if err != nil {
		// Every cause is one of the fixed ErrToken* messages; none contains the token.
		return false, challenge(c, http.StatusUnauthorized, CodeInvalidToken, err.Error(), "")
	}
	c.Set(principalKey, p)
	c.Set(tokenKey, raw)
	return true, nil
}

func (s *HTTPServer) requireToken(c echo.Context) error {
	ok, err := s.authenticate(c)
	if err != nil {
		return err
	}
	if !ok {
		return challenge(c, http.StatusUnauthorized, CodeUnauthenticated, "a Bearer token is required in the Authorization header", "")
	}
	return nil
}

// publicAuth guards the public listener's routes: POST /checkins needs a token; GET query
// routes need one unless reads are public; health checks never do.
func (s *HTTPServer) publicAuth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		switch {
		case c.Path() == "/healthz" || c.Path() == "/readyz" || isDocsPath(c.Path()):
			return next(c)
		case c.Path() == "" || c.Request().Method == http.MethodOptions || methodNotAllowed(c):
			// No route (404), the methods a route allows (204 with Allow), or a method the route
			// does not have (405 with Allow): nothing to guard, and the contract's answer
			// whatever the token.
			return next(c)
		case c.Request().URL.Path == "/":
			return next(c) // "/" only redirects a browser to the dashboard or the docs
		case (c.Request().Method == http.MethodGet || c.Request().Method == http.MethodHead) && s.cfg.Auth.PublicReads:
			if _, err := s.authenticate(c); err != nil {
				return err
			}
			return next(c)
		}
		if err := s.requireToken(c); err != nil {
			return err
		}
		return next(c)
	}
}

// methodNotAllowed says the router matched the path but not the method: Echo's router leaves
// the route's Allow header in the context for its 405 (and for OPTIONS) and nothing else.
func methodNotAllowed(c echo.Context) bool {
	_, ok := c.Get(echo.ContextKeyHeaderAllow).(string)
	return ok
}

// opsAuth guards the ops listener: every /ops route needs scope checkins:ops, and GET routes
// also take checkins:ops:read; /metrics is open on a listener of its own and needs a read
// scope when it shares the public port; health checks never need a token.
func (s *HTTPServer) opsAuth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		path := c.Request().URL.Path
		switch {
		case path == "/healthz" || path == "/readyz":
			return next(c)
		case isUIPath(path): // the dashboard also takes its login cookie (http_ui_auth.go)
			return s.uiAuth(c, next)
		case path == "/metrics" && !s.cfg.Auth.OpsShared:
			return next(c)
		}
		if err := s.requireToken(c); err != nil {
			return err
		}
		p, _ := principalOf(c)
		read := c.Request().Method == http.MethodGet || c.Request().Method == http.MethodHead
		switch {
		case p.HasScope(ScopeOps), read && p.HasScope(ScopeOpsRead):
			return next(c)
		case read:
			return challenge(c, http.StatusForbidden, CodeInsufficientScope, "this route needs scope "+ScopeOpsRead+" or "+ScopeOps, ScopeOpsRead)
		}
		return challenge(c, http.StatusForbidden, CodeInsufficientScope, "this route needs scope "+ScopeOps, ScopeOps)
	}
}

// checkinUser is the userId a check-in is recorded for: the token's subject. A body naming
// another user is refused (403) before anything is reserved or written.
func checkinUser(c echo.Context, body *int64) (*int64, error) {
	p, ok := principalOf(c)
	if !ok { // authentication is off: the body says who
		return body, nil
	}
	if body != nil && *body < 1 {
		return body, nil // not anybody's id: validation names the problem (400)
	}
	if body != nil && *body != p.UserID {
		return nil, apiError(http.StatusForbidden, CodeForbidden, "userId",
			fmt.Sprintf("userId %d is not the token's user %d: a check-in is made only as yourself", *body, p.UserID))
	}
	id := p.UserID
	return &id, nil
}
