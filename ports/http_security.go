package ports

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// Content-Security-Policy values. The API answers JSON: nothing in it may load, run or be
// framed. An HTML page (a dashboard) may use its own origin's scripts, styles and API only.
const (
	cspAPI  = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
	cspHTML = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)

// securityHeaders runs before routing, so 404 and 405 answers carry the headers too.
func securityHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		res := c.Response()
		h := res.Header()
		// The keys are canonical; one backing array for the four values instead of a slice each
		// (capped, so that an Add to one of them cannot write into the next).
		v := [...]string{"nosniff", "DENY", "no-referrer", cspAPI}
		vs := v[:]
		h["X-Content-Type-Options"] = vs[0:1:1] // a JSON body is never sniffed into HTML
		h["X-Frame-Options"] = vs[1:2:2]
		h["Referrer-Policy"] = vs[2:3:3]
		h["Content-Security-Policy"] = vs[3:4:4]
		// No Server header: nothing tells a scanner which stack and version answer.
		h.Del("Server")
		res.Before(func() {
			// A page that set a policy of its own (the docs page, DocsCSP) keeps it.
			if strings.HasPrefix(h.Get(echo.HeaderContentType), "text/html") && h.Get("Content-Security-Policy") == cspAPI {
				h.Set("Content-Security-Policy", cspHTML)
			}
			h.Del("Server")
		})
		return next(c)
	}
}

// ParseCORSOrigins reads a comma-separated list of origins (scheme://host[:port], no path):
// exact origins only, no wildcards, so a typo cannot open the API to every site.
func ParseCORSOrigins(v string) ([]string, error) {
	var out []string
	for _, o := range strings.Split(v, ",") {
		o = strings.TrimSpace(o)
		if o == "" {
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" ||
			u.RawQuery != "" || u.Fragment != "" || u.User != nil || strings.ContainsAny(o, "*?") {
			return nil, fmt.Errorf("origins must look like https://app.example.com (scheme and host, optional port, no path or wildcard), got %q", o)
		}
		out = append(out, strings.ToLower(o))
	}
	return out, nil
}

// corsMiddleware answers browsers from the listed origins only; with no origins listed it is not
// installed and no answer carries an Access-Control-* header.
func corsMiddleware(origins []string) echo.MiddlewareFunc {
	return middleware.CORSWithConfig(middleware.CORSConfig{
		// Exact matches only: Echo's AllowOrigins would also treat * and ? as patterns.
		AllowOriginFunc: func(origin string) (bool, error) {
			return slices.Contains(origins, strings.ToLower(origin)), nil
		},
		AllowMethods:  []string{http.MethodGet, http.MethodHead, http.MethodPost},
		AllowHeaders:  []string{echo.HeaderContentType, echo.HeaderAuthorization, HeaderIdempotencyKey, HeaderCorrelationID},
		ExposeHeaders: []string{HeaderCorrelationID, "Idempotent-Replayed", "Retry-After", headerRateLimit, headerRateLimitPolicy},
		MaxAge:        600,
	})
}
