package ports

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/app/query"
	"github.com/checkins/checkins/domain"
)

// uiFiles are the dashboard's templates, its own script and style, and the vendored libraries
// (htmx, its SSE extension, uPlot: copied from their npm packages with their licences; the
// sha256 of each is in ui/vendor/SHA256SUMS and checked by a test). No CDN, no build step.
//
//go:embed ui/templates/*.html ui/static ui/vendor
var uiFiles embed.FS

// UIConfig wires the dashboard to the same operations as /ops and the CLI.
type UIConfig struct {
	// App holds the operations' use cases (status, the poison queue, projection versions and
	// rebuilds) and the read queries (Explore), the same as /ops and the CLI verbs use.
	App app.Application
	// Projection names this build knows (the poison filter, purge-all's confirmation).
	Names []string
	// MaxClients caps the open event streams (0: DefaultUIMaxClients); Heartbeat is the idle
	// stream's comment interval (0: DefaultUIHeartbeat).
	MaxClients int
	Heartbeat  time.Duration
	// SharedPort: the ops routes share the public listener (OPS_ADDR = HTTP_ADDR), so GET /
	// sends a browser to the dashboard.
	SharedPort bool
	Logger     *slog.Logger
}

// UI is the operations dashboard under /ui/ on the ops listener.
type UI struct {
	srv  *HTTPServer
	cfg  UIConfig
	log  *slog.Logger
	tmpl *template.Template
	hub  *uiHub
}

// UIAssets are the dashboard's embedded files (templates, static, vendor), for the test that
// checks the vendored files against their recorded sha256.
func UIAssets() fs.FS { return uiFiles }

