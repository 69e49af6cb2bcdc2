package ports

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
)

// UICookie holds the dashboard's bearer token: a browser cannot send an Authorization header
// when it navigates, so the login page stores the pasted token in this cookie (HttpOnly, so no
// script reads it; SameSite=Strict, so no other site's page sends it; path /ui, so the API and
// /ops never take it).
const UICookie = "checkins_ui"

// maxCookieBytes is the largest cookie browsers keep (RFC 6265 section 6.1 asks for at least 4096
// bytes of name, value and attributes; Chromium and Firefox drop a larger one).
const maxCookieBytes = 4096

// isUIPath reports whether p is a dashboard route.
func isUIPath(p string) bool { return p == "/ui" || strings.HasPrefix(p, "/ui/") }

// uiAuth guards the dashboard on the ops listener: the token comes from the Authorization
// header or from the login cookie; reading needs checkins:ops:read or checkins:ops, an action
// (any POST but login and logout) needs checkins:ops. The login page and the static files need
// nothing.
func (s *HTTPServer) uiAuth(c echo.Context, next echo.HandlerFunc) error {
	r := c.Request()
	path := r.URL.Path
	if path == "/ui/login" || path == "/ui/logout" || strings.HasPrefix(path, "/ui/static/") || strings.HasPrefix(path, "/ui/vendor/") {
		return next(c)
	}
	ok, err := s.authenticate(c)
	if err != nil {
		return err
	}
	if !ok {
		if ck, err := r.Cookie(UICookie); err == nil && ck.Value != "" {
			p, err := s.cfg.Auth.Verifier.Verify(r.Context(), ck.Value)
			if err == nil {
				c.Set(principalKey, p)
				c.Set(tokenKey, ck.Value)
				ok = true
			} else {
				clearUICookie(c) // expired or from another key: log in again
			}
		}
	}
	read := r.Method == http.MethodGet || r.Method == http.MethodHead
	if !ok {
		if r.Header.Get("HX-Request") == "true" {
			// A fragment htmx asked for: it would follow a redirect and swap the login page into
			// the fragment's place. HX-Redirect sends the whole page to the login instead.
			c.Response().Header().Set("HX-Redirect", "/ui/login?next="+url.QueryEscape(hxNext(r)))
			return challenge(c, http.StatusUnauthorized, CodeUnauthenticated, "log in at /ui/login", "")
		}
		if read && path != uiPathEvents {
			return c.Redirect(http.StatusSeeOther, "/ui/login?next="+url.QueryEscape(r.URL.RequestURI()))
		}
		return challenge(c, http.StatusUnauthorized, CodeUnauthenticated, "log in at /ui/login, or send a Bearer token in the Authorization header", "")
	}
	p, _ := principalOf(c)
	switch {
	case p.HasScope(ScopeOps), read && p.HasScope(ScopeOpsRead):
		return next(c)
	case read:
		return challenge(c, http.StatusForbidden, CodeInsufficientScope, "the dashboard needs scope "+ScopeOpsRead+" or "+ScopeOps, ScopeOpsRead)
	}
	return challenge(c, http.StatusForbidden, CodeInsufficientScope, "this action needs scope "+ScopeOps+"; the token is read-only", ScopeOps)
}

// canAct reports whether the request may use the dashboard's actions (the buttons are shown).
func (u *UI) canAct(c echo.Context) bool {
	if u.srv.cfg.Auth == nil {
		return true // AUTH_MODE=off: every operation is open, on loopback only
	}
	p, ok := principalOf(c)
	return ok && p.HasScope(ScopeOps)
}

type loginView struct {
	Error string
	Next  string
	On    bool
}

func (u *UI) loginPage(c echo.Context) error {
	if u.srv.cfg.Auth == nil {
		return c.Redirect(http.StatusSeeOther, "/ui/")
	}
	return u.render(c, http.StatusOK, "login", loginView{Next: safeNext(c.QueryParam("next")), On: true})
}

