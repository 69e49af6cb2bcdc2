package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestTokenUserWithLeadingZero: `checkins token --user 010` must mint a token for user 10
// (as the API and every decimal setting read "010") or refuse; Go's flag.Int64 reads it as octal
// and mints a token for user 8, another user than the operator typed.
func TestTokenUserWithLeadingZero(t *testing.T) {
	t.Parallel()
	for user, want := range map[string]int64{"010": 10, "0x10": 0 /* refuse */} {
		code, stdout, stderr := runCLI(t, nil, "token", "--user", user, "--json")
		if code != 0 {
			continue // refused: fine
		}
		var tok struct {
			UserID int64 `json:"userId"`
		}
		require.NoError(t, json.Unmarshal([]byte(stdout), &tok), "stdout: %s; stderr: %s", stdout, stderr)
		assert.Equal(t, want, tok.UserID, "checkins token --user %s minted a token for user %d", user, tok.UserID)
	}
}

// TestMigrateToWithLeadingZero: `partitions migrate --to 010` moves the stream to 8
// partitions (octal), while STREAM_PARTITIONS=010, which the README says to restart every
// process with, is read as 10: the service then refuses to start.
func TestMigrateToWithLeadingZero(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	require.NoError(t, client.XAdd(context.Background(), &redis.XAddArgs{Stream: keys.Stream(), Values: map[string]any{"x": "y"}}).Err())
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "REQUEST_TIMEOUT": "1s"}
	code, stdout, stderr := runCLI(t, env, "partitions", "migrate", "--to", "010", "--json")
	if code != 0 {
		return // refused: fine
	}
	var res struct {
		To int `json:"to"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &res), "stdout: %s; stderr: %s", stdout, stderr)
	assert.Equal(t, 10, res.To, "partitions migrate --to 010 moved the stream to %d partitions", res.To)
	code, _, stderr = runCLI(t, env, "status", "--stream-partitions", "010")
	assert.Equal(t, 0, code, "status with STREAM_PARTITIONS=010 after migrate --to 010: %s", stderr)
}
