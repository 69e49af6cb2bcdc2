package main

// HTTP-level tests of the dashboard (/ui/ on the ops listener): login and its cookie, scopes,
// cross-origin protection, GET / for browsers, and the event stream's lifetime. The browser tests
// are in ui_browser_test.go.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// uiClient follows no redirects and keeps no cookies: each test says what it sends.
var uiClient = &http.Client{Timeout: 10 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

type uiReq struct {
	method, url string
	form        url.Values
	cookie      string // the login cookie's value
	header      map[string]string
}

func uiDo(t *testing.T, r uiReq) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if r.form != nil {
		body = strings.NewReader(r.form.Encode())
	}
	req, err := http.NewRequest(r.method, r.url, body)
	require.NoError(t, err)
	if r.form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if r.cookie != "" {
		req.AddCookie(&http.Cookie{Name: ports.UICookie, Value: r.cookie})
	}
	for k, v := range r.header {
		req.Header.Set(k, v)
	}
	resp, err := uiClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// uiLogin posts token to the login form and returns the cookie the service set.
func uiLogin(t *testing.T, ops, token string) *http.Cookie {
	t.Helper()
	resp, body := uiDo(t, uiReq{method: http.MethodPost, url: ops + "/ui/login", form: url.Values{"token": {token}, "next": {"/ui/poison"}}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	require.Equal(t, "/ui/poison", resp.Header.Get("Location"))
	for _, c := range resp.Cookies() {
		if c.Name == ports.UICookie {
			return c
		}
	}
	t.Fatalf("login set no %s cookie: %v", ports.UICookie, resp.Header.Values("Set-Cookie"))
	return nil
}

// parkGarbage XADDs an entry that is no event to the stream and waits until it is parked.
func parkGarbage(t *testing.T, rdb redistest.Env) string {
	t.Helper()
	c := redistest.Client(t, rdb.URL)
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	before, err := c.XLen(context.Background(), keys.PoisonStream()).Result()
	require.NoError(t, err)
	require.NoError(t, c.XAdd(context.Background(), &redis.XAddArgs{Stream: keys.Stream(), Values: []any{"garbage", "not an event"}}).Err())
	var id string
	require.Eventually(t, func() bool {
		n, err := c.XLen(context.Background(), keys.PoisonStream()).Result()
		if err != nil || n <= before {
			return false
		}
		xs, err := c.XRevRangeN(context.Background(), keys.PoisonStream(), "+", "-", 1).Result()
		if err != nil || len(xs) == 0 {
			return false
		}
		id = xs[0].ID
		return true
	}, 30*time.Second, 50*time.Millisecond, "the garbage entry is parked")
	return id
}

func TestUILoginCookieScopesAndCrossOrigin(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true, Projections: true})
	require.NotEqual(t, svc.base, svc.ops)
	id := parkGarbage(t, rdb)

	// A browser without the cookie is sent to the login page; a script gets 401.
	resp, _ := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/poison?projection=users"})
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, "/ui/login?next="+url.QueryEscape("/ui/poison?projection=users"), resp.Header.Get("Location"))
	resp, _ = uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/events"})
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/login"})
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `name="token"`)
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'self'")

	// Bad tokens are refused with the reason, and set no cookie.
	for token, want := range map[string]string{
		"":                                   "paste a token",
		"not-a-token":                        "token refused",
		testToken(3):                         "neither scope",
		strings.Repeat("a", 9<<10):           "too large",
		testToken(3, ports.ScopeOpsRead)[1:]: "token refused",
	} {
		resp, body := uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + "/ui/login", form: url.Values{"token": {token}}})
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "token %.20q", token)
		assert.Contains(t, body, want, "token %.20q", token)
		assert.Empty(t, resp.Cookies(), "token %.20q", token)
	}
	// A post-login redirect stays on the dashboard.
	resp, _ = uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + "/ui/login", form: url.Values{"token": {testToken(3, ports.ScopeOpsRead)}, "next": {"//evil.example/ui/"}}})
	assert.Equal(t, "/ui/", resp.Header.Get("Location"))

	read := uiLogin(t, svc.ops, testToken(3, ports.ScopeOpsRead))
	assert.True(t, read.HttpOnly)
	assert.Equal(t, http.SameSiteStrictMode, read.SameSite)
	assert.Equal(t, "/ui", read.Path)
	assert.False(t, read.Secure, "plain HTTP: a Secure cookie would never come back")
	// Behind a proxy that speaks HTTPS to the browser (the ops listener never speaks TLS itself),
	// the cookie is Secure.
	resp, _ = uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + "/ui/login", form: url.Values{"token": {testToken(3, ports.ScopeOpsRead)}},
		header: map[string]string{"X-Forwarded-Proto": "https"}})
	require.Len(t, resp.Cookies(), 1)
	assert.True(t, resp.Cookies()[0].Secure, "HTTPS at the proxy")
	assert.WithinDuration(t, time.Now().Add(6*time.Hour), read.Expires, 2*time.Minute, "the cookie expires with the token")
	ops := uiLogin(t, svc.ops, testToken(4, ports.ScopeOps))

	// Read-only: the pages show no action, and the server refuses the actions anyway.
	for _, page := range []string{"/ui/", "/ui/poison", "/ui/poison/entry/" + id, "/ui/projections", "/ui/explore?user=1&location=2"} {
		resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + page, cookie: read.Value})
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", page, body)
		assert.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html"), page)
		assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'self'", page)
		assert.NotContains(t, body, `method="post" action="/ui/poison`, "%s shows a read-only viewer an action", page)
		assert.NotContains(t, body, `/rebuild"`, "%s shows a read-only viewer an action", page)
		assert.Contains(t, body, "read-only", page)
	}
	_, body = uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/poison", cookie: read.Value})
	assert.Contains(t, body, id, "the parked entry is listed")
	for _, action := range []string{"/ui/poison/entry/" + id + "/purge", "/ui/poison/entry/" + id + "/replay", "/ui/poison/purge-all", "/ui/poison/replay-all", "/ui/projections/users/rebuild"} {
		resp, body := uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + action, cookie: read.Value, form: url.Values{"confirm": {"all"}}})
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, "%s with a read-only cookie: %s", action, body)
		assert.Contains(t, body, ports.CodeInsufficientScope, action)
	}
	for _, page := range []string{"/ui/poison", "/ui/projections"} {
		_, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + page, cookie: ops.Value})
		assert.Contains(t, body, "operator", page)
		assert.Contains(t, body, `method="post"`, "%s shows an operator the actions", page)
	}

	// The cookie is the dashboard's only: /ops takes a bearer token.
	resp, _ = uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ops/status", cookie: ops.Value})
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	// Cross-site POSTs are refused before they act, whatever the cookie.
	for name, h := range map[string]map[string]string{
		"Sec-Fetch-Site cross-site": {"Sec-Fetch-Site": "cross-site"},
		"Sec-Fetch-Site same-site":  {"Sec-Fetch-Site": "same-site"},
		"foreign Origin":            {"Origin": "http://evil.example"},
	} {
		for _, action := range []string{"/ui/poison/entry/" + id + "/purge", "/ui/login"} {
			form := url.Values{"token": {testToken(4, ports.ScopeOps)}}
			resp, body := uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + action, cookie: ops.Value, header: h, form: form})
			assert.Equal(t, http.StatusForbidden, resp.StatusCode, "%s %s: %s", name, action, body)
			assert.Contains(t, body, "cross_origin", name)
			assert.Empty(t, resp.Cookies(), name)
		}
	}
	_, body = uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/poison/entry/" + id, cookie: ops.Value})
	assert.Contains(t, body, adapters.PoisonFieldError, "the entry is still there")
	assert.Contains(t, body, "garbage", "the original fields are shown")

	// From the dashboard itself (same origin), the operator's purge works.
	resp, _ = uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + "/ui/poison/entry/" + id + "/purge", cookie: ops.Value,
		header: map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": svc.ops}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Location"), "msg=purged")
	resp, body = uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/poison/entry/" + id, cookie: ops.Value})
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, body)

	// Logging out clears the cookie.
	resp, _ = uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + "/ui/logout", cookie: ops.Value})
	require.Len(t, resp.Cookies(), 1)
	assert.Equal(t, -1, resp.Cookies()[0].MaxAge)

	// The public listener has no dashboard; GET / sends a browser to the API's docs page there,
	// and is the API's 404 for anything else.
	for _, p := range []string{"/ui/", "/ui/login"} {
		resp, _ := uiDo(t, uiReq{method: http.MethodGet, url: svc.base + p})
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, p)
	}
	resp, _ = uiDo(t, uiReq{method: http.MethodGet, url: svc.base + "/", header: map[string]string{"Accept": "text/html"}})
	assert.Equal(t, http.StatusFound, resp.StatusCode)
	assert.Equal(t, "/docs", resp.Header.Get("Location"))
	resp, body = uiDo(t, uiReq{method: http.MethodGet, url: svc.base + "/", header: map[string]string{"Accept": "application/json"}})
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, body, `"code":"not_found"`)
}

