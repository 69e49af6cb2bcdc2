package ports

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/checkins/checkins/ports/openapi"
)

// The routes of openapi.yml are registered by the generated glue (openapi.RegisterHandlers), one
// part at a time, where each part of the service is wired: a part's routes go to its listener,
// the others are left out. TestOpenAPIRoutes checks that a fully wired service registers every
// path of the spec and nothing else.
type apiPart int

const (
	partNone          apiPart = iota
	partHealth                // both listeners
	partPublic                // check-ins, users, locations, the docs
	partProjections           // the projection read routes
	partOps                   // status and the poison queue
	partProjectionOps         // projection versions and rebuilds
	partMetrics               // GET /metrics
	partPostCheckin           // POST /checkins, only in a process that records check-ins
)

// partOf is the part that owns a route of the spec, in Echo's path syntax.
func partOf(method, path string) apiPart {
	switch path {
	case "/healthz", "/readyz":
		return partHealth
	case "/checkins":
		if method == http.MethodPost {
			return partPostCheckin
		}
		return partPublic
	case "/checkins/latest", "/users/:id", "/locations/:id",
		"/openapi.json", "/openapi.yaml", "/docs", "/docs/assets/:file":
		return partPublic
	case "/leaderboards/locations", "/leaderboards/users", "/users/:id/checkins", "/locations/:id/daily":
		return partProjections
	case "/ops/status", "/ops/poison", "/ops/poison/replay", "/ops/poison/:id", "/ops/poison/:id/replay":
		return partOps
	case "/ops/projections", "/ops/projections/:name/rebuild":
		return partProjectionOps
	case "/metrics":
		return partMetrics
	}
	return partNone
}

// registerAPI adds to e the routes of the spec that belong to one of parts.
func registerAPI(e *echo.Echo, si *apiServer, parts ...apiPart) {
	openapi.RegisterHandlers(partRouter{e: e, parts: parts}, si)
}

// partRouter is the generated glue's EchoRouter: it adds a route only when it is in parts.
type partRouter struct {
	e     *echo.Echo
	parts []apiPart
}

func (r partRouter) add(method, path string, h echo.HandlerFunc, m []echo.MiddlewareFunc) *echo.Route {
	p := partOf(method, path)
	if p == partNone {
		// A path added to openapi.yml without a part here: refuse to start rather than serve
		// a contract with a hole in it.
		panic("ports: openapi.yml has " + method + " " + path + ", which partOf does not know")
	}
	for _, want := range r.parts {
		if p == want {
			return r.e.Add(method, path, h, m...)
		}
	}
	return nil
}

func (r partRouter) CONNECT(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodConnect, p, h, m)
}
func (r partRouter) DELETE(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodDelete, p, h, m)
}

// GET adds the route for HEAD too, with the same handler and middleware: every resource that
// answers GET answers HEAD with the same status and headers and no body (RFC 9110, 9.3.2; net/http
// drops a HEAD response's body), as the contract's description says; Echo does not do it itself.
func (r partRouter) GET(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	route := r.add(http.MethodGet, p, h, m)
	if route != nil {
		r.add(http.MethodHead, p, h, m)
	}
	return route
}
func (r partRouter) HEAD(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodHead, p, h, m)
}
func (r partRouter) OPTIONS(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodOptions, p, h, m)
}
func (r partRouter) PATCH(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodPatch, p, h, m)
}
func (r partRouter) POST(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodPost, p, h, m)
}
func (r partRouter) PUT(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodPut, p, h, m)
}
func (r partRouter) TRACE(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodTrace, p, h, m)
}

// apiServer implements the generated openapi.ServerInterface with the handlers of each part; a
// part's field is set only where that part is registered. The path parameters the glue passes
// are the raw text (oapi-server-overlay.yml): the handlers parse them, with the API's errors.
type apiServer struct {
	s       *HTTPServer
	docs    *docsHandlers
	ops     *opsHandlers
	metrics http.Handler
}

var _ openapi.ServerInterface = (*apiServer)(nil)

// Public listener.

func (a *apiServer) PostCheckin(c echo.Context) error      { return a.s.postCheckin(c) }
func (a *apiServer) ListCheckins(c echo.Context) error     { return a.s.listCheckins(c) }
func (a *apiServer) GetLatestCheckin(c echo.Context) error { return a.s.getLatestCheckin(c) }
func (a *apiServer) GetUser(c echo.Context, _ openapi.UserID) error {
	return a.s.getUser(c)
}
func (a *apiServer) GetLocation(c echo.Context, _ openapi.LocationID) error {
	return a.s.getLocation(c)
}
func (a *apiServer) GetUserRecentCheckins(c echo.Context, _ openapi.UserID) error {
	return a.s.getUserRecentCheckins(c)
}
func (a *apiServer) GetLocationDaily(c echo.Context, _ openapi.LocationID) error {
	return a.s.getLocationDaily(c)
}
func (a *apiServer) GetLocationLeaderboard(c echo.Context) error {
	return a.s.getLocationLeaderboard(c)
}
func (a *apiServer) GetUserLeaderboard(c echo.Context) error { return a.s.getUserLeaderboard(c) }
func (a *apiServer) GetHealthz(c echo.Context) error         { return a.s.healthz(c) }
func (a *apiServer) GetReadyz(c echo.Context) error          { return a.s.readyz(c) }
func (a *apiServer) GetOpenAPIJSON(c echo.Context) error     { return a.docs.specJSON(c) }
func (a *apiServer) GetOpenAPIYAML(c echo.Context) error     { return a.docs.specYAML(c) }
func (a *apiServer) GetDocs(c echo.Context) error            { return a.docs.page(c) }
func (a *apiServer) GetDocsAsset(c echo.Context, file string) error {
	return a.docs.asset(c, file)
}

// Ops listener.

func (a *apiServer) GetOpsStatus(c echo.Context) error  { return a.ops.getStatus(c) }
func (a *apiServer) ListOpsPoison(c echo.Context) error { return a.ops.listPoison(c) }
func (a *apiServer) ShowOpsPoison(c echo.Context, _ openapi.PoisonID) error {
	return a.ops.showPoison(c)
}
func (a *apiServer) ReplayOpsPoisonEntry(c echo.Context, _ openapi.PoisonID) error {
	return a.ops.replayOne(c)
}
func (a *apiServer) ReplayOpsPoison(c echo.Context) error { return a.ops.replayAll(c) }
func (a *apiServer) PurgeOpsPoisonEntry(c echo.Context, _ openapi.PoisonID) error {
	return a.ops.purgeOne(c)
}
func (a *apiServer) PurgeOpsPoison(c echo.Context) error     { return a.ops.purgeAll(c) }
func (a *apiServer) ListOpsProjections(c echo.Context) error { return a.ops.listProjections(c) }
func (a *apiServer) RebuildOpsProjection(c echo.Context, _ string) error {
	return a.ops.rebuild(c)
}
func (a *apiServer) GetMetrics(c echo.Context) error {
	a.metrics.ServeHTTP(c.Response(), c.Request())
	return nil
}

// RegisterMetricsRoute adds GET /metrics, served by h (the Prometheus handler), to e.
func RegisterMetricsRoute(e *echo.Echo, h http.Handler) {
	registerAPI(e, &apiServer{metrics: h}, partMetrics)
}
