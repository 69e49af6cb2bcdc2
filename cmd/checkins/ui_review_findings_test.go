package main

// Review 17: the dashboard against /ops/status, /metrics and its own promises.

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/ports"
)

// TestPoisonEntryPagePutsNoWordsOfTheLinkOnThePage: the other pages keep a link's own
// sentence off the dashboard (TestDashboardLinksPutNoWordsOnThePage*), but the poison entry
// page printed the path's id back, in the page's title and in its error banner (the validation
// error quotes it, %q), on the operator's authenticated dashboard (found by a review). Now an id
// that is no entry ID gets a 400 with a fixed text.
func TestPoisonEntryPagePutsNoWordsOfTheLinkOnThePage(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	const words = "Session expired. Paste your token at evil.example to continue"
	auth := map[string]string{"Authorization": "Bearer " + testToken(3, ports.ScopeOps)}
	resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/poison/entry/" + url.PathEscape(words), header: auth})
	t.Logf("status %d", resp.StatusCode)
	for _, m := range regexp.MustCompile(`<title>[^<]*</title>|<p class="error" role="alert">[^<]*</p>`).FindAllString(body, -1) {
		t.Logf("shown: %s", html.UnescapeString(m))
	}
	assert.False(t, strings.Contains(html.UnescapeString(body), words), "the poison entry page shows the link's own sentence")
}

