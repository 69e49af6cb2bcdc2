// Package ports is how the world drives the app: the Echo HTTP server, the Watermill router that
// feeds projections, and the CLI's operational verbs.
package ports

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/domain"
)

// MaxBodyBytes is the largest request body accepted (413 above).
const MaxBodyBytes = 16 << 10

// HeaderCorrelationID carries the correlation ID in and out of HTTP.
const HeaderCorrelationID = "X-Correlation-ID"

// Readiness reports whether the process can serve: Redis reachable, router running.
type Readiness interface {
	Ready(ctx context.Context) error
}

// HTTPConfig configures the HTTP server.
type HTTPConfig struct {
	RequestTimeout time.Duration // bounds every request, including waiting for Redis
	// Auth is who may call what (http_auth.go); nil: no authentication (AUTH_MODE=off).
	Auth *AuthPolicy
	// IPLimit limits every route of each listener per client address, in process (zero: off).
	IPLimit command.RateLimit
	// UserLimit is the per-user limit of POST /checkins (per token subject; off: none), counted
	// by the RecordCheckin command, whose handler must have a limiter of this policy
	// (RecordCheckinHandler.WithUserLimit); here it names the policy in the RateLimit headers.
	UserLimit command.RateLimit
	// IPExtractor finds the client address (nil: the connection's peer; see IPExtractor).
	IPExtractor echo.IPExtractor
	// Observe, when set, sees every request of both listeners first (metrics), refused ones too.
	Observe echo.MiddlewareFunc
	// CORSAllowedOrigins are the browser origins allowed to call the API; none: CORS is off.
	CORSAllowedOrigins []string
	// Quiesced, when set, says why the event stream must not be touched now (nil: it may): a
	// partition migration runs, or changed the partition count, and /checkins routes answer 503
	// migrating; or (an error wrapping domain.ErrUnavailable) the process has not yet been able
	// to check the stream's partition count, and they answer 503 unavailable.
	Quiesced func() error
}

// HTTPServer is the REST API on the public listener, and operations (/ops, /metrics) on a
// listener of their own; health checks answer on both.
type HTTPServer struct {
	app   app.Application
	ready Readiness
	cfg   HTTPConfig
	log   *slog.Logger
	echo  *echo.Echo
	ops   *echo.Echo
}

// NewHTTPServer registers all routes; extra lets other ports add theirs (ops, metrics).
func NewHTTPServer(a app.Application, ready Readiness, cfg HTTPConfig, log *slog.Logger) *HTTPServer {
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 5 * time.Second
	}
	if cfg.IPExtractor == nil {
		cfg.IPExtractor = echo.ExtractIPDirect()
	}
	s := &HTTPServer{app: a, ready: ready, cfg: cfg, log: log, echo: s0(), ops: s0()}
	for _, e := range []*echo.Echo{s.echo, s.ops} {
		e.HTTPErrorHandler = s.handleError
		// The client's address is the connection's peer unless TRUSTED_PROXIES says otherwise:
		// X-Forwarded-For and X-Real-IP are whatever a client wants them to be (Echo's default
		// trusts them, GO-2026-6872 and GO-2026-6875).
		e.IPExtractor = cfg.IPExtractor
		e.Pre(securityHeaders)
		e.Use(s.requestContext, s.accessLog)
		if cfg.Observe != nil {
			e.Use(cfg.Observe)
		}
		var limit echo.MiddlewareFunc
		if !cfg.IPLimit.Off() {
			// Each listener its own budget: a flood of the public port leaves the ops port usable.
			l, err := NewIPRateLimiter(cfg.IPLimit)
			if err != nil { // ParseRateLimit never gives such a limit
				log.Error("per-address rate limit NOT applied", "limit", cfg.IPLimit.String(), "error", err)
			} else {
				limit = s.limitIP(l)
			}
		}
		switch {
		case e == s.echo && len(cfg.CORSAllowedOrigins) > 0:
			// CORS before auth (a preflight has no token). It answers a preflight itself, so
			// the per-address limit counts a preflight before it (preflights went unlimited:
			// found by a review), and any other request after it, so that a 429 carries its
			// headers and a browser can read it.
			if limit != nil {
				e.Use(onlyPreflights(limit, true))
			}
			e.Use(corsMiddleware(cfg.CORSAllowedOrigins))
			if limit != nil {
				e.Use(onlyPreflights(limit, false))
			}
		case limit != nil:
			e.Use(limit)
		}
	}
	if cfg.Quiesced != nil {
		s.echo.Use(s.quiesce)
	}
	s.ops.Use(limitBody(MaxOpsBodyBytes), crossOriginProtection())
	if cfg.Auth != nil {
		s.echo.Use(s.publicAuth)
		s.ops.Use(s.opsAuth)
	} else {
		s.echo.Use(loopbackHostOnly)
		s.ops.Use(loopbackHostOnly)
	}
	s.echo.Use(wellFormedQuery)
	s.ops.Use(wellFormedQuery)
	// The routes of openapi.yml, through the generated glue (http_openapi.go).
	api := &apiServer{s: s, docs: newDocsHandlers()}
	public := []apiPart{partHealth, partPublic}
	if a.Commands.RecordCheckin != nil { // a projector-only process serves reads and health only
		public = append(public, partPostCheckin)
	}
	registerAPI(s.echo, api, public...)
	registerAPI(s.ops, api, partHealth)
	return s
}