func TestUIRootRedirectsABrowserOnASharedPort(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}, Mode{API: true, Projections: true})
	require.Equal(t, svc.base, svc.ops)
	resp, _ := uiDo(t, uiReq{method: http.MethodGet, url: svc.base + "/", header: map[string]string{"Accept": "text/html,application/xhtml+xml"}})
	assert.Equal(t, http.StatusFound, resp.StatusCode)
	assert.Equal(t, "/ui/", resp.Header.Get("Location"))
	resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.base + "/", header: map[string]string{"Accept": "application/json"}})
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "a client that is no browser gets the API's answer")
	assert.Contains(t, body, `"code":"not_found"`)
	resp, _ = uiDo(t, uiReq{method: http.MethodGet, url: svc.base + "/ui/"})
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode, "the dashboard is served on the shared port")
	resp, _ = uiDo(t, uiReq{method: http.MethodGet, url: svc.base + "/ui/vendor/htmx/htmx.min.js"})
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the vendored files need no login")
	assert.Equal(t, "text/javascript; charset=utf-8", resp.Header.Get("Content-Type"))
	resp, _ = uiDo(t, uiReq{method: http.MethodGet, url: svc.base + "/ui/vendor/../templates/layout.html"})
	assert.NotEqual(t, http.StatusOK, resp.StatusCode)
}