// parseUITemplates parses the dashboard's templates with their functions.
func parseUITemplates() (*template.Template, error) {
	return template.New("ui").Funcs(template.FuncMap{
		"ts": func(t time.Time) string {
			if t.IsZero() {
				return "-"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
		"tsp": func(t *time.Time) string {
			if t == nil {
				return "-"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
		"lag": func(l *int64) string {
			if l == nil {
				return "?"
			}
			return strconv.FormatInt(*l, 10)
		},
		"lagn": func(l int64) string {
			if l < 0 {
				return "?"
			}
			return strconv.FormatInt(l, 10)
		},
		"rate": func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
		"sub":  func(a, b int64) int64 { return a - b },
	}).ParseFS(uiFiles, "ui/templates/*.html")
}

// RegisterUI adds the dashboard to the ops router, and GET / on the public one. Run samples
// the status for it until the service stops.
func RegisterUI(s *HTTPServer, cfg UIConfig) (*UI, error) {
	q, c := cfg.App.Queries, cfg.App.Commands
	if q.Status == nil || q.ListPoisoned == nil || q.ProjectionVersions == nil || c.ReplayPoisoned == nil ||
		c.PurgePoisoned == nil || c.RebuildProjection == nil || cfg.Logger == nil {
		return nil, errors.New("ports: the dashboard needs the status, poison and projection use cases and a Logger")
	}
	tmpl, err := parseUITemplates()
	if err != nil {
		return nil, fmt.Errorf("ports: dashboard templates: %w", err)
	}
	u := &UI{srv: s, cfg: cfg, log: cfg.Logger, tmpl: tmpl,
		hub: newUIHub(q.Status.Status, cfg.MaxClients, cfg.Heartbeat, cfg.Logger)}
	static, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		return nil, err
	}
	e := s.ops
	// Every state-changing route of the ops listener, these included, refuses what a browser
	// marks as sent by another site (crossOriginProtection, in NewHTTPServer).
	g := e.Group("/ui")
	getHead(e.Add, "/ui", func(c echo.Context) error { return c.Redirect(http.StatusMovedPermanently, "/ui/") })
	for _, dir := range []string{"static", "vendor"} {
		getHead(g.Add, "/"+dir+"/*", func(c echo.Context) error {
			name := dir + "/" + strings.TrimPrefix(c.Param("*"), "/")
			b, err := fs.ReadFile(static, name)
			if err != nil || !fs.ValidPath(name) {
				return echo.ErrNotFound
			}
			ct := mime.TypeByExtension(path.Ext(name))
			if ct == "" {
				ct = "text/plain; charset=utf-8" // LICENSE, SHA256SUMS
			}
			c.Response().Header().Set(echo.HeaderCacheControl, "public, max-age=3600")
			return c.Blob(http.StatusOK, ct, b)
		})
	}
	getHead(g.Add, "/login", u.loginPage)
	g.POST("/login", u.login)
	g.POST("/logout", u.logout)
	getHead(g.Add, "/", u.overview)
	g.GET("/events", u.serveEvents) // no HEAD: a stream that never ends
	getHead(g.Add, "/poison", u.poisonPage)
	getHead(g.Add, "/poison/table", u.poisonTable)
	getHead(g.Add, "/poison/entry/:id", u.poisonEntry)
	g.POST("/poison/entry/:id/replay", u.replayOne)
	g.POST("/poison/entry/:id/purge", u.purgeOne)
	g.POST("/poison/replay-all", u.replayAll)
	g.POST("/poison/purge-all", u.purgeAll)
	getHead(g.Add, "/projections", u.projectionsPage)
	getHead(g.Add, "/projections/table", u.projectionsTable)
	g.POST("/projections/:name/rebuild", u.rebuild)
	getHead(g.Add, "/explore", u.explore)
	getHead(s.echo.Add, "/", u.root)
	return u, nil
}

// getHead adds a GET route and its HEAD twin through add (Echo's or a group's Add): HEAD
// wherever GET, as the API's routes (partRouter.GET); net/http drops a HEAD answer's body.
func getHead(add func(method, path string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route, path string, h echo.HandlerFunc) {
	add(http.MethodGet, path, h)
	add(http.MethodHead, path, h)
}

// Run samples the status every second until ctx ends, then ends every open event stream.
func (u *UI) Run(ctx context.Context) error { return u.hub.run(ctx) }

// root is GET / on the public listener: a browser goes to the dashboard when it shares this
// port, else to the API reference (/docs) when this build has one; everything else gets the
// API's answer to an unknown route.
func (u *UI) root(c echo.Context) error {
	if strings.Contains(c.Request().Header.Get(echo.HeaderAccept), "text/html") {
		if u.cfg.SharedPort {
			return c.Redirect(http.StatusFound, "/ui/")
		}
		for _, r := range u.srv.echo.Routes() {
			if r.Path == "/docs" && r.Method == http.MethodGet {
				return c.Redirect(http.StatusFound, "/docs")
			}
		}
	}
	return echo.ErrNotFound
}

func (u *UI) render(c echo.Context, status int, name string, data any) error {
	var buf bytes.Buffer
	if err := u.tmpl.ExecuteTemplate(&buf, name, data); err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderCacheControl, "no-store")
	return c.HTMLBlob(status, buf.Bytes())
}

// page is what every full page's layout needs.
type page struct {
	Title  string
	Nav    string
	CanAct bool
	Auth   bool
	Flash  string
	Error  string
}

func (u *UI) page(c echo.Context, title, nav string) page {
	return page{Title: title, Nav: nav, CanAct: u.canAct(c), Auth: u.srv.cfg.Auth != nil,
		Flash: u.noteText(c, "msg"), Error: u.noteText(c, "err")}
}

type overviewView struct {
	Page   page
	Sample uiSample
	CanAct bool
}

func (u *UI) overview(c echo.Context) error {
	s, ok := u.hub.latest()
	if !ok {
		st, err := u.cfg.App.Queries.Status.Status(c.Request().Context())
		if err != nil {
			s.Err = err.Error()
		} else {
			s = deriveSample(time.Now(), st, nil)
		}
	}
	p := u.page(c, "Overview", "overview")
	return u.render(c, http.StatusOK, "overview", overviewView{Page: p, Sample: s, CanAct: p.CanAct})
}

// poisonState is where an operator is in the poison queue (filter, page size, page): links and
// actions carry it, so paging keeps the size and an action comes back to the same page.
type poisonState struct {
	Projection string
	Cursor     string
	Limit      int
}

// query is the state as a query string ("" when it is the first page of everything); at
// replaces the cursor.
func (s poisonState) query(at string) string {
	q := url.Values{}
	if s.Projection != "" {
		q.Set("projection", s.Projection)
	}
	if at != "" {
		q.Set("cursor", at)
	}
	if s.Limit != 0 && s.Limit != uiPoisonPageSize {
		q.Set("limit", strconv.Itoa(s.Limit))
	}
	return q.Encode()
}

type poisonView struct {
	Page  page
	Names []string
	poisonState
	List query.PoisonPage
	// Query is this page's; FirstQuery the first page's, NextQuery the next one's (URL typed:
	// already encoded, so a link's query keeps its & and =).
	Query, FirstQuery, NextQuery template.URL
	// Until is the newest entry when the page was made: "replay all" and "purge all" stop
	// there, so nothing parked after the operator looked is purged unseen.
	Until string
}

const uiPoisonPageSize = 20

func (u *UI) poisonData(c echo.Context) (poisonView, error) {
	v := poisonView{Names: u.cfg.Names, poisonState: poisonState{Projection: c.QueryParam("projection"), Cursor: c.QueryParam("cursor"), Limit: uiPoisonPageSize}}
	if v.Projection != "" && !slices.Contains(u.cfg.Names, v.Projection) {
		v.Projection = "" // never shown back: the page is the server's own words
		return v, &domain.ValidationError{Code: domain.CodeInvalid, Field: "projection",
			Message: "is not a projection of this build, which has " + strings.Join(u.cfg.Names, ", ")}
	}
	limit, err := queryLimit(c, uiPoisonPageSize, query.MaxPoisonListLimit)
	if err != nil {
		return v, err
	}
	v.Limit = limit
	if err := u.poisonBound(c, &v); err != nil {
		return v, err
	}
	list, err := u.cfg.App.Queries.ListPoisoned.List(c.Request().Context(), query.PoisonFilter{Projection: v.Projection, Cursor: v.Cursor, Limit: v.Limit})
	if err != nil {
		return v, err
	}
	v.List = list
	// #nosec G203 -- url.Values.Encode escapes every value
	v.Query, v.FirstQuery = template.URL(v.query(v.Cursor)), template.URL(v.query(""))
	if list.Next != "" {
		v.NextQuery = template.URL(v.query(list.Next)) // #nosec G203 -- as above
	}
	return v, nil
}

// poisonBound sets v.Until, where the page's "replay all" and "purge all" stop.
func (u *UI) poisonBound(c echo.Context, v *poisonView) error {
	until, err := u.cfg.App.Queries.ListPoisoned.Newest(c.Request().Context())
	if err != nil {
		return err
	}
	if until == "" {
		until = "0-0" // nothing was shown, so "all" is nothing
	}
	v.Until = until
	return nil
}

func (u *UI) poisonPage(c echo.Context) error {
	v, err := u.poisonData(c)
	v.Page = u.page(c, "Poison queue", "poison")
	if err != nil {
		var ve *domain.ValidationError
		if !errors.As(err, &ve) {
			return err
		}
		// The link's own text is never shown back (http_ui_notes.go): the field, and what it
		// takes, in the server's words.
		v.Cursor, v.Limit = "", uiPoisonPageSize
		// The page is the first one of its filter: its live table keeps the filter, and its
		// bulk forms a bound (without one, "purge all" went up to the newest entry when clicked).
		// #nosec G203 -- url.Values.Encode escapes every value
		v.Query, v.FirstQuery = template.URL(v.query("")), template.URL(v.query(""))
		if err := u.poisonBound(c, &v); err != nil {
			return err
		}
		switch ve.Field {
		case "cursor":
			v.Page.Error = "invalid cursor: not a poison entry ID like 1700000000000-0"
		case "limit":
			v.Page.Error = fmt.Sprintf("invalid limit: a number from 1 to %d", query.MaxPoisonListLimit)
		default:
			v.Page.Error = "invalid " + ve.Field + ": " + ve.Message
		}
		return u.render(c, http.StatusBadRequest, "poison", v)
	}
	return u.render(c, http.StatusOK, "poison", v)
}

// poisonTable is the live part of the poison page (refreshed on every tick).
func (u *UI) poisonTable(c echo.Context) error {
	v, err := u.poisonData(c)
	if err != nil {
		return err
	}
	v.Page = u.page(c, "", "poison")
	return u.render(c, http.StatusOK, "poison_table", v)
}

type poisonEntryView struct {
	Page page
	poisonState
	Back   string // the poison page the entry was opened from
	Entry  ops.PoisonEntry
	Meta   [][2]string
	Fields [][2]string
}

func (u *UI) poisonEntry(c echo.Context) error {
	id := c.Param("id")
	if ops.ValidateCursor("id", id) != nil || id == "" {
		// Not an entry ID: none of its words go on the page (a link could carry any sentence
		// into the dashboard's title and banner; found by a review).
		v := poisonEntryView{Page: u.page(c, "Poison entry", "poison"), poisonState: u.poisonStateOf(c), Back: u.poisonBack(c)}
		v.Page.Error = "not a poison entry ID (they look like 1700000000000-0)"
		return u.render(c, http.StatusBadRequest, "poison_entry", v)
	}
	e, err := u.cfg.App.Queries.ListPoisoned.Show(c.Request().Context(), id)
	v := poisonEntryView{Page: u.page(c, "Poison entry "+id, "poison"), poisonState: u.poisonStateOf(c), Back: u.poisonBack(c)}
	if err != nil {
		if errors.Is(err, domain.ErrNotFound) || ops.IsClientError(err) {
			v.Page.Error = err.Error()
			return u.render(c, http.StatusNotFound, "poison_entry", v)
		}
		return err
	}
	v.Entry = e
	v.Meta = [][2]string{
		{"poison:stream", e.Stream}, {"poison:entry_id", e.EntryID},
		{"poison:projection", e.Projection}, {"poison:group", e.Group},
		{"poison:version", strconv.Itoa(e.Version)}, {"poison:error", e.Error},
		{"poison:attempts", strconv.Itoa(e.Attempts)}, {"poison:failed_at", e.FailedAt.UTC().Format(time.RFC3339Nano)},
		{"poison:decision", e.Decision},
	}
	keys := make([]string, 0, len(e.Fields))
	for k := range e.Fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v.Fields = append(v.Fields, [2]string{k, e.Fields[k]})
	}
	return u.render(c, http.StatusOK, "poison_entry", v)
}

// poisonStateOf reads the state a link or an action's form carries, leaving out what is not
// valid.
func (u *UI) poisonStateOf(c echo.Context) poisonState {
	s := poisonState{Projection: c.FormValue("projection"), Cursor: c.FormValue("cursor")}
	if !slices.Contains(u.cfg.Names, s.Projection) {
		s.Projection = ""
	}
	if ops.ValidateCursor("cursor", s.Cursor) != nil {
		s.Cursor = ""
	}
	if n, err := strconv.Atoi(c.FormValue("limit")); err == nil && n >= 1 && n <= query.MaxPoisonListLimit {
		s.Limit = n
	}
	return s
}

// poisonBack is the poison page an action came from.
func (u *UI) poisonBack(c echo.Context) string {
	s := u.poisonStateOf(c)
	if q := s.query(s.Cursor); q != "" {
		return "/ui/poison?" + q
	}
	return "/ui/poison"
}

func (u *UI) replayOne(c echo.Context) error {
	id := c.Param("id")
	res, err := u.cfg.App.Commands.ReplayPoisoned.Replay(c.Request().Context(), id)
	switch {
	case err == nil && res.Applied:
		return back(c, u.poisonBack(c), "msg", uiNote{Key: "replayed", ID: id, Name: res.Projection})
	case err == nil:
		return back(c, u.poisonBack(c), "msg", uiNote{Key: "replayed-already", ID: id, Name: res.Projection})
	case errors.Is(err, command.ErrReplayFailed):
		kept := res.NewID
		if kept == "" {
			kept = id
		}
		return back(c, u.poisonBack(c), "err", uiNote{Key: "replay-failed", ID: kept})
	case errors.Is(err, command.ErrNotReplayable):
		return back(c, u.poisonBack(c), "err", uiNote{Key: "not-replayable", ID: id})
	case errors.Is(err, domain.ErrNotFound):
		return back(c, u.poisonBack(c), "err", uiNote{Key: "not-found", ID: id})
	case ops.IsClientError(err):
		return back(c, u.poisonBack(c), "err", uiNote{Key: "bad-id"})
	}
	return err
}

func (u *UI) purgeOne(c echo.Context) error {
	id := c.Param("id")
	err := u.cfg.App.Commands.PurgePoisoned.Purge(c.Request().Context(), id)
	switch {
	case err == nil:
		return back(c, u.poisonBack(c), "msg", uiNote{Key: "purged", ID: id})
	case errors.Is(err, domain.ErrNotFound):
		return back(c, u.poisonBack(c), "err", uiNote{Key: "not-found", ID: id})
	case ops.IsClientError(err):
		return back(c, u.poisonBack(c), "err", uiNote{Key: "bad-id"})
	}
	return err
}

func (u *UI) bulkProjection(c echo.Context) (string, bool) {
	p := c.FormValue("projection")
	return p, p == "" || slices.Contains(u.cfg.Names, p)
}

// bulkNote is the banner of a bulk action that ended with err, and its kind: a bad form value
// is the caller's; an outage keeps what the run did (an error page lost it) and says it
// stopped.
func (u *UI) bulkNote(c echo.Context, n uiNote, err error) (string, uiNote) {
	switch {
	case err == nil:
		return "msg", n
	case ops.IsClientError(err):
		return "err", uiNote{Key: "bad-until"}
	}
	n.More = true
	if errors.Is(err, context.DeadlineExceeded) || c.Request().Context().Err() != nil {
		// The request's time ran out inside a Redis call: no outage, the rest is for the
		// next click.
		return "msg", n
	}
	n.Outage = true
	u.log.WarnContext(c.Request().Context(), "a dashboard bulk action stopped: Redis did not answer", "path", c.Path(), "error", err)
	return "err", n
}

// bulkAll runs a bulk action from the head of the queue to its bound, call after call, each
// continuing where the last one stopped: a call handles at most DefaultHTTPBulkLimit entries,
// other projections' included, and a page's "all" must not stop behind a thousand of them (each
// click started over at the head and did the same). It ends when the run is complete, a call
// fails, or one made no progress, and adds up what the calls did. The calls run against a
// deadline bulkReserve (or a quarter of the request's time, when shorter) before the request's:
// each call keeps a reserve of its own, but a quarter of what is left each time, so that calls in
// a row would go on until the request's deadline cut one inside a Redis command.
func bulkAll(ctx context.Context, r command.BulkRequest, run func(context.Context, command.BulkRequest) (command.BulkResult, error)) (command.BulkResult, error) {
	if d, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-min(bulkReserve, time.Until(d)/4)))
		defer cancel()
	}
	var total command.BulkResult
	for {
		res, err := run(ctx, r)
		total.Replayed += res.Replayed
		total.Gone += res.Gone
		total.Failed += res.Failed
		total.NotReplayable += res.NotReplayable
		total.Purged += res.Purged
		total.Next, total.Until, total.StoppedBy = res.Next, res.Until, res.StoppedBy
		if err != nil || res.Next == "" || res.Next == r.After || ctx.Err() != nil {
			return total, err
		}
		r.After, r.Until = res.Next, res.Until
	}
}

