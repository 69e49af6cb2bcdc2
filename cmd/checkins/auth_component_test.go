package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/ports"
)

// plainClient sends exactly what the test gives it: no token is added.
var plainClient = &http.Client{Timeout: 10 * time.Second, Transport: contract.Transport(nil)}

func plainDo(t *testing.T, method, url, token, body string) (int, http.Header, string) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := plainClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(b)
}

// redisSnapshot is every key under prefix with a dump of its value.
func redisSnapshot(t *testing.T, c *redis.Client, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, prefix+":*").Result()
	require.NoError(t, err)
	out := map[string]string{}
	for _, k := range keys {
		if strings.HasSuffix(k, ":projections:progress") || strings.Contains(k, ":applied:") || strings.Contains(k, ":events") {
			continue // bookkeeping that moves with time and stream positions; the stream is compared by length
		}
		if k == prefix+":projections" {
			// The registry: its acked:<group> fields are the positions the groups acknowledged
			// through, checkpointed in the background, so they move with any accepted check-in.
			// The rest (layouts, live-group membership) is compared.
			h, err := c.HGetAll(ctx, k).Result()
			require.NoError(t, err)
			for f := range h {
				if strings.HasPrefix(f, "acked:") {
					delete(h, f)
				}
			}
			out[k] = fmt.Sprint(h) // fmt prints a map's keys sorted
			continue
		}
		v, err := c.Dump(ctx, k).Result()
		require.NoError(t, err)
		out[k] = v
	}
	return out
}

// TestComponentCheckInAsAnotherUserChangesNothing: a user's token with another user's userId is
// 403 naming userId, and the stream, the idempotency keys and every projection are unchanged;
// a check-in made after it is counted, so the projectors did run in between.
func TestComponentCheckInAsAnotherUserChangesNothing(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}, Mode{API: true, Projections: true})
	c := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	waitUser := func(user, n int64) {
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			status, got, err := testGetStats(svc.base, fmt.Sprintf("/users/%d", user))
			if assert.NoError(ct, err) && assert.Equal(ct, http.StatusOK, status) {
				assert.Equal(ct, n, got["numCheckins"])
			}
		}, 30*time.Second, 50*time.Millisecond)
	}
	for i, u := range []int64{1, 2, 1} {
		status, _, _ := plainDo(t, http.MethodPost, svc.base+"/checkins", testToken(u), fmt.Sprintf(`{"locationId":%d,"starRating":3,"checkinId":"c-%d"}`, 5+i, i))
		require.Equal(t, http.StatusAccepted, status)
	}
	waitUser(1, 2)
	waitUser(2, 1)
	stream, err := c.XLen(ctx, rdb.Prefix+":events").Result()
	require.NoError(t, err)
	before := redisSnapshot(t, c, rdb.Prefix)

	for _, body := range []string{
		`{"userId":2,"locationId":5,"starRating":5,"checkinId":"c-9"}`, // a new checkinId as user 2
		`{"userId":2,"locationId":5,"starRating":5,"checkinId":"c-1"}`, // user 2's own checkinId
		`{"userId":2,"locationId":6,"starRating":3,"checkinId":"c-1"}`, // an exact copy of user 2's check-in
	} {
		status, h, raw := plainDo(t, http.MethodPost, svc.base+"/checkins", testToken(1), body)
		require.Equal(t, http.StatusForbidden, status, raw)
		assert.Contains(t, raw, `"code":"forbidden"`)
		assert.Contains(t, raw, `"field":"userId"`)
		assert.Empty(t, h.Get("Idempotent-Replayed"))
	}
	// Something legitimate after them: once it is projected, the projectors are past the refused ones.
	status, _, _ := plainDo(t, http.MethodPost, svc.base+"/checkins", testToken(3), `{"locationId":99,"starRating":1,"checkinId":"after"}`)
	require.Equal(t, http.StatusAccepted, status)
	waitUser(3, 1)
	n, err := c.XLen(ctx, rdb.Prefix+":events").Result()
	require.NoError(t, err)
	assert.Equal(t, stream+1, n, "the refused requests wrote no event")
	after := redisSnapshot(t, c, rdb.Prefix)
	// The legitimate check-in's keys: its user's and its location's, and the leaderboards' shards
	// that rank them (the location's board entries and counts, the user's board entry).
	shard := func(id int64) string {
		return "{" + projection.LeaderboardShardSlots(projection.LeaderboardsLayout)[projection.ShardOf(id, projection.LeaderboardShards)] + "}:"
	}
	legitBoard := func(k string) bool {
		return strings.Contains(k, ":leaderboards:") && (strings.Contains(k, shard(99)+"location") || strings.HasSuffix(k, shard(3)+"users_by_checkins"))
	}
	for k, v := range before {
		if legitBoard(k) {
			continue // a shard that holds the legitimate check-in too: the boards are compared below
		}
		assert.Equal(t, v, after[k], "key %s changed", k)
	}
	var board struct {
		Users []struct {
			UserID      int64 `json:"userId"`
			NumCheckins int64 `json:"numCheckins"`
		} `json:"users"`
	}
	require.True(t, getJSON(t, svc.base+"/leaderboards/users?limit=10", &board))
	got := map[int64]int64{}
	for _, u := range board.Users {
		got[u.UserID] = u.NumCheckins
	}
	assert.Equal(t, map[int64]int64{1: 2, 2: 1, 3: 1}, got, "the users leaderboard counts only what was accepted")
	for k := range after {
		if _, ok := before[k]; !ok {
			assert.True(t, strings.Contains(k, "user:3") || strings.Contains(k, "location:99") || legitBoard(k),
				"a key %s appeared that is not of the legitimate check-in", k)
		}
	}
	assert.Equal(t, before[rdb.Prefix+":idem:{user:2}:c-1"], after[rdb.Prefix+":idem:{user:2}:c-1"])
	_, ok := after[rdb.Prefix+":idem:{user:2}:c-9"]
	assert.False(t, ok, "no reservation under user 2 for the refused check-in")
	_, ok = after[rdb.Prefix+":idem:{user:1}:c-9"]
	assert.False(t, ok, "nor under user 1")
	_, _, raw := plainDo(t, http.MethodGet, svc.base+"/users/2", "", "")
	assert.Contains(t, raw, `"numCheckins":1`)
}