// sseEvent is one event of /ui/events, or a comment (Event "", Comment set).
type sseEvent struct {
	Event, Data, Comment string
}

// readSSE reads an event stream as a browser does: a line ends at "\r\n", "\n" or a bare "\r".
func readSSE(r io.Reader, out chan<- sseEvent) {
	defer close(out)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		i := bytes.IndexAny(data, "\r\n")
		switch {
		case i < 0 && atEOF && len(data) > 0:
			return len(data), data, nil
		case i < 0, data[i] == '\r' && i+1 == len(data) && !atEOF: // "\r\n" may be cut
			return 0, nil, nil
		case data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n':
			return i + 2, data[:i], nil
		}
		return i + 1, data[:i], nil
	})
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev != (sseEvent{}) {
				out <- ev
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, ":"):
			out <- sseEvent{Comment: strings.TrimSpace(line[1:])}
		case strings.HasPrefix(line, "event: "):
			ev.Event = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			if ev.Data != "" {
				ev.Data += "\n"
			}
			ev.Data += line[len("data: "):]
		}
	}
}

func openSSE(t *testing.T, url, token string) (*http.Response, chan sseEvent) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{}).Do(req) // no client timeout: the stream is long
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	ch := make(chan sseEvent, 1024)
	if resp.StatusCode == http.StatusOK {
		go readSSE(resp.Body, ch)
	}
	return resp, ch
}

// TestUIEventStreamKeepsNamesFromRedisInsideTheirEvent: a consumer group whose name holds bare
// "\r" (anyone who can write to Redis can make one) is shown in the overview, and cannot end
// the event or start one of its own, such as the "bye" that sends every open page to the login.
func TestUIEventStreamKeepsNamesFromRedisInsideTheirEvent(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	evil := "evil\r\revent: bye\rdata: session ended: injected"
	require.NoError(t, client.XGroupCreateMkStream(t.Context(), adapters.KeySpace{Prefix: rdb.Prefix}.Stream(), evil, "$").Err())
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	resp, events := openSSE(t, svc.ops+"/ui/events", testToken(5, ports.ScopeOpsRead))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	overviews := 0
	for overviews < 3 {
		select {
		case ev, ok := <-events:
			require.True(t, ok, "the stream ended")
			require.NotEqual(t, "bye", ev.Event, "an event made of a group's name: %q", ev.Data)
			if ev.Event == "overview" && strings.Contains(ev.Data, "evil") {
				overviews++
				assert.Contains(t, ev.Data, "data: session ended: injected", "the name, as text of the overview")
			}
		case <-time.After(15 * time.Second):
			t.Fatal("no overview naming the group within 15s")
		}
	}
}