func s0() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	return e
}

// Echo exposes the public router so other ports can add routes before serving.
func (s *HTTPServer) Echo() *echo.Echo { return s.echo }

// OpsEcho is the ops listener's router: /ops routes and /metrics go there.
func (s *HTTPServer) OpsEcho() *echo.Echo { return s.ops }

// Handler is the http.Handler of the public listener.
func (s *HTTPServer) Handler() http.Handler { return s.echo }

// OpsHandler is the http.Handler of the ops listener.
func (s *HTTPServer) OpsHandler() http.Handler { return s.ops }

// SharedHandler serves both on one listener (OPS_ADDR = HTTP_ADDR): /ops, /ui and /metrics go
// to the ops router, with its scopes; everything else to the public one.
func (s *HTTPServer) SharedHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if p == "/metrics" || p == "/ops" || strings.HasPrefix(p, "/ops/") || isUIPath(p) {
			s.ops.ServeHTTP(w, r)
			return
		}
		s.echo.ServeHTTP(w, r)
	})
}

type ctxKeyCorrelation struct{}

// validCorrelationID: 1 to 128 visible ASCII characters. The ID goes into the event's metadata,
// every log line and the answer's header: a control character, a byte that is no UTF-8 or
// markup would travel with it.
func validCorrelationID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e || id[i] == '<' || id[i] == '>' || id[i] == '"' || id[i] == '\'' || id[i] == '\\' {
			return false
		}
	}
	return true
}

// CorrelationID returns the request's correlation ID.
func CorrelationID(ctx context.Context) string {
	s, _ := ctx.Value(ctxKeyCorrelation{}).(string)
	return s
}

// requestContext gives the request its correlation ID (the client's X-Correlation-ID, or a new
// one), echoed in the answer, and its deadline, RequestTimeout: one copy of the request for both.
func (s *HTTPServer) requestContext(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		id := r.Header.Get(HeaderCorrelationID)
		if !validCorrelationID(id) {
			id = uuid.NewString()
		}
		c.Response().Header().Set(HeaderCorrelationID, id)
		ctx := WithCorrelationID(r.Context(), id)
		if r.URL.Path != uiPathEvents { // the dashboard's event stream lasts as long as the page is open
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, s.cfg.RequestTimeout)
			defer cancel()
		}
		c.SetRequest(r.WithContext(ctx))
		return next(c)
	}
}