// TestComponentOpsRoutesNeedOpsScope: the ops routes live on their own listener; every one of
// them in the route table answers 401 without a token, 403 with a user token, and with a
// read-scope token GETs pass and the others are 403; checkins:ops passes everywhere. The public
// listener serves no /ops and no /metrics; health checks answer on both without a token.
func TestComponentOpsRoutesNeedOpsScope(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true, Projections: true})
	require.NotEqual(t, svc.base, svc.ops, "a listener of its own")

	var routes []string
	for _, r := range svc.svc.http.OpsEcho().Routes() {
		if strings.HasPrefix(r.Path, "/ops") {
			routes = append(routes, r.Method+" "+r.Path)
		}
	}
	slices.Sort(routes)
	routes = slices.Compact(routes)
	require.GreaterOrEqual(t, len(routes), 9, "the route table: %v", routes)
	t.Logf("ops routes: %v", routes)
	path := func(p string) string {
		p = strings.ReplaceAll(p, ":id", "1764403201234-0")
		return strings.ReplaceAll(p, ":name", "users")
	}
	user, read, ops := testToken(7), testToken(7, ports.ScopeOpsRead), testToken(7, ports.ScopeOps)
	for _, route := range routes {
		method, p, _ := strings.Cut(route, " ")
		url := svc.ops + path(p)
		status, h, raw := plainDo(t, method, url, "", "")
		assert.Equal(t, http.StatusUnauthorized, status, "%s without a token: %s", route, raw)
		assert.Equal(t, `Bearer realm="checkins"`, h.Get("WWW-Authenticate"), route)
		status, h, raw = plainDo(t, method, url, user, "")
		assert.Equal(t, http.StatusForbidden, status, "%s with a user token: %s", route, raw)
		assert.Contains(t, h.Get("WWW-Authenticate"), `error="insufficient_scope"`, route)
		readRoute := method == http.MethodGet || method == http.MethodHead // HEAD is a GET without its body
		if method != http.MethodHead {
			assert.Contains(t, raw, `"code":"insufficient_scope"`, route)
		}
		status, _, raw = plainDo(t, method, url, read, "")
		if readRoute {
			assert.NotContains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, status, "%s with a read token: %s", route, raw)
		} else {
			assert.Equal(t, http.StatusForbidden, status, "%s with a read token: %s", route, raw)
		}
		if readRoute { // the others would act: replay, purge, rebuild
			status, _, raw = plainDo(t, method, url, ops, "")
			assert.NotContains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, status, "%s with an ops token: %s", route, raw)
		}
		status, _, _ = plainDo(t, method, svc.base+path(p), ops, "")
		assert.Equal(t, http.StatusNotFound, status, "%s is not on the public listener", route)
	}
	status, _, _ := plainDo(t, http.MethodDelete, svc.ops+"/ops/poison?projection=users", ops, "")
	assert.Equal(t, http.StatusOK, status, "an ops token may purge")
	status, _, _ = plainDo(t, http.MethodGet, svc.ops+"/ops/no-such-route", "", "")
	assert.Equal(t, http.StatusUnauthorized, status, "no token, no route discovery")

	status, _, raw := plainDo(t, http.MethodGet, svc.ops+"/metrics", "", "")
	assert.Equal(t, http.StatusOK, status, "metrics need no token on the ops listener")
	assert.Contains(t, raw, "checkins_http_requests_total")
	assert.Contains(t, raw, `status="401"`, "refused requests are counted too")
	status, _, _ = plainDo(t, http.MethodGet, svc.base+"/metrics", "", "")
	assert.Equal(t, http.StatusNotFound, status, "no metrics on the public listener")
	for _, base := range []string{svc.base, svc.ops} {
		for _, p := range []string{"/healthz", "/readyz"} {
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				status, _, raw := plainDo(t, http.MethodGet, base+p, "", "")
				assert.Equal(c, http.StatusOK, status, "%s%s: %s", base, p, raw)
			}, 30*time.Second, 100*time.Millisecond)
		}
	}
}

