package adapters_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
)

// TestRegistryRecordsLayouts: the first layout decided for a serving version stays; a rebuild
// records its layout with the build and the switch makes it the serving one's; a rebuild in
// layout 1 records nothing, so a projection without layouts leaves the registry as before.
func TestRegistryRecordsLayouts(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	reg := adapters.NewProjectionVersions(env.client, env.keys)

	st, err := reg.State(ctx, "boards")
	require.NoError(t, err)
	assert.Zero(t, st.ServingLayout, "nothing recorded")
	assert.Equal(t, 1, st.LayoutOf(1), "which is layout 1")

	got, err := reg.DecideLayout(ctx, "boards", 2)
	require.NoError(t, err)
	assert.Equal(t, 2, got)
	got, err = reg.DecideLayout(ctx, "boards", 1)
	require.NoError(t, err)
	assert.Equal(t, 2, got, "the first decision stands")
	_, err = reg.DecideLayout(ctx, "boards", 0)
	require.ErrorContains(t, err, "layout 0 is not a positive integer")

	_, building, started, err := reg.BeginBuild(ctx, "boards", 3)
	require.NoError(t, err)
	require.True(t, started)
	st, err = reg.State(ctx, "boards")
	require.NoError(t, err)
	assert.Equal(t, [2]int{2, 3}, [2]int{st.ServingLayout, st.BuildingLayout})
	assert.Equal(t, 3, st.LayoutOf(building))
	switched, err := reg.Promote(ctx, "boards", 1, building, time.Now())
	require.NoError(t, err)
	require.True(t, switched)
	st, err = reg.State(ctx, "boards")
	require.NoError(t, err)
	assert.Equal(t, [3]int{2, 3, 0}, [3]int{st.Serving, st.ServingLayout, st.BuildingLayout})
	require.NoError(t, reg.Retired(ctx, "boards", 1))

	_, building, started, err = reg.BeginBuild(ctx, "boards", 1)
	require.NoError(t, err)
	require.True(t, started)
	fields, err := env.client.HKeys(ctx, env.keys.Projections()).Result()
	require.NoError(t, err)
	assert.NotContains(t, fields, "boards.building_layout", "layout 1 is not recorded")
	switched, err = reg.Promote(ctx, "boards", 2, building, time.Now())
	require.NoError(t, err)
	require.True(t, switched)
	st, err = reg.State(ctx, "boards")
	require.NoError(t, err)
	assert.Equal(t, 1, st.LayoutOf(st.Serving), "a switch to a version of layout 1 serves layout 1")

	_, _, _, err = reg.BeginBuild(ctx, "other", 0)
	require.ErrorContains(t, err, "layout 0 is not a positive integer")
}

// TestRebuildStartLock: one holder at a time; a live holder keeps the lock past its TTL until it
// lets go, and only its own release deletes it.
func TestRebuildStartLock(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	client, keys := env.client, env.keys
	v := adapters.NewProjectionVersions(client, keys)
	ctx := context.Background()
	release, ok, err := v.LockStart(ctx, "users", 300*time.Millisecond)
	require.NoError(t, err)
	require.True(t, ok)
	time.Sleep(time.Second) // three TTLs: extended meanwhile
	_, ok, err = v.LockStart(ctx, "users", 300*time.Millisecond)
	require.NoError(t, err)
	assert.False(t, ok, "held while its holder lives")
	other, ok, err := v.LockStart(ctx, "locations", 300*time.Millisecond)
	require.NoError(t, err)
	assert.True(t, ok, "per projection")
	require.NoError(t, other(ctx))
	require.NoError(t, release(ctx))
	again, ok, err := v.LockStart(ctx, "users", 300*time.Millisecond)
	require.NoError(t, err)
	assert.True(t, ok, "free once released")
	require.NoError(t, release(ctx), "a stale release does not delete another's lock")
	n, err := client.Exists(ctx, keys.RebuildStartLock("users")).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	require.NoError(t, again(ctx))
}