func (s *HTTPServer) accessLog(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		status := c.Response().Status
		if status >= 500 || s.log.Enabled(c.Request().Context(), slog.LevelDebug) {
			s.log.Log(c.Request().Context(), levelFor(status), "http request",
				"method", c.Request().Method, "path", c.Path(), "status", status,
				"duration_ms", time.Since(start).Milliseconds(), "correlation_id", CorrelationID(c.Request().Context()))
		}
		return nil
	}
}

func levelFor(status int) slog.Level {
	if status >= 500 {
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// APIError is the JSON error body: {"error": {"code", "message", "field"}}.
type APIError struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

func (e *APIError) Error() string { return e.Message }

type errorBody struct {
	Error *APIError `json:"error"`
}

// wellFormedQuery refuses a query string url.ParseQuery cannot read whole (a ';' separator, a
// bad % escape): Echo's QueryParam drops such a pair without a word, and the filter the client
// asked for was not applied (/checkins?from=1;to=2 listed everything, limit=%ZZ gave 100 rows).
func wellFormedQuery(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		raw := c.Request().URL.RawQuery
		if raw == "" {
			return next(c)
		}
		if _, err := url.ParseQuery(raw); err != nil {
			return apiError(http.StatusBadRequest, domain.CodeInvalid, badQueryField(raw),
				fmt.Sprintf("the query string cannot be read (%v): separate parameters with '&' and percent-encode '%%', ';' and '&' in values", err))
		}
		return next(c)
	}
}

// badQueryField names the parameter of raw that url.ParseQuery cannot read ("query" when none
// can be told).
func badQueryField(raw string) string {
	for _, part := range strings.Split(raw, "&") {
		key, value, _ := strings.Cut(part, "=")
		_, kerr := url.QueryUnescape(key)
		_, verr := url.QueryUnescape(value)
		if strings.Contains(part, ";") || kerr != nil || verr != nil {
			if k, err := url.QueryUnescape(strings.SplitN(key, ";", 2)[0]); err == nil && k != "" {
				return k
			}
			return "query"
		}
	}
	return "query"
}

func apiError(status int, code, field, msg string) *APIError {
	return &APIError{Status: status, Code: code, Field: field, Message: msg}
}

// handleError is the only place errors become statuses and JSON bodies.
func (s *HTTPServer) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	ae := s.toAPIError(c, err)
	if ae.Status >= 500 {
		s.log.WarnContext(c.Request().Context(), "request failed", "path", c.Path(), "status", ae.Status, "error", err,
			"correlation_id", CorrelationID(c.Request().Context()))
	}
	_ = c.JSON(ae.Status, errorBody{Error: ae})
}

func (s *HTTPServer) toAPIError(c echo.Context, err error) *APIError {
	var ae *APIError
	var ve *domain.ValidationError
	var he *echo.HTTPError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, context.Canceled) && errors.Is(c.Request().Context().Err(), context.Canceled):
		// (Not REQUEST_TIMEOUT's deadline: that ctx ends with DeadlineExceeded, and the client
		// still waits for its 503.)
		// The client went away before the answer (a browser that navigated on, htmx replacing a
		// request): nothing failed here, and nobody reads the status. 499 (nginx's "client
		// closed request") keeps it out of the 5xx of the logs and the metrics.
		return apiError(StatusClientClosedRequest, CodeClientClosedRequest, "", "the client closed the request before it was answered")
	case errors.As(err, &ve):
		return apiError(http.StatusBadRequest, ve.Code, ve.Field, ve.Error())
	case errors.Is(err, domain.ErrConflict):
		return apiError(http.StatusConflict, domain.CodeConflict, "checkinId", err.Error())
	case errors.Is(err, domain.ErrNotFound):
		return apiError(http.StatusNotFound, domain.CodeNotFound, "", err.Error())
	case errors.Is(err, domain.ErrNotReplicated):
		return apiError(http.StatusServiceUnavailable, domain.CodeNotReplicated, "",
			"the check-in reached fewer Redis replicas than required (INGEST_MIN_REPLICAS) in time; retry with the same checkinId")
	case errors.Is(err, domain.ErrMigrating):
		c.Response().Header().Set("Retry-After", strconv.Itoa(MigratingRetryAfter))
		return apiError(http.StatusServiceUnavailable, CodeMigrating, "", err.Error())
	case errors.Is(err, domain.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return apiError(http.StatusServiceUnavailable, domain.CodeUnavailable, "", "storage is unavailable, retry later")
	case errors.As(err, &he):
		msg, _ := he.Message.(string)
		if msg == "" {
			msg = http.StatusText(he.Code)
		}
		return apiError(he.Code, strings.ReplaceAll(strings.ToLower(http.StatusText(he.Code)), " ", "_"), "", msg)
	default:
		return apiError(http.StatusInternalServerError, "internal", "", "internal error")
	}
}