// TestUIEventStreamOutlivesTimeoutsAndEndsOnShutdown: the stream lasts past REQUEST_TIMEOUT and
// the listener's read and write timeouts, sends samples and heartbeats, is capped, and ends when
// the service stops, without holding up the graceful shutdown.
func TestUIEventStreamOutlivesTimeoutsAndEndsOnShutdown(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0",
		"REQUEST_TIMEOUT": "300ms", "HTTP_READ_HEADER_TIMEOUT": "500ms", "HTTP_READ_TIMEOUT": "500ms", "HTTP_WRITE_TIMEOUT": "500ms",
		"UI_HEARTBEAT": "200ms", "UI_MAX_STREAMS": "2", "DRAIN_TIMEOUT": "5s"}, Mode{API: true, Projections: true})
	token := testToken(5, ports.ScopeOpsRead)
	resp, events := openSSE(t, svc.ops+"/ui/events", token)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	resp2, _ := openSSE(t, svc.ops+"/ui/events", token)
	require.Equal(t, http.StatusOK, resp2.StatusCode)
	resp3, _ := openSSE(t, svc.ops+"/ui/events", token)
	assert.Equal(t, http.StatusServiceUnavailable, resp3.StatusCode, "UI_MAX_STREAMS=2")
	b, _ := io.ReadAll(resp3.Body)
	assert.Contains(t, string(b), "too_many_streams")

	start := time.Now()
	counts := map[string]int{}
	var chart string
	for time.Since(start) < 3*time.Second { // six times every timeout above
		select {
		case ev, ok := <-events:
			require.True(t, ok, "the stream ended after %s", time.Since(start))
			if ev.Comment != "" {
				counts[":"+ev.Comment]++
			}
			counts[ev.Event]++
			if ev.Event == "chart" {
				chart = ev.Data
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no event for 5s")
		}
	}
	assert.GreaterOrEqual(t, counts["tick"], 2, "one sample a second: %v", counts)
	assert.GreaterOrEqual(t, counts["overview"], 2, "%v", counts)
	assert.GreaterOrEqual(t, counts[":heartbeat"], 3, "UI_HEARTBEAT=200ms: %v", counts)
	var cd struct {
		T      []int64             `json:"t"`
		Rate   []*float64          `json:"rate"`
		Lag    map[string][]*int64 `json:"lag"`
		Groups []string            `json:"groups"`
	}
	require.NoError(t, json.Unmarshal([]byte(chart), &cd), chart)
	assert.Len(t, cd.Rate, len(cd.T))
	assert.Contains(t, cd.Groups, "live")

	// Shutdown ends the stream with a last event, and the listeners stop without waiting for
	// DRAIN_TIMEOUT (Run would return the shutdown's deadline error).
	require.NoError(t, svc.stop(t))
	var last string
	for ev := range events {
		if ev.Event != "" {
			last = ev.Event
		}
	}
	assert.Equal(t, "bye", last)
}

// TestUIEventStreamEndsWhenItsTokenExpires: a dashboard stream opened with a token is not
// authorized for ever: once the token has expired it ends with a "bye" that says why (the page
// then sends the browser to the login), as any other request with the token would be refused.
func TestUIEventStreamEndsWhenItsTokenExpires(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0",
		"UI_HEARTBEAT": "200ms", "AUTH_CLOCK_LEEWAY": "0s"}, Mode{API: true})
	short := shortLivedToken(t, 5, 2*time.Second, ports.ScopeOpsRead)
	resp, events := openSSE(t, svc.ops+"/ui/events", short)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	long, longEvents := openSSE(t, svc.ops+"/ui/events", testToken(5, ports.ScopeOpsRead))
	require.Equal(t, http.StatusOK, long.StatusCode)

	var bye string
	deadline := time.After(15 * time.Second)
	for bye == "" {
		select {
		case ev, ok := <-events:
			require.True(t, ok, "the stream ended without a bye")
			if ev.Event == "bye" {
				bye = ev.Data
			}
		case <-deadline:
			t.Fatal("the stream of an expired token is still open after 15s")
		}
	}
	assert.Equal(t, "session ended: token is expired; log in again", bye)
	for range events { // and the answer ends
	}
	// The stream of a token that is still good goes on.
	for range 3 {
		select {
		case ev, ok := <-longEvents:
			require.True(t, ok, "the stream of a good token ended")
			require.NotEqual(t, "bye", ev.Event)
		case <-time.After(5 * time.Second):
			t.Fatal("the stream of a good token went quiet")
		}
	}
	req, err := http.NewRequest(http.MethodGet, svc.ops+"/ui/events", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+short)
	again, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = again.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, again.StatusCode, "a new stream with it is refused too")
}