// bulkReserve is the time a dashboard bulk action keeps for its answer (bulkAll).
const bulkReserve = 500 * time.Millisecond

func (u *UI) replayAll(c echo.Context) error {
	p, ok := u.bulkProjection(c)
	if !ok {
		return back(c, u.poisonBack(c), "err", uiNote{Key: "unknown-projection"})
	}
	res, err := bulkAll(c.Request().Context(), command.BulkRequest{Projection: p, Until: c.FormValue("until"), Max: DefaultHTTPBulkLimit},
		u.cfg.App.Commands.ReplayPoisoned.ReplayAll)
	kind, n := u.bulkNote(c, uiNote{Key: "replayed-all", N: int64(res.Replayed), Failed: int64(res.Failed), Skipped: int64(res.NotReplayable), More: res.Next != ""}, err)
	if res.Failed+res.NotReplayable > 0 {
		kind = "err"
	}
	return back(c, u.poisonBack(c), kind, n)
}

// purgeAll deletes every entry of one projection (or of all with "all"), once the operator
// typed that name into the confirmation field.
func (u *UI) purgeAll(c echo.Context) error {
	p, ok := u.bulkProjection(c)
	if !ok {
		return back(c, u.poisonBack(c), "err", uiNote{Key: "unknown-projection"})
	}
	want := p
	if want == "" {
		want = "all"
	}
	if strings.TrimSpace(c.FormValue("confirm")) != want {
		return back(c, u.poisonBack(c), "err", uiNote{Key: "purge-unconfirmed", Name: p})
	}
	res, err := bulkAll(c.Request().Context(), command.BulkRequest{Projection: p, Until: c.FormValue("until"), Max: DefaultHTTPBulkLimit},
		u.cfg.App.Commands.PurgePoisoned.PurgeAll)
	kind, n := u.bulkNote(c, uiNote{Key: "purged-all", N: res.Purged, More: res.Next != ""}, err)
	return back(c, u.poisonBack(c), kind, n)
}

