package main

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestOldSetProjectorWaitsOutADisband: while a disband removes the markers of the group it
// disbanded, its `disbanding:<group>` field holds off a projector that would join a group of
// that name (one of the old set, started again). Such a projector exited at start (its first
// join got ErrDisbandUnfinished, which is not transient: a restart loop under a supervisor; found
// by a review). It now waits, and joins once the disband is done, as the README says.
func TestOldSetProjectorWaitsOutADisband(t *testing.T) {
	t.Parallel()
	url, env, keys, _ := disbandedAfterCheckins(t, "wait", 4, 2)

	// The disband's second step (removing the markers, a SCAN) is under way: its mark is set.
	c := redistest.Client(t, url)
	reg := keys.Partitions().Registry(0)
	ctx := context.Background()
	require.NoError(t, c.HSet(ctx, reg, "disbanding:live", strconv.FormatInt(time.Now().UnixMilli(), 10)).Err())

	// A projector of the old set (PROJECTIONS unset: live) is started meanwhile.
	full := map[string]string{"HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": "info"}
	for k, v := range env {
		full[k] = v
	}
	withTestAuth(full)
	cmd := exec.Command(checkinsBinary(t), "project")
	cmd.Env = cliEnv(full)
	stderrPipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &svcProc{cmd: cmd, logs: &faultLogs{}, done: make(chan struct{})}
	go func() {
		p.logs.scan(stderrPipe)
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	select {
	case <-p.done:
		t.Fatalf("the projector of the old set exited instead of waiting for the disband to finish (%v); stderr:\n%s", p.err, p.logs)
	case <-time.After(5 * time.Second):
	}

	// The disband finishes: the projector joins.
	require.NoError(t, c.HDel(ctx, reg, "disbanding:live").Err())
	require.Eventually(t, func() bool {
		ok, err := c.HExists(ctx, reg, "live:live").Result()
		return err == nil && ok
	}, 30*time.Second, 50*time.Millisecond, "it joined once the mark went; stderr:\n%s", p.logs)
}

// TestAWaitingJoinHoldsOffNothingElse: a drop of users.v1 is cut short before it cleared its
// `dropping:` mark, and a projector that runs all five projections (users first) starts. Its
// join of users.v1 waits for the drop to be finished, and nothing else does: the other four
// versions join their group and count the check-ins that follow, and a rebuild of locations
// started meanwhile is carried out by its registry watcher (v2 joins, backfills and serves).
// Before, SetTargets stopped at the first refused join, and the watcher's pass at SetTargets'
// error: no projection of that process was fed, and no rebuild stepped, until the drop was
// finished. Once it is (the drop run again), users.v1 runs from the start of the stream: every
// read model equals the independent computation.
func TestAWaitingJoinHoldsOffNothingElse(t *testing.T) {
	t.Parallel()
	url, env, keys, l := disbandedAfterCheckins(t, "waits", 6, 3)
	c := redistest.Client(t, url)
	ctx := context.Background()
	reg := keys.Partitions().Registry(0)

	// The drop, cut short after it removed the version's keys and before it cleared its mark.
	moved, err := c.HGet(ctx, reg, "moved:users.v1").Result()
	require.NoError(t, err)
	code, _, stderr := runCLI(t, env, "projections", "drop", "users.v1")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, c.HSet(ctx, reg, "dropping:users.v1", moved).Err())

	all := map[string]string{"PROJECTIONS": "users,locations,leaderboards,recent_checkins,daily_checkins",
		"PROJECTION_POLL_INTERVAL": "100ms", "PROJECTION_RETIRE_GRACE": "500ms"}
	for k, v := range env {
		all[k] = v
	}
	proj := startSvc(t, "project", all)
	api := startSvc(t, "api", env)
	code, _, stderr = runCLI(t, env, "projections", "rebuild", "locations", "--no-wait")
	require.Equal(t, 0, code, stderr)
	client := authedClient(5 * time.Second)
	for i := range 6 {
		l.post(client, api.base, fmt.Sprintf("waits-after-%d", i), sent{user: 1 + int64(i%3), location: 3, stars: 2})
	}
	l.resolve(t, api.base)

	versions := adapters.NewProjectionVersions(c, keys)
	require.Eventually(t, func() bool {
		st, err := versions.State(ctx, "locations")
		return err == nil && st.Serving == 2 && st.Building == 0
	}, 30*time.Second, 50*time.Millisecond, "the rebuild of locations went on; projector's stderr:\n%s", proj.logs)
	// Every read model but users' counts all 12 check-ins (users' waits, with nothing).
	v := newVerifier(t, url)
	defer v.Close()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		_, detail, err := v.Verify(ctx, keys, l.acceptedCheckins(t))
		require.NoError(ct, err)
		// detail: "N differences ...: users 3 (...); locations 1 (...)", a part per projection.
		for _, p := range []string{"locations", "leaderboards", "recent_checkins", "daily_checkins"} {
			assert.NotContains(ct, detail, "; "+p+" ", "the other projections are exact")
		}
		assert.Contains(ct, detail, ": users ", "users.v1 waits for the drop")
	}, 30*time.Second, 200*time.Millisecond)
	assert.Positive(t, proj.logs.count("drop was cut short"), "it says why users.v1 waits")

	// The operator finishes the drop, as told: users.v1 runs from the start of the stream.
	code, _, stderr = runCLI(t, env, "projections", "drop", "users.v1")
	require.Equal(t, 0, code, stderr)
	l.verifyAll(t, url, keys)
}
