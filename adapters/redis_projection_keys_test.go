package adapters_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// RemoveVersion unlinks exactly one projection version's keys, in batches, and nothing that
// merely starts alike (v1 is not v10, users is not users_x, a prefix with glob characters is
// matched literally); markers and legacy dedupe sets go by their own calls.
func TestProjectionKeysRemoveExactlyWhatTheyName(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	c := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix + "[*]"}
	ctx := context.Background()
	set := func(k string) { require.NoError(t, c.Set(ctx, k, "x", 0).Err()) }
	for i := range 1200 { // more than one SCAN page and one UNLINK batch
		set(keys.ProjectionKey("users", 1, fmt.Sprintf("user:%d", i), "stats"))
	}
	keep := []string{
		keys.ProjectionKey("users", 10, "user:1", "stats"),
		keys.ProjectionKey("users_x", 1, "user:1", "stats"),
		adapters.KeySpace{Prefix: env.Prefix + "x"}.ProjectionKey("users", 1, "user:1", "stats"),
		keys.Stream(),
	}
	for _, k := range keep {
		set(k)
	}
	pk := adapters.NewProjectionKeys(c, keys)
	n, err := pk.RemoveVersion(ctx, "users", 1)
	require.NoError(t, err)
	assert.Equal(t, int64(1200), n)
	for _, k := range keep {
		assert.Equal(t, int64(1), c.Exists(ctx, k).Val(), "%s must stay", k)
	}
	left, err := c.Keys(ctx, "*").Result()
	require.NoError(t, err)
	assert.Len(t, left, len(keep))

	set(keys.MarkerKey("users.v2", "user:1"))
	set(keys.MarkerKey("users.v20", "user:1"))
	n, err = pk.RemoveMarkers(ctx, "users.v2")
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	assert.Equal(t, int64(1), c.Exists(ctx, keys.MarkerKey("users.v20", "user:1")).Val())

	set(keys.ProjectionKey("users", 3, "user:1", "seen"))
	set(keys.ProjectionKey("users", 3, "user:1", "stats"))
	n, err = pk.RemoveLegacyDedupe(ctx, "users", 3)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "only the earlier layout's dedupe sets")
	assert.Equal(t, int64(1), c.Exists(ctx, keys.ProjectionKey("users", 3, "user:1", "stats")).Val())
}

// The stream's groups as the ops use cases change them: creating one twice is fine, destroying
// one that is not there (or on a stream that is not there) is fine, and a lag Redis cannot tell
// is counted.
func TestStreamAdminGroups(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	c := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	s := adapters.NewStreamAdmin(c, keys)
	ctx := context.Background()
	require.NoError(t, s.DestroyGroup(ctx, "users.v1"), "no stream yet")
	require.NoError(t, s.CreateGroup(ctx, "users.v1", "0"))
	require.NoError(t, s.CreateGroup(ctx, "users.v1", "0"), "BUSYGROUP is not an error")
	var ids []string
	for i := range 5 {
		id, err := c.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: []any{"n", i}}).Result()
		require.NoError(t, err)
		ids = append(ids, id)
	}
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.NotNil(t, info.Group("users.v1"))
	assert.Equal(t, int64(5), info.Length)
	n, err := s.CountAfter(ctx, ids[1], 100)
	require.NoError(t, err)
	assert.Equal(t, int64(3), n)
	n, err = s.CountAfter(ctx, "0-0", 2)
	require.NoError(t, err)
	assert.Equal(t, int64(2), n, "bounded by max")
	require.NoError(t, s.DestroyGroup(ctx, "users.v1"))
	require.NoError(t, s.DestroyGroup(ctx, "users.v1"), "gone already")
	info, err = s.Info(ctx)
	require.NoError(t, err)
	assert.Nil(t, info.Group("users.v1"))
}