type projectionsView struct {
	Page     page
	Report   query.ProjectionsReport
	Versions []versionRow
}

// versionRow is a version with its state in one word (StateCode: the CSS class), next to
// the sentence.
type versionRow struct {
	query.ProjectionVersionStatus
	StateCode string
}

func (u *UI) projectionsData(c echo.Context, title string) (projectionsView, error) {
	rep, err := u.cfg.App.Queries.ProjectionVersions.List(c.Request().Context())
	v := projectionsView{Page: u.page(c, title, "projections"), Report: rep}
	for _, vs := range rep.Versions {
		v.Versions = append(v.Versions, versionRow{ProjectionVersionStatus: vs, StateCode: query.VersionStateCode(vs)})
	}
	return v, err
}

func (u *UI) projectionsPage(c echo.Context) error {
	v, err := u.projectionsData(c, "Projections")
	if err != nil {
		return err
	}
	return u.render(c, http.StatusOK, "projections", v)
}

func (u *UI) projectionsTable(c echo.Context) error {
	v, err := u.projectionsData(c, "")
	if err != nil {
		return err
	}
	return u.render(c, http.StatusOK, "projections_table", v)
}

func (u *UI) rebuild(c echo.Context) error {
	name := c.Param("name")
	rp, err := u.cfg.App.Commands.RebuildProjection.Start(c.Request().Context(), name)
	switch {
	case errors.Is(err, domain.ErrNotFound):
		return back(c, "/ui/projections", "err", uiNote{Key: "rebuild-unknown"})
	case errors.Is(err, command.ErrRebuildBusy):
		return back(c, "/ui/projections", "err", uiNote{Key: "rebuild-busy", Name: name})
	case err != nil:
		return err
	}
	return back(c, "/ui/projections", "msg", uiNote{Key: "rebuild-started", Name: name, From: int64(rp.From), To: int64(rp.To)})
}

