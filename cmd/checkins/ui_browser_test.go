package main

// Browser tests of the dashboard: Debian's chromium (installed by .ci/run with apt-get; never
// downloaded), driven with chromedp, against the real service on a private redis-server.
// Screenshots of each page go to $CHECKINS_UI_ARTIFACTS (default: checkins-ui-artifacts in the
// temp directory); CHECKINS_UPDATE_DOCS_SCREENSHOT=1 also writes docs/dashboard.png.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// chromiumPath is Debian's chromium package.
const chromiumPath = "/usr/bin/chromium"

// browser is one headless chromium tab and what its console reported.
type browser struct {
	t    *testing.T
	ctx  context.Context
	mu   sync.Mutex
	errs []string
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("chromium is missing (%v): apt-get install -y chromium (.ci/run does)", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromiumPath),
		chromedp.WindowSize(1280, 800), chromedp.Flag("disable-dev-shm-usage", true))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // chromium refuses to run as root with its sandbox
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	b := &browser{t: t, ctx: ctx}
	// Starts the browser; Console then reports console API calls, uncaught exceptions and the
	// browser log (where CSP violations and failed loads arrive).
	_, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("true"))
	require.NoError(t, err)
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			switch m.Type {
			case chromedp.ConsoleError, chromedp.ConsoleWarning, chromedp.ConsoleException:
				b.record(fmt.Sprintf("%s (%s) %s %s", m.Type, m.Source, m.Text, m.URL))
			}
		}
	}()
	return b
}

func (b *browser) record(s string) {
	b.mu.Lock()
	b.errs = append(b.errs, s)
	b.mu.Unlock()
}

// problems returns what the console reported since the last call.
func (b *browser) problems() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.errs
	b.errs = nil
	return out
}

func (b *browser) run(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	require.NoError(b.t, chromedp.Do(ctx, actions...))
}

// value runs one action that returns a value.
func value[T any](b *browser, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	require.NoError(b.t, err)
	return v
}

func eval[T any](b *browser, js string) T {
	b.t.Helper()
	return value(b, chromedp.Evaluate[T](js))
}

// text reads the text of the first element matching sel, once it exists. A live page swaps its
// fragments as server-sent ticks arrive, so the query and the read happen in one script: a node
// found by a CDP query and read a moment later can already have been swapped out, and chromedp
// reads a detached node's text as "" (it returns the text of visible nodes only).
func (b *browser) text(sel string) string {
	b.t.Helper()
	q, err := json.Marshal(sel)
	require.NoError(b.t, err)
	js := fmt.Sprintf(`(() => { const e = document.querySelector(%s); return e ? e.innerText : null })()`, q)
	var s *string
	require.Eventually(b.t, func() bool {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		defer cancel()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[*string](js))
		s = v
		return err == nil && v != nil
	}, 30*time.Second, 50*time.Millisecond, "no element matches %s", sel)
	return *s
}

// click clicks the first element matching sel with the mouse, as a person would. A live page
// can swap the element out between chromedp's query and its scroll and box-model calls, which
// then fail on the detached node before any mouse event is sent: query and click again.
func (b *browser) click(sel string) {
	b.t.Helper()
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
		err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(sel)))
		cancel()
		if err == nil || try == 5 || !swappedOut(err) {
			require.NoError(b.t, err, "click %s", sel)
			return
		}
	}
}

// swappedOut tells the errors of a node that left the document between query and use.
func swappedOut(err error) bool {
	if errors.Is(err, chromedp.ErrInvalidDimensions) {
		return true
	}
	m := err.Error()
	return strings.Contains(m, "No node with given id") || strings.Contains(m, "Could not find node with given id") ||
		strings.Contains(m, "detached") || strings.Contains(m, "Could not compute")
}