// TestUIExploreListsTheNewestCheckins: the Explore page's recent check-ins are the newest ones,
// newest first, however many came in the last minute (it read the minute oldest first, at most
// a thousand, so past that it listed old check-ins and never the newest).
func TestUIExploreListsTheNewestCheckins(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	ctx := context.Background()
	stream := adapters.KeySpace{Prefix: rdb.Prefix}.Stream()
	cmds := make([]*redis.StringCmd, 1100)
	pipe := client.Pipeline()
	now := time.Now().UnixMilli()
	for i := range cmds {
		ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: fmt.Sprintf("ck-%d", i), UserID: 1, LocationID: 2, StarRating: 3, Timestamp: now}, RecordedAt: now}
		values := map[string]any{}
		for k, v := range ev.Fields() {
			values[k] = v
		}
		cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values})
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	var want []string
	for i := len(cmds) - 1; i >= len(cmds)-20; i-- {
		want = append(want, cmds[i].Val())
	}

	resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/explore", header: map[string]string{"Authorization": "Bearer " + testToken(1, ports.ScopeOpsRead)}})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	_, table, ok := strings.Cut(body, `<table id="recent">`)
	require.True(t, ok, body)
	var got []string
	for _, m := range regexp.MustCompile(`<tr><td>([0-9]+-[0-9]+)</td>`).FindAllStringSubmatch(table, -1) {
		got = append(got, m[1])
	}
	assert.Equal(t, want, got, "the 20 newest, newest first")
}

// TestUIPoisonPagingKeepsTheFilterSizeAndPlace: the poison page's links keep its page size and
// projection filter, and an action on an entry comes back to the page it was taken on (the
// next and first page links dropped limit, and replay and purge went back to the first page).
func TestUIPoisonPagingKeepsTheFilterSizeAndPlace(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	q := adapters.NewPoisonQueue(client, keys)
	var ids []string
	for i := range 8 {
		proj := "users"
		if i%4 == 3 {
			proj = "locations" // filtered out
		}
		id, err := q.Park(context.Background(), ops.PoisonEntry{Stream: keys.Stream(), EntryID: "1-1", Projection: proj, Error: "bug",
			FailedAt: time.Now(), Fields: map[string]string{"n": strconv.Itoa(i)}})
		require.NoError(t, err)
		if proj == "users" {
			ids = append(ids, id)
		}
	}
	require.Len(t, ids, 6)
	auth := map[string]string{"Authorization": "Bearer " + testToken(1, ports.ScopeOps)}
	get := func(u string) string {
		t.Helper()
		resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + u, header: auth})
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", u, body)
		return body
	}
	listed := func(body string) []string {
		var out []string
		for _, m := range regexp.MustCompile(`<tr data-id="([^"]+)">`).FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}
	href := func(body, id string) url.Values {
		t.Helper()
		m := regexp.MustCompile(`id="` + id + `" href="([^"]*)"`).FindStringSubmatch(body)
		require.NotNil(t, m, "no #%s in %s", id, body)
		u, err := url.Parse(html.UnescapeString(m[1]))
		require.NoError(t, err)
		assert.Equal(t, "/ui/poison", u.Path)
		return u.Query()
	}

	first := get("/ui/poison?projection=users&limit=2")
	assert.Equal(t, ids[:2], listed(first))
	next := href(first, "next-page")
	assert.Equal(t, url.Values{"projection": {"users"}, "limit": {"2"}, "cursor": {ids[1]}}, next)
	second := get("/ui/poison?" + next.Encode())
	assert.Equal(t, ids[2:4], listed(second))
	assert.Equal(t, url.Values{"projection": {"users"}, "limit": {"2"}}, href(second, "first-page"))
	assert.Equal(t, url.Values{"projection": {"users"}, "limit": {"2"}, "cursor": {ids[3]}}, href(second, "next-page"))

	// Purging an entry of the second page, with the form the page shows, comes back to it.
	m := regexp.MustCompile(`action="/ui/poison/entry/` + ids[2] + `/purge" class="inline">(.*?)<button`).FindStringSubmatch(second)
	require.NotNil(t, m, second)
	form := url.Values{}
	for _, in := range regexp.MustCompile(`name="(\w+)" value="([^"]*)"`).FindAllStringSubmatch(m[1], -1) {
		form.Set(in[1], html.UnescapeString(in[2]))
	}
	resp, body := uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + "/ui/poison/entry/" + ids[2] + "/purge", header: auth, form: form})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	back, err := url.Parse(resp.Header.Get("Location"))
	require.NoError(t, err)
	assert.Equal(t, "/ui/poison", back.Path)
	bq := back.Query()
	assert.Equal(t, []string{"users", "2", ids[1]}, []string{bq.Get("projection"), bq.Get("limit"), bq.Get("cursor")}, back)
	assert.Equal(t, []string{ids[3], ids[4]}, listed(get(back.String())), "the same page, without the purged entry")

	// The entry page, opened from that page, goes back to it; a state that is not valid is left out.
	entry := get("/ui/poison/entry/" + ids[3] + "?" + next.Encode())
	assert.Equal(t, url.Values{"projection": {"users"}, "limit": {"2"}, "cursor": {ids[1]}}, href(entry, "back"))
	resp, _ = uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + "/ui/poison/entry/" + ids[3] + "/purge", header: auth,
		form: url.Values{"projection": {"nope"}, "cursor": {"x"}, "limit": {"0"}}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	back, err = url.Parse(resp.Header.Get("Location"))
	require.NoError(t, err)
	assert.Equal(t, "/ui/poison", back.Path)
	for _, k := range []string{"projection", "cursor", "limit"} {
		assert.False(t, back.Query().Has(k), "%s in %s", k, back)
	}
}

