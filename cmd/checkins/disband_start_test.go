package main

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

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
	rdb := redistest.Open(t)
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "CLAIM_IDLE": "1s", "RATE_LIMIT_USER": "off"}
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	api := startSvc(t, "api", env)
	proj := startSvc(t, "project", env)
	l := newLedger()
	client := authedClient(5 * time.Second)
	for i := range 4 {
		l.post(client, api.base, fmt.Sprintf("wait-%d", i), sent{user: 1 + int64(i%2), location: 3, stars: 4})
	}
	l.resolve(t, api.base)
	l.verifyAll(t, rdb.URL, keys)
	proj.exit(t, syscall.SIGTERM)
	time.Sleep(1100 * time.Millisecond)
	code, _, stderr := runCLI(t, env, "projections", "disband", "live")
	require.Equal(t, 0, code, stderr)

	// The disband's second step (removing the markers, a SCAN) is under way: its mark is set.
	c := redistest.Client(t, rdb.URL)
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