// login signs in through the form, as a person would.
func (b *browser) login(ops, token string) {
	b.t.Helper()
	b.run(chromedp.Navigate(ops+"/ui/login"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SetValue(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#login-submit")),
		chromedp.WaitVisible(chromedp.CSS("header .who"))) // the login page has no header: logged in
}

// live waits until the page's event stream is open.
func (b *browser) live() {
	b.t.Helper()
	b.run(chromedp.WaitVisible(chromedp.CSS("#conn.live")))
}

// eventually polls js (a boolean expression) until it holds.
func (b *browser) eventually(js, msg string) {
	b.t.Helper()
	require.Eventually(b.t, func() bool {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		defer cancel()
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
		return err == nil && ok
	}, 30*time.Second, 100*time.Millisecond, msg)
}

func artifactDir(t *testing.T) string {
	dir := os.Getenv("CHECKINS_UI_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "checkins-ui-artifacts")
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

// screenshot saves the page as a test artifact.
func (b *browser) screenshot(name string) []byte {
	b.t.Helper()
	png := value(b, chromedp.FullScreenshot(100))
	p := filepath.Join(artifactDir(b.t), name+".png")
	require.NoError(b.t, os.WriteFile(p, png, 0o644))
	b.t.Logf("screenshot: %s", p)
	return png
}

// noOverflow checks the page fits the viewport's width (wide tables scroll in their own box).
func (b *browser) noOverflow(what string) {
	b.t.Helper()
	fits := eval[bool](b, `document.documentElement.scrollWidth <= window.innerWidth + 1`)
	assert.True(b.t, fits, "%s is wider than the viewport", what)
}

func TestBrowserOverviewIsLiveWithoutConsoleErrors(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true, Projections: true})
	b := newBrowser(t)
	b.login(svc.ops, testToken(1, ports.ScopeOps))
	b.live()
	b.eventually(`!!document.querySelector("#chart-rate canvas") && !!document.querySelector("#chart-lag canvas")`, "both charts are drawn")
	// Read through the page's own DOM: the live fragment may be swapping the card in just now.
	b.eventually(`document.getElementById("stream-length").textContent === "0"`, "the stream length counter shows 0")
	points0 := eval[int](b, `Number(document.getElementById("chart-rate").dataset.points)`)
	eval[bool](b, `window.__sameDocument = true`)

	// Check-ins posted now show up in the counters and the chart with no reload.
	for i := range 25 {
		status, body, err := testPostCheckin(svc.base, fmt.Sprintf(`{"userId": %d, "locationId": 7, "starRating": 4}`, 1+i%5), nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusAccepted, status, "%v", body)
	}
	b.eventually(`document.getElementById("stream-length").textContent === "25"`, "the stream length counter reaches 25")
	b.eventually(`Number(document.getElementById("chart-rate").dataset.points) > `+strconv.Itoa(points0), "the chart gets new points")
	b.eventually(`window.__sameDocument === true`, "no reload")
	b.eventually(`[...document.querySelectorAll("#groups tr[data-group=live] .lag")].every(td => td.textContent === "0")`, "the live group catches up")
	assert.Empty(t, b.problems(), "the overview logs no console error and no CSP violation")
	b.screenshot("overview-1280x800")
	if os.Getenv("CHECKINS_UPDATE_DOCS_SCREENSHOT") == "1" {
		png := b.screenshot("overview-docs")
		require.NoError(t, os.WriteFile(filepath.Join("..", "..", "docs", "dashboard.png"), png, 0o644))
	}

	// A phone-sized viewport: the page fits, the charts shrink with it.
	b.run(chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
	b.run(chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#overview-live")))
	b.live()
	b.noOverflow("the overview at 390x844")
	b.screenshot("overview-390x844")
	b.run(chromedp.EmulateViewport(1280, 800))

	// Every other page loads clean too, at both sizes.
	for _, p := range []string{"projections", "poison", "explore"} {
		b.run(chromedp.Navigate(svc.ops+"/ui/"+p), chromedp.WaitVisible(chromedp.CSS("main h1")))
		b.live()
		b.noOverflow(p)
		b.screenshot(p + "-1280x800")
		b.run(chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile), chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("main h1")))
		b.noOverflow(p + " at 390x844")
		b.screenshot(p + "-390x844")
		b.run(chromedp.EmulateViewport(1280, 800))
	}
	b.run(chromedp.Navigate(svc.ops+"/ui/explore?user=3&location=7"), chromedp.WaitVisible(chromedp.CSS("#user-stats")))
	assert.Equal(t, "5", b.text("#user-stats tr:first-child td"), "user 3 checked in 5 times")
	assert.Equal(t, "25", b.text("#location-stats tr:first-child td"))
	b.screenshot("explore-lookup-1280x800")
	assert.Empty(t, b.problems(), "no page logs a console error or a CSP violation")

	// The check above would see a violation: an inline style is refused and reported.
	eval[bool](b, `(() => { const s = document.createElement("style"); s.textContent = "body{}"; document.head.appendChild(s); return true; })()`)
	require.Eventually(t, func() bool {
		for _, p := range b.problems() {
			if strings.Contains(p, "Content Security Policy") {
				return true
			}
		}
		return false
	}, 10*time.Second, 50*time.Millisecond, "a CSP violation reaches the test's console listener")
}

func TestBrowserPoisonPageLiveReplayAndPurge(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true, Projections: true})
	for i := range 3 {
		status, body, err := testPostCheckin(svc.base, fmt.Sprintf(`{"userId": 99, "locationId": %d, "starRating": 5}`, 10+i), nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusAccepted, status, "%v", body)
	}
	require.Eventually(t, func() bool {
		status, stats, err := testGetStats(svc.base, "/users/99")
		return err == nil && status == http.StatusOK && stats["numCheckins"] == 3
	}, 30*time.Second, 50*time.Millisecond)

	b := newBrowser(t)
	b.login(svc.ops, testToken(1, ports.ScopeOps))
	b.run(chromedp.Navigate(svc.ops+"/ui/poison"), chromedp.WaitVisible(chromedp.CSS("#poison")))
	b.live()
	eval[bool](b, `window.__sameDocument = true`)

	// Garbage XADDed to the stream is parked, and the open page lists it without a reload.
	garbage := parkGarbage(t, rdb)
	b.eventually(fmt.Sprintf(`!!document.querySelector('#poison tr[data-id="%s"]')`, garbage), "the garbage entry appears live")
	b.eventually(`window.__sameDocument === true`, "no reload")
	// Its replay button cannot help it (it is no event): the page says so and keeps it.
	b.click(fmt.Sprintf(`#poison tr[data-id="%s"] button.replay`, garbage))
	b.run(chromedp.WaitVisible(chromedp.CSS("p.error")))
	assert.Contains(t, b.text("p.error"), "cannot be replayed")
	b.run(chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#poison tr[data-id="%s"]`, garbage))))
	b.screenshot("poison-1280x800")

	// A check-in the users projection gave up on (a handler bug, since fixed): the page lists it
	// live, its replay button counts it once, and removes it.
	ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "ui-replay", UserID: 99, LocationID: 20, StarRating: 3, Timestamp: time.Now().UnixMilli()}, RecordedAt: time.Now().UnixMilli()}
	parked, err := adapters.NewPoisonQueue(client, keys).Park(context.Background(), ops.PoisonEntry{Stream: keys.Stream(), EntryID: "1-1",
		Projection: "users", Group: "users.v1", Version: 1, Error: "handler bug", Attempts: 5, FailedAt: time.Now(), Fields: ev.Fields()})
	require.NoError(t, err)
	b.eventually(fmt.Sprintf(`!!document.querySelector('#poison tr[data-id="%s"]')`, parked), "the parked check-in appears live")
	b.click(fmt.Sprintf(`#poison tr[data-id="%s"] a`, parked))
	b.run(chromedp.WaitVisible(chromedp.CSS("#poison-meta")))
	meta, fields := b.text("#poison-meta"), b.text("#poison-fields")
	assert.Contains(t, meta, "poison:error")
	assert.Contains(t, meta, "handler bug")
	assert.Contains(t, fields, "ui-replay")
	b.screenshot("poison-entry-1280x800")
	b.run(chromedp.Click(chromedp.CSS("button.replay")), chromedp.WaitVisible(chromedp.CSS("p.flash")))
	assert.Contains(t, b.text("p.flash"), "replayed "+parked)
	b.eventually(fmt.Sprintf(`!document.querySelector('#poison tr[data-id="%s"]')`, parked), "the replayed entry is gone")
	status, stats, err := testGetStats(svc.base, "/users/99")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, int64(4), stats["numCheckins"], "the replay counted the check-in exactly once")
	st, locStats, err := testGetStats(svc.base, "/locations/20")
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, st, "the replay went to users only: %v", locStats)

	// Purge-all needs the typed name: a wrong one purges nothing.
	b.run(chromedp.Navigate(svc.ops+"/ui/poison"), chromedp.WaitVisible(chromedp.CSS("#purge-all-form")))
	b.run(chromedp.SetValue(chromedp.CSS("#confirm"), "users"), chromedp.Click(chromedp.CSS("#purge-all")), chromedp.WaitVisible(chromedp.CSS("p.error")))
	assert.Contains(t, b.text("p.error"), `type "all"`)
	n, err := client.XLen(context.Background(), keys.PoisonStream()).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "nothing purged")
	b.run(chromedp.SetValue(chromedp.CSS("#confirm"), "all"), chromedp.Click(chromedp.CSS("#purge-all")), chromedp.WaitVisible(chromedp.CSS("p.flash")))
	assert.Contains(t, b.text("p.flash"), "purged 1 entries")
	b.eventually(`!!document.querySelector("#poison td.empty")`, "the queue is empty")
	n, err = client.XLen(context.Background(), keys.PoisonStream()).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(0), n)
	assert.Empty(t, b.problems())
}

