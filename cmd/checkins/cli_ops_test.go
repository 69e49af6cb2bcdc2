package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/query"
	"github.com/checkins/checkins/domain"
)

// TestCLIOpsVerbsReadNothingIntoRedisAndKeepJSON: an ops verb records nothing (run against a
// mistyped prefix, or with another STREAM_PARTITIONS than the service's before its first start,
// it would fix a count the service then refuses); --limit is checked as over HTTP; with --json,
// stdout is JSON or nothing, never text or a made-up result.
func TestCLIOpsVerbsReadNothingIntoRedisAndKeepJSON(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}
	keys := adapters.KeySpace{Prefix: rdb.Prefix}

	for _, args := range [][]string{{"status", "--stream-partitions", "4"}, {"poison", "list", "--stream-partitions", "8"}, {"projections", "list", "--stream-partitions", "4"}} {
		code, _, stderr := runOps(t, env, args...)
		require.Equal(t, 0, code, "%v: %s", args, stderr)
		assert.Zero(t, client.Exists(ctx, keys.Meta()).Val(), "%v recorded nothing", args)
	}

	// A migration with nothing to move (a mistyped KEY_PREFIX) records no count either: the
	// next start with another STREAM_PARTITIONS would be refused.
	code, _, stderr := runOps(t, env, "partitions", "migrate", "--to", "4")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "nothing to migrate under KEY_PREFIX")
	assert.Zero(t, client.Exists(ctx, keys.Meta()).Val(), "migrate on an empty keyspace recorded nothing")

	code, _, stderr = runOps(t, env, "poison", "list", "--limit", "0")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "--limit must be from 1 to 1000, got 0")

	ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "cli-json", UserID: 9, LocationID: 2, StarRating: 3, Timestamp: 1_700_000_000_000}, RecordedAt: 1_700_000_000_000}
	id, err := adapters.NewPoisonQueue(client, keys).Park(ctx, ops.PoisonEntry{Stream: keys.Stream(), EntryID: "1-1",
		Projection: "users", Group: "users.v1", Version: 1, Error: "handler bug", Attempts: 5, FailedAt: time.Now(), Fields: ev.Fields()})
	require.NoError(t, err)
	code, out, stderr := runOps(t, env, "poison", "purge", id, "--json")
	require.Equal(t, 0, code, stderr)
	var purged struct {
		ID     string `json:"id"`
		Purged bool   `json:"purged"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &purged), "stdout is JSON: %q", out)
	assert.Equal(t, id, purged.ID)
	assert.True(t, purged.Purged)

	code, out, stderr = runOps(t, env, "poison", "replay", "1-0", "--json")
	assert.Equal(t, 1, code)
	assert.Empty(t, out, "no result for an entry that is not there")
	assert.Contains(t, stderr, "not found")

	// Flags may come before the verb too, a flag's value is never taken for it, and "--" ends
	// the flags.
	code, out, stderr = runOps(t, env, "poison", "--json", "--projection", "list", "list")
	require.Equal(t, 0, code, stderr)
	var page query.PoisonPage
	require.NoError(t, json.Unmarshal([]byte(out), &page), "stdout is JSON: %q", out)
	code, out, stderr = runOps(t, env, "projections", "--json", "list")
	require.Equal(t, 0, code, stderr)
	var rep query.ProjectionsReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "stdout is JSON: %q", out)
	assert.Len(t, rep.Projections, 5)
	code, _, stderr = runOps(t, env, "poison", "--json")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "missing verb: list, show, replay or purge")
	code, _, stderr = runOps(t, env, "poison", "show", "--", "-1-1")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `"-1-1"`, "taken as the ID, not as a flag")

	// A bad flag says what is wrong without the seventy-odd settings' usage; -h lists them.
	code, _, stderr = runOps(t, env, "poison", "list", "--bogus")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `flag provided but not defined: -bogus ("checkins poison list --help" lists the flags)`)
	assert.NotContains(t, stderr, "-redis-url", "no flag list after a bad flag: %s", stderr)
	code, _, stderr = runOps(t, env, "status", "--limit", "3")
	assert.Equal(t, 1, code)
	assert.NotContains(t, stderr, "-redis-url")
	code, _, stderr = runOps(t, env, "poison", "list", "-h")
	assert.Equal(t, 0, code)
	assert.Contains(t, stderr, "-redis-url", "-h lists every flag")
	assert.Contains(t, stderr, "checkins poison list [--projection P]")
}

// TestCLIRebuildJSONInterruptedPrintsJSON: `projections rebuild --json` stopped while it waits
// (no projector runs here) prints the last progress it saw as JSON, not a sentence.
func TestCLIRebuildJSONInterruptedPrintsJSON(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "PROJECTION_POLL_INTERVAL": "50ms"}
	cmd := exec.Command(checkinsBinary(t), "projections", "rebuild", "users", "--json")
	cmd.Env = cliEnv(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	require.Eventually(t, func() bool {
		st, err := adapters.NewProjectionVersions(client, keys).State(context.Background(), "users")
		return err == nil && st.Building == 2
	}, 20*time.Second, 50*time.Millisecond, "the rebuild started; stderr: %s", &stderr)
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	select {
	case err := <-done:
		require.NoError(t, err, "exit 0: running projectors carry the rebuild on; stderr: %s", &stderr)
	case <-time.After(30 * time.Second):
		t.Fatal("no exit after SIGINT")
	}
	var rp struct {
		Projection string `json:"projection"`
		State      string `json:"state"`
		To         int    `json:"to"`
	}
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &rp), "stdout is JSON: %q", stdout.String())
	assert.Equal(t, "users", rp.Projection)
	assert.Equal(t, "building", rp.State)
	assert.Equal(t, 2, rp.To)
}
