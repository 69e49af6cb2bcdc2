package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/query"
)

func statusReportOf(t *testing.T, env map[string]string) query.StatusReport {
	t.Helper()
	code, out, stderr := runOps(t, env, "status", "--json")
	require.Equal(t, 0, code, stderr)
	var st query.StatusReport
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	return st
}

func projectionsReportOf(t *testing.T, env map[string]string) query.ProjectionsReport {
	t.Helper()
	code, out, stderr := runOps(t, env, "projections", "list", "--json")
	require.Equal(t, 0, code, stderr)
	var rep query.ProjectionsReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	return rep
}

func postNumbered(t *testing.T, base string, from, n int) {
	t.Helper()
	l := newLedger()
	c := authedClient(10 * time.Second)
	for i := from; i < from+n; i++ {
		l.post(c, base, fmt.Sprintf("srt-%d", i), sent{user: int64(1 + i%5), location: int64(1 + i%7), stars: int64(i % 6)})
	}
	ok, _, _, _ := l.stats()
	require.Equal(t, n, ok)
}

// rebuildUsersToV2 runs serve, records check-ins, rebuilds users and waits until v2 serves.
func rebuildUsersToV2(t *testing.T, extra map[string]string) (map[string]string, *svcProc) {
	t.Helper()
	rdb := redistest.Open(t)
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}
	svcEnv := map[string]string{"PROJECTION_POLL_INTERVAL": "100ms"}
	for k, v := range env {
		svcEnv[k] = v
	}
	for k, v := range extra {
		svcEnv[k] = v
	}
	p := startSvc(t, "serve", svcEnv)
	postNumbered(t, p.base, 0, 20)
	code, _, stderr := runOps(t, env, "projections", "rebuild", "users", "--no-wait")
	require.Equal(t, 0, code, stderr)
	require.Eventually(t, func() bool {
		for _, r := range projectionsReportOf(t, env).Projections {
			if r.Projection == "users" {
				return r.Serving == 2
			}
		}
		return false
	}, 30*time.Second, 200*time.Millisecond, "users v2 serves")
	return env, p
}

// TestStatusNamesTheMissingLiveGroup: with the live group gone from Redis while the
// registry still has its members (an operator's XGROUP DESTROY, a failover that lost the stream
// key's groups), `checkins status` listed each projection as "<name>.v1 (not created yet)": a
// group no projector will ever create, at version 1 even for users, which serves v2, and not
// serving. The group that is missing, `live`, is listed now, not created yet, with its members.
func TestStatusNamesTheMissingLiveGroup(t *testing.T) {
	t.Parallel()
	env, p := rebuildUsersToV2(t, map[string]string{"PROJECTION_RETIRE_GRACE": "200ms"})
	require.Eventually(t, func() bool {
		for _, r := range projectionsReportOf(t, env).Projections {
			if r.Projection == "users" {
				return r.Retiring == 0 && r.Building == 0
			}
		}
		return false
	}, 30*time.Second, 200*time.Millisecond, "users v1 retired")
	require.Equal(t, 0, p.exit(t, syscall.SIGTERM))
	c := redistest.Client(t, env["REDIS_URL"])
	require.NoError(t, c.XGroupDestroy(context.Background(), env["KEY_PREFIX"]+":events", "live").Err())

	st := statusReportOf(t, env)
	var groups []string
	for _, r := range st.Projections {
		groups = append(groups, fmt.Sprintf("%s/v%d/serving=%v/exists=%v", r.Group, r.Version, r.Serving, r.GroupExists))
	}
	t.Logf("status rows: %v", groups)
	for _, r := range st.Projections {
		if r.Projection == "users" {
			assert.NotEqual(t, "users.v1", r.Group, "users serves v2 through the live group; status names users.v1")
			assert.False(t, r.Version == 1 && !r.Serving, "users' row is version 1, not serving, while v2 serves")
		}
	}
	var sawLive bool
	for _, r := range st.Projections {
		sawLive = sawLive || r.Group == "live"
	}
	assert.True(t, sawLive, "the group the projections are fed by, live, is missing: status names it")
	for _, r := range st.Projections {
		if r.Group == "live" {
			assert.False(t, r.GroupExists)
			assert.Equal(t, query.KindLive, r.Kind)
			assert.Contains(t, r.Members, "users.v2")
		}
	}
}

// TestStatusFinishedBackfillIsNotStalled: after a rebuild's switch, the new version's own
// (backfill) group stays PROJECTION_RETIRE_GRACE with its backfill done. `checkins status` showed
// it as "backfilling" and, once STALL_AFTER passed with check-ins recorded after its join, as
// STALLED, while /readyz (which judges only running backfills) answered 200. README: STALLED
// "(the cause is printed under the table, and /readyz of a projector running it answers 503)".
// It is "backfilled" now, with nothing left to deliver.
func TestStatusFinishedBackfillIsNotStalled(t *testing.T) {
	t.Parallel()
	env, p := rebuildUsersToV2(t, map[string]string{"PROJECTION_RETIRE_GRACE": "1h", "STALL_AFTER": "1s"})
	postNumbered(t, p.base, 100, 10) // after the join: delivered by the live group
	statusEnv := map[string]string{"STALL_AFTER": "1s"}
	for k, v := range env {
		statusEnv[k] = v
	}
	var row *query.ProjectionStatus
	for deadline := time.Now().Add(6 * time.Second); time.Now().Before(deadline) && row == nil; time.Sleep(500 * time.Millisecond) {
		st := statusReportOf(t, statusEnv)
		for i, r := range st.Projections {
			if r.Group == "users.v2" && r.Stalled {
				row = &st.Projections[i]
			}
		}
	}
	resp, err := authedClient(5 * time.Second).Get(p.base + "/readyz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "readyz: %s", body)
	code, text, _ := runOps(t, statusEnv, "status")
	require.Equal(t, 0, code)
	t.Logf("status text:\n%s", text)
	if row != nil {
		t.Logf("users.v2 row: kind %s, lag %v, stalled %v: %s", row.Kind, *row.Lag, row.Stalled, row.StallCause)
	}
	assert.Nil(t, row, "a finished backfill's group is not reported STALLED by checkins status while /readyz answers 200")
	assert.Regexp(t, `users\.v2 +users\.v2 up to \S+ +true +\d+ +0 +0 .* backfilled`, text)
}