// TestUIExpiredSessionSendsAnHtmxPageToTheLogin: a fragment htmx polls for with an expired
// session gets a 401 whose HX-Redirect sends the whole page to the login (and back to the page
// after it), not a redirect that htmx follows and swaps the login page into the fragment.
func TestUIExpiredSessionSendsAnHtmxPageToTheLogin(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0", "AUTH_CLOCK_LEEWAY": "0s"}, Mode{API: true})
	short := shortLivedToken(t, 1, 2*time.Second, ports.ScopeOpsRead)
	resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/poison/table", cookie: short})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Eventually(t, func() bool {
		resp, _ := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/poison/table", cookie: short})
		return resp.StatusCode == http.StatusSeeOther
	}, 10*time.Second, 50*time.Millisecond, "the token expires")

	for current, next := range map[string]string{
		svc.ops + "/ui/poison?projection=users&limit=5": "/ui/poison?projection=users&limit=5",
		"https://evil.example/ui/projections":           "/ui/projections", // only the path is taken
		"https://evil.example/phish":                    "/ui/",
		"":                                              "/ui/",
	} {
		for _, fragment := range []string{"/ui/poison/table", "/ui/projections/table"} {
			resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + fragment, cookie: short,
				header: map[string]string{"HX-Request": "true", "HX-Current-URL": current}})
			assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s from %q: %s", fragment, current, body)
			assert.Equal(t, "/ui/login?next="+url.QueryEscape(next), resp.Header.Get("HX-Redirect"), "%s from %q", fragment, current)
			assert.Empty(t, resp.Header.Get("Location"), fragment)
		}
	}
	// A browser's navigation still goes to the login by a redirect.
	resp, _ = uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/poison", cookie: short})
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, "/ui/login?next="+url.QueryEscape("/ui/poison"), resp.Header.Get("Location"))
}

// TestUIProjectionVersionsStateIsOneWordClass: the versions table marks each state with a class
// of one word the stylesheet knows (state-ok for a caught-up version), the sentence as its text
// and title; the class was made of the sentence ("state-caught up"), so no colour ever applied.
func TestUIProjectionVersionsStateIsOneWordClass(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true, Projections: true})
	status, body, err := testPostCheckin(svc.base, `{"userId": 1, "locationId": 2, "starRating": 3}`, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, status, "%v", body)
	auth := map[string]string{"Authorization": "Bearer " + testToken(1, ports.ScopeOpsRead)}
	state := regexp.MustCompile(`<tr[^>]*><td>users\.v1</td>.*?<span class="state state-([^"]*)"( title="[^"]*")?>([^<]*)</span>`)
	var m []string
	require.Eventually(t, func() bool {
		resp, b := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/projections/table", header: auth})
		m = state.FindStringSubmatch(b)
		return resp.StatusCode == http.StatusOK && m != nil && m[3] == "caught up"
	}, 30*time.Second, 100*time.Millisecond, "users.v1 catches up")
	assert.Equal(t, []string{"ok", ` title="caught up"`}, m[1:3], "a class of one word; the sentence is the text and the title")
	css, err := ports.UIAssets().Open("ui/static/app.css")
	require.NoError(t, err)
	b, err := io.ReadAll(css)
	require.NoError(t, err)
	assert.Contains(t, string(b), ".state-ok", "the stylesheet colours it")
}