func TestBrowserRebuildFromTheProjectionsPage(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0",
		"PROJECTION_POLL_INTERVAL": "200ms", "PROJECTION_RETIRE_GRACE": "3s"}, Mode{API: true, Projections: true})
	for i := range 40 {
		status, body, err := testPostCheckin(svc.base, fmt.Sprintf(`{"userId": %d, "locationId": 3, "starRating": 2}`, 1+i%4), nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusAccepted, status, "%v", body)
	}
	b := newBrowser(t)
	b.login(svc.ops, testToken(1, ports.ScopeOps))
	b.run(chromedp.Navigate(svc.ops+"/ui/projections"), chromedp.WaitVisible(chromedp.CSS("#projections")))
	b.live()
	assert.Equal(t, "v1", b.text(`#projections tr[data-projection="users"] .serving`))
	b.click(`#projections tr[data-projection="users"] button.rebuild`)
	b.run(chromedp.WaitVisible(chromedp.CSS("p.flash")))
	assert.Contains(t, b.text("p.flash"), "rebuild of users started: v1 to v2")
	eval[bool](b, `window.__states = new Set(); setInterval(() => document.querySelectorAll('#rebuilds tr[data-projection="users"] .rebuild-state').forEach(td => window.__states.add(td.textContent)), 50); true`)
	b.eventually(`!!document.querySelector('#rebuilds tr[data-projection="users"]') && window.__states.size > 0`, "the rebuild shows on the page")
	b.screenshot("projections-rebuild-1280x800")
	b.eventually(`document.querySelector('#projections tr[data-projection="users"] .serving').textContent === "v2"`, "v2 serves, live")
	// The sampled states, not the cell: the page can show "done" before the 50 ms sampler saw it.
	b.eventually(`window.__states.has("done")`, "the rebuild ends")
	states := eval[[]string](b, `[...window.__states]`)
	assert.Contains(t, states, "retiring", "the progress went through the switch: %v", states)
	assert.Contains(t, states, "done", "%v", states)
	for u := int64(1); u <= 4; u++ {
		status, stats, err := testGetStats(svc.base, fmt.Sprintf("/users/%d", u))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
		assert.Equal(t, int64(10), stats["numCheckins"], "user %d from the rebuilt v2", u)
	}
	b.screenshot("projections-1280x800")
	assert.Empty(t, b.problems())
}

