package main

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestOpsVerbsRefuseAnotherCountOnAnUnrecordedStream: on a single server a stream of
// P = 1 records no count (README: "a stream written before partitions existed counts as P = 1";
// serve and api refuse STREAM_PARTITIONS=4 on it). The ops verbs only check a recorded count, so
// with STREAM_PARTITIONS=4 they run against four partitions that do not exist: status reports 0
// entries for a stream that holds one, and `idempotency format` says compact on a deployment
// whose stream held entries (it writes json).
func TestOpsVerbsRefuseAnotherCountOnAnUnrecordedStream(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	require.NoError(t, client.XAdd(context.Background(), &redis.XAddArgs{Stream: keys.Stream(), Values: map[string]any{"x": "y"}}).Err())
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}

	code, out, _ := runCLI(t, env, "idempotency", "format")
	require.Equal(t, 0, code)
	require.Contains(t, out, "json", "P = 1 as configured: the stream held an entry, records are json")

	env["STREAM_PARTITIONS"] = "4"
	code, out, stderr := runCLI(t, env, "status")
	assert.NotEqual(t, 0, code, "status with STREAM_PARTITIONS=4 on a 1-partition stream must be refused as serve is; got:\n%s", firstLine(strings.TrimSpace(out)))
	code, out, stderr = runCLI(t, env, "idempotency", "format")
	assert.True(t, code != 0 || strings.Contains(out, "json"), "idempotency format with STREAM_PARTITIONS=4: exit %d, %q %s", code, strings.TrimSpace(out), stderr)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