// TestUIBannersAreTheServersOwnTexts: a page's banner is asked for by a key the server maps to
// its own text, with values it checks; a link with words of its own (?err=Session expired.
// Paste your token at ...) shows nothing, where it showed them as an alert of the dashboard.
func TestUIBannersAreTheServersOwnTexts(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	auth := map[string]string{"Authorization": "Bearer " + testToken(1, ports.ScopeOps)}
	banners := regexp.MustCompile(`<p class="(?:flash|error)" role="(?:status|alert)">([^<]*)</p>`)
	shown := func(u string) []string {
		t.Helper()
		resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + u, header: auth})
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", u, body)
		assert.False(t, strings.Contains(body, "evil"), "%s shows the words of the link", u)
		var out []string
		for _, m := range banners.FindAllStringSubmatch(body, -1) {
			out = append(out, html.UnescapeString(m[1]))
		}
		return out
	}
	phish := url.QueryEscape("Session expired. Paste your token at https://evil.example")
	for _, u := range []string{
		"/ui/?err=" + phish + "&msg=" + phish,
		"/ui/poison?msg=" + phish,
		"/ui/projections?err=" + phish,
		"/ui/explore?msg=purged&id=" + phish,             // a value not of its kind
		"/ui/?msg=rebuild-started&name=evil&from=1&to=2", // a projection this build does not have
		"/ui/?msg=replayed-all&n=evil",
	} {
		assert.Empty(t, shown(u), u)
	}
	assert.Equal(t, []string{`nothing purged: type "all" to confirm purging every entry`}, shown("/ui/poison?err=purge-unconfirmed&name=evil"))

	// The actions' redirects ask for their banners by key.
	id, err := adapters.NewPoisonQueue(client, keys).Park(context.Background(), ops.PoisonEntry{Stream: keys.Stream(), EntryID: "1-1",
		Projection: "users", Error: "bug", FailedAt: time.Now(), Fields: map[string]string{"garbage": "x"}})
	require.NoError(t, err)
	for _, tc := range [][2]string{ // in order: the second purge finds nothing
		{"/ui/poison/entry/" + id + "/replay", id + " cannot be replayed"},
		{"/ui/poison/entry/" + id + "/purge", "purged " + id},
		{"/ui/poison/entry/" + id + "/purge", "poison entry " + id + " is not there"},
		{"/ui/projections/nope/rebuild", "no projection of that name"},
	} {
		action, want := tc[0], tc[1]
		resp, body := uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + action, header: auth, form: url.Values{}})
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, "%s: %s", action, body)
		got := shown(resp.Header.Get("Location"))
		require.Len(t, got, 1, action)
		assert.Contains(t, got[0], want, action)
	}
}

// TestUIPoisonLastFullPageHasNoNextLink: a last page of exactly the page size offers no next
// page (it linked to an empty one), filtered or not.
func TestUIPoisonLastFullPageHasNoNextLink(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	for i := range 5 {
		proj := "users"
		if i == 4 {
			proj = "locations"
		}
		_, err := adapters.NewPoisonQueue(client, keys).Park(context.Background(), ops.PoisonEntry{Stream: keys.Stream(), EntryID: "1-1",
			Projection: proj, Error: "bug", FailedAt: time.Now(), Fields: map[string]string{"n": strconv.Itoa(i)}})
		require.NoError(t, err)
	}
	auth := map[string]string{"Authorization": "Bearer " + testToken(1, ports.ScopeOpsRead)}
	for u, next := range map[string]bool{
		"/ui/poison?limit=5":                  false,
		"/ui/poison?limit=4":                  true,
		"/ui/poison?limit=4&projection=users": false,
		"/ui/poison?limit=2&projection=users": true,
	} {
		resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + u, header: auth})
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		assert.Equal(t, next, strings.Contains(body, `id="next-page"`), u)
		assert.Equal(t, next, strings.Contains(body, "(more after)"), u)
	}
}