func TestBrowserReadOnlyViewerSeesNoActions(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true, Projections: true})
	garbage := parkGarbage(t, rdb)
	b := newBrowser(t)
	b.login(svc.ops, testToken(2, ports.ScopeOpsRead))
	for _, p := range []string{"/ui/", "/ui/poison", "/ui/poison/entry/" + garbage, "/ui/projections", "/ui/explore"} {
		b.run(chromedp.Navigate(svc.ops+p), chromedp.WaitVisible(chromedp.CSS("main h1")))
		buttons := eval[int](b, `document.querySelectorAll('main form[method=post] button, button.replay, button.purge, button.rebuild, #purge-all, #replay-all').length`)
		assert.Zero(t, buttons, "%s shows a read-only viewer %d action buttons", p, buttons)
	}
	b.run(chromedp.Navigate(svc.ops+"/ui/poison"), chromedp.WaitVisible(chromedp.CSS("#poison")))
	listed := eval[bool](b, fmt.Sprintf(`!!document.querySelector('#poison tr[data-id="%s"]')`, garbage))
	assert.True(t, listed, "a read-only viewer still sees the queue")
	b.screenshot("poison-read-only-1280x800")
	// A POST forged from the page itself (same origin, the cookie goes along) is refused.
	status := value(b, chromedp.Evaluate[int](`fetch("/ui/poison/purge-all", {method: "POST", body: new URLSearchParams({confirm: "all"})}).then(r => r.status)`,
		chromedp.EvalAwaitPromise))
	assert.Equal(t, http.StatusForbidden, status)
	n, err := redistest.Client(t, rdb.URL).XLen(context.Background(), adapters.KeySpace{Prefix: rdb.Prefix}.PoisonStream()).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "nothing purged")
}