// TestComponentSharedPortProtectsMetrics: with OPS_ADDR = HTTP_ADDR everything is on one port,
// and /metrics there needs a read-scope token.
func TestComponentSharedPortProtectsMetrics(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}, Mode{API: true})
	require.Equal(t, svc.base, svc.ops)
	status, _, _ := plainDo(t, http.MethodGet, svc.base+"/metrics", "", "")
	assert.Equal(t, http.StatusUnauthorized, status)
	status, _, _ = plainDo(t, http.MethodGet, svc.base+"/metrics", testToken(1), "")
	assert.Equal(t, http.StatusForbidden, status)
	status, _, _ = plainDo(t, http.MethodGet, svc.base+"/metrics", testToken(1, ports.ScopeOpsRead), "")
	assert.Equal(t, http.StatusOK, status)
	status, _, _ = plainDo(t, http.MethodGet, svc.base+"/ops/status", testToken(1, ports.ScopeOpsRead), "")
	assert.Equal(t, http.StatusOK, status, "ops routes on the shared port")
	status, _, _ = plainDo(t, http.MethodGet, svc.base+"/users/1", "", "")
	assert.Equal(t, http.StatusNotFound, status, "reads stay public")
}

// TestComponentAuthOff: AUTH_MODE=off runs only with every listener on loopback, says so, and
// then takes the userId from the body.
func TestComponentAuthOff(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	for _, addrs := range [][2]string{{":0", "127.0.0.1:0"}, {"127.0.0.1:0", "0.0.0.0:0"}} {
		env := withTestAuth(map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "AUTH_MODE": "off",
			"HTTP_ADDR": addrs[0], "OPS_ADDR": addrs[1]})
		cfg, _, err := parseConfig(flag.NewFlagSet("t", flag.ContinueOnError), nil, func(k string) string { return env[k] })
		require.NoError(t, err)
		_, err = NewService(context.Background(), cfg, Mode{API: true}, newLogger(io.Discard, cfg.LogLevel))
		assert.ErrorContains(t, err, "AUTH_MODE=off is allowed only when every listener is on loopback", "%v", addrs)
	}
	var logs bytes.Buffer
	env := withTestAuth(map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "AUTH_MODE": "off", "HTTP_ADDR": "127.0.0.1:0"})
	cfg, _, err := parseConfig(flag.NewFlagSet("t", flag.ContinueOnError), nil, func(k string) string { return env[k] })
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	svc, err := NewService(ctx, cfg, Mode{API: true}, newLogger(&logs, cfg.LogLevel))
	require.NoError(t, err)
	assert.Contains(t, logs.String(), `"level":"WARN","msg":"AUTH_MODE=off: NO AUTHENTICATION`)
	addr, err := svc.Listen()
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	defer func() { cancel(); <-done }()
	status, _, raw := plainDo(t, http.MethodPost, "http://"+addr.String()+"/checkins", "", `{"userId":11,"locationId":1,"starRating":1}`)
	require.Equal(t, http.StatusAccepted, status, raw)
	assert.Contains(t, raw, `"userId":11`)
	status, _, _ = plainDo(t, http.MethodGet, "http://"+addr.String()+"/ops/status", "", "")
	assert.Equal(t, http.StatusOK, status)
}

// TestComponentDevModeKeyIsKept: dev mode makes its key once in STATE_DIR; a restart (and the
// token command) use the same key, so tokens stay valid across restarts.
func TestComponentDevModeKeyIsKept(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	state := t.TempDir()
	env := func() map[string]string {
		return map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "AUTH_MODE": "", "STATE_DIR": state}
	}
	first := startInProcess(t, env(), Mode{API: true})
	key, err := os.ReadFile(state + "/" + devKeyFile)
	require.NoError(t, err)
	info, err := os.Stat(state + "/" + devKeyFile)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the key is readable by its owner only")
	code, tok, stderr := runCLI(t, map[string]string{"STATE_DIR": state}, "token", "--user", "9")
	require.Equal(t, 0, code, stderr)
	tok = strings.TrimSpace(tok)
	status, _, raw := plainDo(t, http.MethodPost, first.base+"/checkins", tok, `{"locationId":1,"starRating":1}`)
	require.Equal(t, http.StatusAccepted, status, raw)
	require.NoError(t, first.stop(t))

	second := startInProcess(t, env(), Mode{API: true})
	again, err := os.ReadFile(state + "/" + devKeyFile)
	require.NoError(t, err)
	assert.Equal(t, key, again, "the key is made once")
	status, _, raw = plainDo(t, http.MethodPost, second.base+"/checkins", tok, `{"locationId":1,"starRating":1}`)
	assert.Equal(t, http.StatusAccepted, status, raw)
	status, _, _ = plainDo(t, http.MethodPost, second.base+"/checkins", testToken(9), `{"locationId":1,"starRating":1}`)
	assert.Equal(t, http.StatusUnauthorized, status, "a token of another key is refused")
}