func (s *HTTPServer) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

func (s *HTTPServer) readyz(c echo.Context) error {
	if s.ready != nil {
		if err := s.ready.Ready(c.Request().Context()); err != nil {
			reason := err.Error()
			if !s.mayReadReasons(c) {
				reason = ReadyReasonWithheld
			}
			return c.JSON(http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": reason})
		}
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
}

// ReadyReasonWithheld is /readyz's reason for a caller that may not read the real one.
const ReadyReasonWithheld = "not ready; the reason is on the ops listener's /readyz (or with an ops token) and in the logs"

// mayReadReasons: why the service is not ready (Redis's address, a stalled group, what a
// migration waits for) is for operators: on the ops listener of its own, with authentication
// off (every listener is on loopback then), or with a token of an ops scope. Any token
// problem just withholds it: a probe is never refused.
func (s *HTTPServer) mayReadReasons(c echo.Context) bool {
	if s.cfg.Auth == nil || (c.Echo() == s.ops && !s.cfg.Auth.OpsShared) {
		return true
	}
	raw, err := ParseBearer(c.Request().Header.Get(echo.HeaderAuthorization))
	if err != nil || s.cfg.Auth.Verifier == nil {
		return false
	}
	p, err := s.cfg.Auth.Verifier.Verify(c.Request().Context(), raw)
	return err == nil && (p.HasScope(ScopeOps) || p.HasScope(ScopeOpsRead))
}

// StatusClientClosedRequest is the status logged and counted for a request whose client went away
// before its answer: not a server error. No client ever reads it.
const (
	StatusClientClosedRequest = 499
	CodeClientClosedRequest   = "client_closed_request"
)

// CodeMigrating: the event stream is being moved to another partition count.
const CodeMigrating = "migrating"

// MigratingRetryAfter is the Retry-After (seconds) of a 503 migrating.
const MigratingRetryAfter = 5

// quiesce answers the event-stream routes (/checkins...) 503 migrating while HTTPConfig.Quiesced
// says so; the read models stay readable.
func (s *HTTPServer) quiesce(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		p := c.Request().URL.Path
		if p != "/checkins" && !strings.HasPrefix(p, "/checkins/") {
			return next(c)
		}
		why := s.cfg.Quiesced()
		if why == nil {
			return next(c)
		}
		c.Response().Header().Set("Retry-After", strconv.Itoa(MigratingRetryAfter))
		if errors.Is(why, domain.ErrUnavailable) {
			return apiError(http.StatusServiceUnavailable, domain.CodeUnavailable, "", why.Error()+"; retry later")
		}
		return apiError(http.StatusServiceUnavailable, CodeMigrating, "", why.Error()+"; retry later")
	}
}

// onlyPreflights applies m to the preflights (OPTIONS, which the CORS middleware answers) when
// preflights is true, and to every other request when false.
func onlyPreflights(m echo.MiddlewareFunc, preflights bool) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		limited := m(next)
		return func(c echo.Context) error {
			if (c.Request().Method == http.MethodOptions) == preflights {
				return limited(c)
			}
			return next(c)
		}
	}
}