// uiRecentCheckins is how many of the newest check-ins the Explore page lists.
const uiRecentCheckins = 20

type exploreView struct {
	Page      page
	UserID    string
	User      any
	UserErr   string
	Recent    any
	Location  string
	Loc       any
	LocErr    string
	ByCount   any
	ByRating  any
	Users     any
	BoardsErr string
	Latest    []query.RecordedCheckin
	LatestErr string
}

// explore looks up a user or a location and shows the leaderboards, through app.Queries like
// the public API.
func (u *UI) explore(c echo.Context) error {
	ctx := c.Request().Context()
	q := u.cfg.App.Queries
	v := exploreView{Page: u.page(c, "Explore", "explore"), UserID: c.QueryParam("user"), Location: c.QueryParam("location")}
	// What a link puts in the query is not shown back unless it is a number: a page must not
	// carry a sentence of the link's own ("Session expired. Paste your token at ...").
	id := func(s *string, what string) (int64, string) {
		n, err := strconv.ParseInt(strings.TrimSpace(*s), 10, 64)
		if err != nil || n < 1 {
			*s = "?"
			return 0, what + " must be a positive integer"
		}
		*s = strconv.FormatInt(n, 10)
		return n, ""
	}
	describe := func(err error) string {
		if errors.Is(err, domain.ErrNotFound) {
			return "no check-ins recorded yet"
		}
		return err.Error()
	}
	if v.UserID != "" {
		if n, msg := id(&v.UserID, "user"); msg != "" {
			v.UserErr = msg
		} else {
			if st, err := q.Users.Stats(ctx, n); err != nil {
				v.UserErr = describe(err)
			} else {
				v.User = st
			}
			if q.Recent.Reader != nil {
				if r, err := q.Recent.OfUser(ctx, n); err == nil {
					v.Recent = r
				}
			}
		}
	}
	if v.Location != "" {
		if n, msg := id(&v.Location, "location"); msg != "" {
			v.LocErr = msg
		} else if st, err := q.Locations.Stats(ctx, n); err != nil {
			v.LocErr = describe(err)
		} else {
			v.Loc = st
		}
	}
	if q.Leaderboards.Reader != nil {
		var err error
		if v.ByCount, err = q.Leaderboards.Locations(ctx, projection.ByCheckins, 10); err != nil {
			v.BoardsErr = err.Error()
		}
		if v.ByRating, err = q.Leaderboards.Locations(ctx, projection.ByRating, 10); err != nil {
			v.BoardsErr = err.Error()
		}
		if v.Users, err = q.Leaderboards.Users(ctx, 10); err != nil {
			v.BoardsErr = err.Error()
		}
	}
	// The newest check-ins of the last minute, newest first.
	if cs, err := q.Checkins.Newest(ctx, time.Now().Add(-time.Minute).UnixMilli(), uiRecentCheckins); err != nil {
		v.LatestErr = err.Error()
	} else {
		v.Latest = cs
	}
	return u.render(c, http.StatusOK, "explore", v)
}
