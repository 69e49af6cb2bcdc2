package adapters_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
)

// TestDisbandAfterAnUpgradeStillRemovesTheEarlierLayout: users.v1 was upgraded from the earlier
// layout (its membership carries Legacy: the earlier layout's {<slot>}:seen sets, of every
// checkinId ever applied, are removed with its finished backfill's group). That removal was cut
// short after the group went, and the live group is then disbanded: the moved record carries
// Legacy to the next join, so the sets are still removed once that backfill is done (the
// membership that said so is gone with the disbanded group).
func TestDisbandAfterAnUpgradeStillRemovesTheEarlierLayout(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	var last string
	for range 5 {
		id, err := c.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: []any{"k", "v"}}).Result()
		require.NoError(t, err)
		last = id
	}
	// The earlier layout: users.v1's own group stood at the last entry; its seen set.
	require.NoError(t, c.XGroupCreate(ctx, keys.Stream(), "users.v1", last).Err())
	seen := keys.ProjectionPrefix("users", 1) + "{user:7}:seen"
	require.NoError(t, c.SAdd(ctx, seen, "c1").Err())

	l := adapters.NewLiveGroups(c, keys)
	ms, err := l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	require.NotEmpty(t, ms.Members["users.v1"].Legacy, "an upgrade")
	_, err = l.FinishBackfill(ctx, "live", "users.v1", time.Now())
	require.NoError(t, err)
	// The removal of the finished backfill was cut short after its group went (a crash): the
	// seen set is left, and only the membership's Legacy says so.
	require.NoError(t, c.XGroupDestroy(ctx, keys.Stream(), "users.v1").Err())

	b := adapters.NewOpsBackend(c, keys)
	d, err := command.NewDisbandLiveGroup(b, command.DefaultClaimIdle)
	require.NoError(t, err)
	_, err = d.Run(ctx, "live", false)
	require.NoError(t, err)

	ms, err = l.Join(ctx, "live:users", "users.v1")
	require.NoError(t, err)
	assert.NotEmpty(t, ms.Members["users.v1"].Legacy, "the earlier layout goes along with the moved version")
	_, err = l.FinishBackfill(ctx, "live:users", "users.v1", time.Now().Add(-time.Hour))
	require.NoError(t, err)
	rb := removalRun(t, b, time.Second)
	require.NoError(t, rb.RemoveFinishedBackfills(ctx))

	gs, err := c.XInfoGroups(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	for _, g := range gs {
		assert.NotEqual(t, "users.v1", g.Name, "the finished backfill's group is removed")
	}
	assert.Zero(t, c.Exists(ctx, seen).Val(), "the earlier layout's seen set of users.v1 is never removed")
}