// login verifies the pasted token as every ops request is verified and stores it in the cookie,
// which expires with the token.
func (u *UI) login(c echo.Context) error {
	if u.srv.cfg.Auth == nil {
		return c.Redirect(http.StatusSeeOther, "/ui/")
	}
	// From the body only: FormValue reads the query string too, and a token there stays in the
	// request line, where proxies and access logs keep it (found by a review).
	if c.QueryParams().Has("token") {
		return u.render(c, http.StatusUnauthorized, "login", loginView{Error: "the token goes in the form's body, never in the URL", Next: safeNext(c.Request().PostFormValue("next")), On: true})
	}
	next := safeNext(c.Request().PostFormValue("next"))
	raw := strings.TrimSpace(c.Request().PostFormValue("token"))
	raw = strings.TrimSpace(strings.TrimPrefix(raw, "Bearer "))
	fail := func(msg string) error {
		return u.render(c, http.StatusUnauthorized, "login", loginView{Error: msg, Next: next, On: true})
	}
	if raw == "" {
		return fail("paste a token: the dev-mode banner prints an ops token, or run `checkins token --user N --scope " + ScopeOps + "`")
	}
	if len(raw) > MaxTokenBytes {
		return fail(ErrTokenTooLarge.Error())
	}
	p, err := u.srv.cfg.Auth.Verifier.Verify(c.Request().Context(), raw)
	if err != nil {
		return fail("token refused: " + err.Error())
	}
	if !p.HasScope(ScopeOps) && !p.HasScope(ScopeOpsRead) {
		return fail("this token has neither scope " + ScopeOps + " nor " + ScopeOpsRead + ": it cannot see the dashboard")
	}
	// #nosec G124 -- HttpOnly and SameSite=Strict always; Secure whenever the browser speaks
	// HTTPS: to this listener (TLS_CERT_FILE), or to a proxy in front that says so
	// (X-Forwarded-Proto). A Secure cookie over plain HTTP on loopback would never be sent back;
	// a client that claims HTTPS falsely only loses its own cookie.
	ck := &http.Cookie{Name: UICookie, Value: raw, Path: "/ui", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: c.Scheme() == "https"}
	if exp, ok := tokenExpiry(raw); ok {
		ck.Expires = exp
	}
	if len(ck.String()) > maxCookieBytes {
		// Browsers drop a cookie this large without a word: the login seemed to work and the
		// next page asked for a token again (found by a review).
		return fail(fmt.Sprintf("this token is too large for a browser session (%d bytes; a browser keeps a cookie of at most %d): use a token with fewer claims, or call the /ops routes with it in the Authorization header",
			len(raw), maxCookieBytes))
	}
	c.SetCookie(ck)
	return c.Redirect(http.StatusSeeOther, next)
}

func (u *UI) logout(c echo.Context) error {
	clearUICookie(c)
	return c.Redirect(http.StatusSeeOther, "/ui/login")
}

func clearUICookie(c echo.Context) {
	// #nosec G124 -- the login cookie's attributes (see login), emptied and expired
	c.SetCookie(&http.Cookie{Name: UICookie, Value: "", Path: "/ui", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: c.Scheme() == "https", MaxAge: -1, Expires: time.Unix(0, 0)})
}

// safeNext keeps a post-login redirect on the dashboard (no open redirect to another site).
func safeNext(n string) string {
	if !isUIPath(strings.SplitN(n, "?", 2)[0]) || strings.HasPrefix(n, "//") || strings.Contains(n, "\\") {
		return "/ui/"
	}
	return n
}

// hxNext is where the login sends an htmx request's page back to: the page's own URL
// (HX-Current-URL), kept on the dashboard as any next is.
func hxNext(r *http.Request) string {
	u, err := url.Parse(r.Header.Get("HX-Current-URL"))
	if err != nil {
		return "/ui/"
	}
	return safeNext(u.RequestURI())
}

// tokenExpiry reads the exp claim of a token the verifier accepted.
func tokenExpiry(raw string) (time.Time, bool) {
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *float64 `json:"exp"`
	}
	if json.Unmarshal(b, &claims) != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	return time.Unix(int64(*claims.Exp), 0), true
}
