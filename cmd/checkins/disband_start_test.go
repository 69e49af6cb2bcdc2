package main

import (
	"context"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