// TestStatusLagAgreesWithMetrics: a consumer group made at a position in the middle of
// the stream (as the live-group move, a join and a disband make them) has no lag in XINFO
// GROUPS until it reaches the end. /metrics and /ops/projections count it (ops.GroupLag);
// /ops/status, and so the dashboard's overview, said "unknown" and called the group "ok" (found
// by a review). Now they count it the same way.
func TestStatusLagAgreesWithMetrics(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	stream := adapters.KeySpace{Prefix: rdb.Prefix}.Stream()
	var ids []string
	for i := range 200 {
		id, err := client.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"n", i}}).Result()
		require.NoError(t, err)
		ids = append(ids, id)
	}
	// users.v1 delivered up to the 50th entry: 150 to go.
	require.NoError(t, client.XGroupCreate(ctx, stream, "users.v1", ids[49]).Err())
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	auth := map[string]string{"Authorization": "Bearer " + testToken(3, ports.ScopeOpsRead)}

	_, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ops/status", header: auth})
	var st struct {
		Projections []struct {
			Group string `json:"group"`
			Lag   *int64 `json:"lag"`
		} `json:"projections"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &st), body)
	statusLag := "absent"
	for _, p := range st.Projections {
		if p.Group == "users.v1" {
			statusLag = "null"
			if p.Lag != nil {
				statusLag = fmt.Sprint(*p.Lag)
			}
		}
	}

	_, metrics := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/metrics"})
	m := regexp.MustCompile(`checkins_projection_lag\{group="users\.v1",projection="users",version="1"\} (\S+)`).FindStringSubmatch(metrics)
	require.NotNil(t, m, metrics)

	_, projections := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ops/projections", header: auth})
	pm := regexp.MustCompile(`"group":"users\.v1"[^}]*"lag":(\w+)`).FindStringSubmatch(projections)

	var overview []string
	require.Eventually(t, func() bool {
		_, page := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/", header: auth})
		overview = regexp.MustCompile(`(?s)<tr data-group="users\.v1">.*?<td class="num lag">([^<]*)</td>.*?<span class="state state-(\w+)"`).FindStringSubmatch(page)
		return overview != nil
	}, 10*time.Second, 100*time.Millisecond)

	t.Logf("/metrics lag %s; /ops/projections lag %v; /ops/status lag %s; dashboard lag %q state %q", m[1], pm, statusLag, overview[1], overview[2])
	assert.Equal(t, "150", m[1], "/metrics")
	assert.Equal(t, m[1], statusLag, "/ops/status's lag of users.v1 is what /metrics says")
	assert.Equal(t, m[1], overview[1], "the dashboard's lag of users.v1 is what /metrics says")
	assert.Equal(t, "behind", overview[2], "150 entries queued and nothing delivered")

	// The same for a projection whose group nobody created yet: /metrics counts the whole
	// stream as its lag, /ops/status and the dashboard say unknown, and "ok".
	lm := regexp.MustCompile(`checkins_projection_lag\{group="locations\.v1",projection="locations",version="1"\} (\S+)`).FindStringSubmatch(metrics)
	require.NotNil(t, lm, metrics)
	_, page := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/", header: auth})
	lo := regexp.MustCompile(`(?s)<tr data-group="locations\.v1">.*?<td class="num lag">([^<]*)</td>.*?<span class="state state-(\w+)"`).FindStringSubmatch(page)
	require.NotNil(t, lo, page)
	t.Logf("locations.v1 (no group yet): /metrics lag %s; dashboard lag %q state %q", lm[1], lo[1], lo[2])
	assert.Equal(t, lm[1], lo[1], "the dashboard's lag of locations.v1 is what /metrics says")
}

// TestStalledStreamReaderHoldsUpNothing: the event stream lifted the listener's write deadline
// and set none of its own, so a client that stays connected but stops reading (a laptop put to
// sleep with the dashboard open, a stuck proxy) blocked the stream's Write for good once the
// socket buffers were full. The stream then never saw the shutdown: the graceful stop waited the
// whole DRAIN_TIMEOUT and failed ("an open dashboard never holds up a graceful stop"), and the
// handler and its UI_MAX_STREAMS slot stayed taken until TCP gave up (found by a review). Each
// write now has a deadline.
//
// Long consumer group names only make the stream's events big, so that the buffers fill in
// seconds rather than the minutes an ordinary dashboard takes.
func TestStalledStreamReaderHoldsUpNothing(t *testing.T) {
	t.Parallel()
	t.Run("reader stops", func(t *testing.T) { t.Parallel(); stalledStreamReader(t, false) })
	t.Run("control: reader reads", func(t *testing.T) { t.Parallel(); stalledStreamReader(t, true) })
}

func stalledStreamReader(t *testing.T, reads bool) {
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	stream := adapters.KeySpace{Prefix: rdb.Prefix}.Stream()
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"n", 1}}).Err())
	for i := range 8 {
		name := fmt.Sprintf("g%d-%s", i, strings.Repeat("x", 128<<10))
		require.NoError(t, client.XGroupCreate(ctx, stream, name, "0").Err())
	}
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0",
		"UI_HEARTBEAT": "200ms", "UI_MAX_STREAMS": "1", "DRAIN_TIMEOUT": "15s"}, Mode{API: true})

	u, err := url.Parse(svc.ops)
	require.NoError(t, err)
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.Dial("tcp", u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = fmt.Fprintf(conn, "GET /ui/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", u.Host, testToken(5, ports.ScopeOpsRead))
	require.NoError(t, err)
	head := make([]byte, 12)
	_, err = io.ReadFull(conn, head)
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 200", string(head))
	if reads {
		go func() { _, _ = io.Copy(io.Discard, conn) }()
	}
	// The client reads no more. Its stream gives up on it within a write's deadline (two
	// heartbeats and 5 s), which frees its slot (UI_MAX_STREAMS=1): a second stream is admitted.
	time.Sleep(3 * time.Second)
	if !reads {
		stalledStreamLetsGo(t, svc.ops)
	}

	start := time.Now()
	err = svc.stop(t)
	took := time.Since(start)
	t.Logf("the service stopped after %s: %v", took.Round(10*time.Millisecond), err)
	// Held up, the stop would run into DRAIN_TIMEOUT and fail; the bound is that, not a timing
	// (a loaded machine took 2.2 s for the control once).
	assert.NoError(t, err, "the graceful stop drained")
	assert.Less(t, took, 15*time.Second, "an open dashboard never holds up a graceful stop")
}

// stalledStreamLetsGo waits until a stream is admitted on ops (UI_MAX_STREAMS=1: the one taken
// let its slot go).
func stalledStreamLetsGo(t *testing.T, ops string) {
	t.Helper()
	assert.Eventually(t, func() bool {
		req, err := http.NewRequest(http.MethodGet, ops+"/ui/events", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+testToken(5, ports.ScopeOpsRead))
		resp, err := uiClient.Do(req)
		require.NoError(t, err)
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Logf("second stream: %d %s", resp.StatusCode, b)
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 15*time.Second, 500*time.Millisecond, "the stalled stream lets its slot go")
}

// TestOverviewDuringAnOutageShowsNoMadeUpFigures: when a status sample failed, the overview said
// "status unavailable" but showed a sample with the last stream length and zeroes for everything
// else: "Poisoned 0", "no consumer groups yet", 0 check-ins/s, figures nobody measured, next to
// the poison queue's real 3 entries (found by a review). Now it shows the error and no figures.
func TestOverviewDuringAnOutageShowsNoMadeUpFigures(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: []any{"n", 1}}).Err())
	require.NoError(t, client.XGroupCreate(ctx, keys.Stream(), "users.v1", "0").Err())
	q := adapters.NewPoisonQueue(client, keys)
	for range 3 {
		_, err := q.Park(ctx, ops.PoisonEntry{Stream: keys.Stream(), EntryID: "1-1", Projection: "users", Error: "bug", FailedAt: time.Now(), Fields: map[string]string{"x": "y"}})
		require.NoError(t, err)
	}
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	auth := map[string]string{"Authorization": "Bearer " + testToken(3, ports.ScopeOpsRead)}
	poisoned := regexp.MustCompile(`id="poisoned">([^<]*)<`)
	var page string
	require.Eventually(t, func() bool {
		_, page = uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/", header: auth})
		m := poisoned.FindStringSubmatch(page)
		return m != nil && m[1] == "3"
	}, 10*time.Second, 100*time.Millisecond)

	// The status cannot be read (the stream's key holds something else for a while).
	require.NoError(t, client.Rename(ctx, keys.Stream(), keys.Stream()+":aside").Err())
	require.NoError(t, client.Set(ctx, keys.Stream(), "x", 0).Err())
	require.Eventually(t, func() bool {
		_, page = uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/", header: auth})
		return strings.Contains(page, "status unavailable")
	}, 10*time.Second, 100*time.Millisecond)
	resp, _ := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ops/status", header: auth})
	n, err := client.XLen(ctx, keys.PoisonStream()).Result()
	require.NoError(t, err)
	t.Logf("/ops/status answers %d; the poison queue holds %d", resp.StatusCode, n)
	assert.Nil(t, poisoned.FindStringSubmatch(page), "the overview shows no poison count while nothing was measured (the queue holds %d)", n)
	assert.False(t, strings.Contains(page, "no consumer groups yet"), "the overview says there are no consumer groups")
	assert.Contains(t, page, "No figures while Redis does not answer")
}
