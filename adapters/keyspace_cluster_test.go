package adapters_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestKeySpaceNames: on a single server every key keeps its name; on a cluster the keys a
// script uses with the stream are in the stream's slot; a prefix with braces is refused there.
func TestKeySpaceNames(t *testing.T) {
	t.Parallel()
	one, err := adapters.NewKeySpace("checkins", false)
	require.NoError(t, err)
	assert.Equal(t, "checkins:events", one.Stream())
	assert.Equal(t, "checkins:events:poison", one.PoisonStream())
	assert.Equal(t, "checkins:projections", one.Projections())
	assert.Equal(t, "checkins:projections:progress", one.Progress())
	assert.Equal(t, "checkins:meta", one.Meta())
	assert.Equal(t, adapters.KeySpace{Prefix: "checkins"}, one, "the zero Cluster is today's layout")

	cl, err := adapters.NewKeySpace("checkins", true)
	require.NoError(t, err)
	assert.Equal(t, "checkins:events", cl.Stream(), "P = 1 is the same stream key")
	assert.Equal(t, "checkins:projections{checkins:events}", cl.Projections())
	assert.Equal(t, adapters.KeySlot(cl.Stream()), adapters.KeySlot(cl.Projections()))
	assert.Equal(t, "checkins:projections:progress", cl.Progress(), "used alone: no tag needed")

	_, err = adapters.NewKeySpace("a{b}", true)
	assert.ErrorContains(t, err, `key prefix "a{b}" contains a brace`)
	_, err = adapters.NewKeySpace("", true)
	assert.ErrorContains(t, err, "must not be empty")
}

// TestLiveGroupsAndRegistryOnACluster: joining a live group (one script over the registry and
// the stream), backfill and checkpoint updates, and a rebuild's registry steps work on a
// cluster; with the single server's key names the join is refused there (CROSSSLOT), which is
// what stopped `serve` on a cluster.
func TestLiveGroupsAndRegistryOnACluster(t *testing.T) {
	t.Parallel()
	env := redistest.OpenCluster(t)
	c := redistest.ClusterClient(t, env.URL)
	ctx := context.Background()

	flat := adapters.KeySpace{Prefix: env.Prefix}
	require.NotEqual(t, adapters.KeySlot(flat.Stream()), adapters.KeySlot(flat.Projections()), "the test needs the two in different slots")
	_, err := adapters.NewLiveGroups(c, flat).Join(ctx, "live", "users.v1")
	require.ErrorContains(t, err, "CROSSSLOT", "without the tag the join spans two slots")

	keys, err := adapters.NewKeySpace(env.Prefix, true)
	require.NoError(t, err)
	lg := adapters.NewLiveGroups(c, keys)
	m, err := lg.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	assert.Equal(t, "0-0", m.Members["users.v1"].Join, "a first start joins at the beginning")
	id, err := c.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: []any{"k", "v"}}).Result()
	require.NoError(t, err)
	m, err = lg.Join(ctx, "live", "locations.v1")
	require.NoError(t, err)
	assert.Equal(t, "0-0", m.Members["locations.v1"].Join, "nothing delivered yet: joins at the start too")

	// The live group delivers something; a later member joins at the last entry and backfills.
	_, err = c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c1", Streams: []string{keys.Stream(), ">"}, Count: 10, Block: -1}).Result()
	require.NoError(t, err)
	m, err = lg.Join(ctx, "live", "daily.v1")
	require.NoError(t, err)
	assert.Equal(t, id, m.Members["daily.v1"].Join)
	groups, err := c.XInfoGroups(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	assert.Len(t, groups, 2, "the live group and daily.v1's own group")
	changed, err := lg.FinishBackfill(ctx, "live", "daily.v1", time.Now())
	require.NoError(t, err)
	assert.True(t, changed)
	require.NoError(t, lg.Checkpoint(ctx, keys.Stream(), "live", id))
	acked, err := lg.Acked(ctx, keys.Stream(), "live")
	require.NoError(t, err)
	assert.Equal(t, id, acked)
	require.NoError(t, lg.Leave(ctx, "live", "daily.v1"))

	reg := adapters.NewProjectionVersions(c, keys)
	serving, building, started, err := reg.BeginBuild(ctx, "users", 1)
	require.NoError(t, err)
	assert.Equal(t, []any{1, 2, true}, []any{serving, building, started})
	ok, err := reg.Promote(ctx, "users", 1, 2, time.Now())
	require.NoError(t, err)
	assert.True(t, ok)
	require.NoError(t, reg.Retired(ctx, "users", 1))
	st, err := reg.State(ctx, "users")
	require.NoError(t, err)
	assert.Equal(t, 2, st.Serving)
	n, err := c.Exists(ctx, flat.Projections()).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing under the single server's registry name")
}

// TestProjectionKeysRemoveOnACluster: a version's keys spread over many slots of every master
// are all removed (one UNLINK of several slots is refused even within one node).
func TestProjectionKeysRemoveOnACluster(t *testing.T) {
	t.Parallel()
	env := redistest.OpenCluster(t)
	c := redistest.ClusterClient(t, env.URL)
	ctx := context.Background()
	keys, err := adapters.NewKeySpace(env.Prefix, true)
	require.NoError(t, err)
	for i := range 1200 {
		require.NoError(t, c.Set(ctx, keys.ProjectionKey("users", 1, fmt.Sprintf("user:%d", i), "stats"), "x", 0).Err())
	}
	keep := keys.ProjectionKey("users", 10, "user:1", "stats")
	require.NoError(t, c.Set(ctx, keep, "x", 0).Err())
	n, err := adapters.NewProjectionKeys(c, keys).RemoveVersion(ctx, "users", 1)
	require.NoError(t, err)
	assert.Equal(t, int64(1200), n)
	assert.Equal(t, int64(1), c.Exists(ctx, keep).Val())
	for i := range 1200 {
		require.Zero(t, c.Exists(ctx, keys.ProjectionKey("users", 1, fmt.Sprintf("user:%d", i), "stats")).Val())
	}
}
