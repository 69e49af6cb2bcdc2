package ports

import (
	"errors"
	"fmt"
	"mime"
	"net"
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

// hstsValue: a year, the common floor for HSTS; subdomains are left to their own servers.
const hstsValue = "max-age=31536000"

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
		// Over HTTPS (TLS_CERT_FILE), browsers are told to keep to it: the dashboard's cookie
		// and the tokens are never sent in clear to this host after a first visit. (Behind a
		// proxy that terminates TLS, the proxy sets it.)
		if c.Request().TLS != nil {
			h["Strict-Transport-Security"] = []string{hstsValue}
		}
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
		// A browser sends the origin as it serializes it: never with its scheme's default port
		// or a trailing dot. Listed so, it would never match, and CORS would be off for it
		// without a word.
		if p := u.Port(); (u.Scheme == "https" && p == "443") || (u.Scheme == "http" && p == "80") {
			return nil, fmt.Errorf("origin %q names its scheme's default port, which browsers never send: list it as %s://%s", o, u.Scheme, u.Hostname())
		}
		if strings.HasSuffix(u.Hostname(), ".") {
			return nil, fmt.Errorf("origin %q ends its host with a dot, which browsers never send: list it without", o)
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

// MaxOpsBodyBytes caps a request body on the ops listener: its routes take their arguments in
// the path and query, and the dashboard's forms (a token, a confirmation) are a few KiB.
const MaxOpsBodyBytes = 64 << 10

// limitBody refuses a body declared larger than max (413) and cuts one that turns out larger,
// so that no route, a form parsed by the framework included, reads an unbounded body into memory.
func limitBody(max int64) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			if r.ContentLength > max {
				return apiError(http.StatusRequestEntityTooLarge, "body_too_large", "",
					fmt.Sprintf("request body is larger than %d bytes", max))
			}
			if r.Body != nil && r.Body != http.NoBody {
				r.Body = http.MaxBytesReader(c.Response(), r.Body, max)
				// A form is parsed here, so that one sent without a length (chunked) and cut
				// is a 413 too: a handler's FormValue hides the parse error, and the login
				// answered "paste a token" for a form that had one.
				var err error
				switch mt, _, _ := mime.ParseMediaType(r.Header.Get(echo.HeaderContentType)); mt {
				case echo.MIMEApplicationForm:
					err = r.ParseForm()
				case echo.MIMEMultipartForm:
					err = r.ParseMultipartForm(max) // the body is capped at max: all in memory
				}
				if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
					return apiError(http.StatusRequestEntityTooLarge, "body_too_large", "",
						fmt.Sprintf("request body is larger than %d bytes", max))
				}
			}
			return next(c)
		}
	}
}

// crossOriginProtection refuses a state-changing request that a browser marks as sent by another
// site (Sec-Fetch-Site, or Origin against Host); GETs, and clients that are not browsers, pass.
// On the ops listener it guards the dashboard's cookie session, and with AUTH_MODE=off every
// operation, from pages of other sites the operator visits.
func crossOriginProtection() echo.MiddlewareFunc {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSONCharsetUTF8)
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"error":{"code":"cross_origin","message":"cross-origin request refused: operations are taken from the dashboard's own pages, or by clients that are not browsers"}}` + "\n"))
	}))
	return echo.WrapMiddleware(cop.Handler)
}

// loopbackHostOnly answers 421 to a request whose Host is not a loopback name or address. With
// AUTH_MODE=off the listeners are on loopback (the configuration refuses anything else), and a
// browser is the way another site reaches them: by DNS rebinding, a name of its own that it
// makes resolve to 127.0.0.1, so that its pages are same-origin with this service and pass the
// cross-origin check. Such a request still names the other site's host.
func loopbackHostOnly(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		host := c.Request().Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if !isLoopbackHost(strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")) {
			return apiError(http.StatusMisdirectedRequest, "misdirected_request", "",
				fmt.Sprintf("with AUTH_MODE=off this service answers only requests addressed to a loopback name or address (localhost, 127.0.0.1, [::1]), not %q", c.Request().Host))
		}
		return next(c)
	}
}