// TestBrowserExpiredSessionGoesToTheLogin: once the token a dashboard logged in with expires, the
// open page's event stream ends with a "bye" and the page sends the browser to the login,
// which brings it back to where it was.
func TestBrowserExpiredSessionGoesToTheLogin(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0",
		"UI_HEARTBEAT": "200ms", "AUTH_CLOCK_LEEWAY": "0s"}, Mode{API: true})
	short := shortLivedToken(t, 1, 8*time.Second, ports.ScopeOpsRead) // long enough to log in and load the page on a busy machine
	b := newBrowser(t)
	b.login(svc.ops, short)
	b.run(chromedp.Navigate(svc.ops+"/ui/projections"), chromedp.WaitVisible(chromedp.CSS("#projections-live")))
	b.live()
	b.eventually(`location.pathname === "/ui/login" && new URLSearchParams(location.search).get("next") === "/ui/projections"`,
		"the expired session is sent to the login, to come back to the projections page")
}

// TestBrowserExpiredSessionOnAFragmentGoesToTheLogin: a fragment htmx fetches once the session
// has expired sends the whole page to the login, not the login page into the fragment. The
// stream's "bye" would reload the page first, so the test keeps it from the page's script.
func TestBrowserExpiredSessionOnAFragmentGoesToTheLogin(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0",
		"UI_HEARTBEAT": "200ms", "AUTH_CLOCK_LEEWAY": "0s"}, Mode{API: true})
	short := shortLivedToken(t, 1, 8*time.Second, ports.ScopeOpsRead) // long enough to log in and load the page on a busy machine
	b := newBrowser(t)
	b.login(svc.ops, short)
	b.run(chromedp.Navigate(svc.ops+"/ui/poison?limit=5"), chromedp.WaitVisible(chromedp.CSS("#poison")))
	eval[bool](b, `window.addEventListener("htmx:sseMessage", e => { if (e.detail && e.detail.type === "bye") { e.stopImmediatePropagation(); } }, true); true`)
	require.Eventually(t, func() bool {
		resp, _ := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/poison/table", cookie: short})
		return resp.StatusCode != http.StatusOK
	}, 30*time.Second, 100*time.Millisecond, "the token expires")
	// What the page does on every tick (a last tick may have done it already, and the page be
	// at the login).
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	_, _ = chromedp.Run(ctx, chromedp.Evaluate[bool](`window.htmx && htmx.ajax("GET", "/ui/poison/table?limit=5", {target: "#poison-live", swap: "innerHTML"}); true`))
	cancel()
	b.eventually(`location.pathname === "/ui/login" && new URLSearchParams(location.search).get("next") === "/ui/poison?limit=5"`,
		"the page goes to the login, to come back to the poison page")
	assert.Zero(t, eval[int](b, `document.querySelectorAll("#poison-live").length`), "no login page inside the poison page")
}
